// Run: VA_AGENT_BIN=<build>/src/cli/vfio-gpu-agent bench_dra --benchmark_repetitions=5
//        --benchmark_report_aggregates_only=true
// Figures (issue 22), on a plain-directory node of eight H200s already on vfio-pci (groups 10..17), the kubelet
// DRA simulator calling the driver over its unix socket as the kubelet does:
//   BM_Prepare8/api:0   NodePrepareResources of one claim of 8 GPUs, the claim read from memory: the agent's own
//                       cost (checks, CDI spec, 8 metadata files, checkpoint) plus the RPC
//   BM_Prepare8/api:1   the same with the claim's GET from the fake API server, as in production
//   BM_ClaimGet         that GET alone (the fake server is Python: its share is the upper end of a real one's)
//   BM_SlicesAfterStart Driver::Start -> the node's ResourceSlice with 8 devices stored by the API server
//   BM_BindingReady/gpus:1|8  --binding-conditions: a claim allocated in the fake API server (the scheduler's
//                       status write, with the router's label) -> its binding condition True (the agent's status
//                       apply answered): the watch event, the pre-bind (checkpoint twice, GPUs already on vfio-pci
//                       so no sysfs write: the bind itself is bench_binding's) and the apply
//   BM_AgentAnonGrowthPer10000Cycles  the agent's anonymous memory over 10,000 prepare/unprepare cycles (1, 2 and
//                       8 GPUs), twice
//   BM_IdleCpu/run:0|1  the CPU of an idle `serve|run --kubelet-api dra` over 20 s, registered, its health stream
//                       open, slices published to the fake API server
#include <benchmark/benchmark.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>

#include <condition_variable>
#include <fstream>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "agent_process.h"
#include "kube_api_sim.h"
#include "kubelet_dra_sim.h"
#include "rss.h"
#include "spdlog/spdlog.h"
#include "support/ports.h"
#include "support/sysfs_tree.h"
#include "vfio_gpu_agent/dra/device_names.h"
#include "vfio_gpu_agent/dra/driver.h"
#include "vfio_gpu_agent/kube/resource_claim_reader.h"
#include "vfio_gpu_agent/kube/resource_claims.h"
#include "vfio_gpu_agent/kube/resource_slices.h"

namespace vfio_agent::dra {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;
using kubeletsim::dra::KubeletDraSim;
using kubeletsim::dra::MakeClaim;

constexpr char kDriver[] = "gpu.vfio-agent.cozystack.io";
constexpr char kNodeName[] = "node-a";
const std::vector<std::string> kGpus = {"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0",
                                        "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0"};

// The node's files: sysfs, /dev/vfio, the boot ID, and the kubelet's and CDI's directories.
class Node {
 public:
  Node() {
    testing::SysfsTree tree(dir_.path() / "sys");
    std::filesystem::create_directories(dir_.path() / "dev/vfio");
    for (size_t i = 0; i < kGpus.size(); ++i) {
      const int group = 10 + static_cast<int>(i);
      tree.AddDevice({.bdf = kGpus[i], .driver = "vfio-pci", .iommu_group = group});
      std::ofstream(dir_.path() / "dev/vfio" / std::to_string(group));
    }
    std::filesystem::create_directories(dir_.path() / "proc/sys/kernel/random");
    std::ofstream(dir_.path() / "proc/sys/kernel/random/boot_id") << "boot-1\n";
  }

  const std::filesystem::path& dir() const { return dir_.path(); }

  DriverOptions Options() const {
    DriverOptions options;
    options.registry_dir = dir() / "plugins_registry";
    options.plugins_dir = dir() / "plugins";
    options.cdi_dir = dir() / "cdi";
    options.paths.sysfs_root = dir() / "sys";
    options.paths.dev_root = dir() / "dev";
    options.paths.proc_root = dir() / "proc";
    options.node_name = kNodeName;
    return options;
  }

 private:
  testing::TempDir dir_{"va-bench-dra"};
};

// A claim as the scheduler leaves it: `count` single-device requests on the GPUs from `first`.
kube::ResourceClaim AllocatedClaim(const std::string& name, const std::string& uid, size_t first, size_t count) {
  kube::ResourceClaim claim;
  claim.namespace_name = "vms";
  claim.name = name;
  claim.uid = uid;
  claim.allocated = true;
  for (size_t i = 0; i < count; ++i) {
    claim.results.push_back(
        {.request = absl::StrCat("gpu", i), .driver = kDriver, .pool = kNodeName, .device = DeviceName(kGpus[first + i])});
  }
  return claim;
}

Json ClaimJson(const kube::ResourceClaim& claim) {
  Json results = Json::array();
  for (const kube::AllocationResult& r : claim.results) {
    results.push_back({{"request", r.request}, {"driver", r.driver}, {"pool", r.pool}, {"device", r.device}});
  }
  return {{"metadata", {{"namespace", claim.namespace_name}, {"name", claim.name}, {"uid", claim.uid}}},
          {"spec", {{"devices", {{"requests", Json::array()}}}}},
          {"status", {{"allocation", {{"devices", {{"results", results}}}}}}}};
}

// The fake API server, with a claim reader and a slice publisher for the node.
struct Api {
  static std::unique_ptr<Api> StartOrSkip(const Node& node, benchmark::State& state) {
    if (!sim::KubeApiSim::Available()) {
      state.SkipWithError("python3 not found");
      return nullptr;
    }
    auto api = std::make_unique<Api>();
    auto server = sim::KubeApiSim::Start(node.dir());
    if (!server.ok()) {
      state.SkipWithError(server.status().ToString().c_str());
      return nullptr;
    }
    api->server = *std::move(server);
    auto kubeconfig = api->server->WriteKubeconfig(node.dir() / "kubeconfig");
    if (!kubeconfig.ok()) {
      state.SkipWithError(kubeconfig.status().ToString().c_str());
      return nullptr;
    }
    api->kubeconfig = *kubeconfig;
    auto reader = kube::ConnectResourceClaimReader({.kubeconfig = api->kubeconfig});
    auto publisher = kube::ConnectResourceSlicePublisher(api->kubeconfig, "", {.driver = kDriver, .node_name = kNodeName});
    if (!reader.ok() || !publisher.ok()) {
      state.SkipWithError("API client");
      return nullptr;
    }
    api->reader = *std::move(reader);
    api->publisher = *std::move(publisher);
    return api;
  }

  std::unique_ptr<sim::KubeApiSim> server;
  std::filesystem::path kubeconfig;
  std::unique_ptr<kube::ResourceClaimReader> reader;
  std::unique_ptr<kube::ResourceSlicePublisher> publisher;
};

// The driver serving, registered with the kubelet simulator; null after marking the benchmark skipped.
struct Served {
  static std::unique_ptr<Served> StartOrSkip(const Node& node, DriverOptions options, benchmark::State& state) {
    auto served = std::make_unique<Served>(std::move(options));
    served->kubelet = std::make_unique<KubeletDraSim>(kubeletsim::dra::Options{.registry_dir = node.Options().registry_dir});
    if (!served->driver.Start().ok() || !served->kubelet->Start().ok() ||
        !served->kubelet->WaitFor([](const KubeletDraSim& k) { return k.Plugins().contains(kDriver); }, 30s)) {
      state.SkipWithError("the driver did not start or register");
      return nullptr;
    }
    return served;
  }
  explicit Served(DriverOptions options) : driver(std::move(options)) {}

  Driver driver;
  std::unique_ptr<KubeletDraSim> kubelet;
};

double ProcessCpuUs() {
  timespec now{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) * 1e6 + static_cast<double>(now.tv_nsec) / 1e3;
}

bool PreparedAll(const absl::StatusOr<kubeletsim::dra::drav1::NodePrepareResourcesResponse>& response,
                 const std::string& uid, size_t devices) {
  if (!response.ok() || !response->claims().contains(uid)) return false;
  const auto& claim = response->claims().at(uid);
  return claim.error().empty() && claim.devices_size() == static_cast<int>(devices);
}

void BM_Prepare8(benchmark::State& state) {
  const bool from_api = state.range(0) == 1;
  Node node;
  DriverOptions options = node.Options();
  std::unique_ptr<Api> api;
  kube::ResourceClaim current;
  if (from_api) {
    if (!(api = Api::StartOrSkip(node, state))) return;
    options.get_claim = [&](const std::string& ns, const std::string& name) { return api->reader->Get(ns, name, 20s); };
  } else {
    options.get_claim = [&](const std::string&, const std::string&) { return current; };
  }
  std::unique_ptr<Served> served = Served::StartOrSkip(node, std::move(options), state);
  if (!served) return;
  KubeletDraSim& kubelet = *served->kubelet;
  int n = 0;
  double process_cpu_us = 0;
  for (auto _ : state) {
    state.PauseTiming();
    current = AllocatedClaim(absl::StrCat("vm-", n), absl::StrCat("uid-", n), 0, kGpus.size());
    ++n;
    if (api && !api->server->Control("claim " + ClaimJson(current).dump()).ok()) {
      state.SkipWithError("storing the claim");
      break;
    }
    const std::vector<kubeletsim::dra::drav1::Claim> claims = {MakeClaim("vms", current.name, current.uid)};
    state.ResumeTiming();
    const double cpu_before = ProcessCpuUs();
    auto response = kubelet.Prepare(kDriver, claims);
    process_cpu_us += ProcessCpuUs() - cpu_before;
    state.PauseTiming();
    if (!PreparedAll(response, current.uid, kGpus.size()) || !kubelet.Unprepare(kDriver, claims).ok()) {
      state.SkipWithError("prepare or unprepare failed");
      break;
    }
    state.ResumeTiming();
  }
  // Every thread of this process: the driver's handler and gRPC's on both sides, the simulated kubelet's call
  // (and with api:1, the reader's HTTP; the fake server is another process). Independent of the machine's load.
  state.counters["process_cpu_us"] = benchmark::Counter(process_cpu_us, benchmark::Counter::kAvgIterations);
}
BENCHMARK(BM_Prepare8)->ArgName("api")->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMicrosecond);

void BM_ClaimGet(benchmark::State& state) {
  Node node;
  std::unique_ptr<Api> api = Api::StartOrSkip(node, state);
  if (!api) return;
  const kube::ResourceClaim claim = AllocatedClaim("vm", "uid-1", 0, kGpus.size());
  if (!api->server->Control("claim " + ClaimJson(claim).dump()).ok()) {
    state.SkipWithError("storing the claim");
    return;
  }
  for (auto _ : state) {
    auto got = api->reader->Get("vms", "vm", 20s);
    if (!got.ok() || got->results.size() != kGpus.size()) {
      state.SkipWithError("GET failed");
      break;
    }
  }
}
BENCHMARK(BM_ClaimGet)->UseRealTime()->Unit(benchmark::kMicrosecond);

// Manual time: from Start() to the publication that stored 8 devices (the publisher's answer, read by the
// API server first). The slices are deleted between iterations, outside the time.
void BM_SlicesAfterStart(benchmark::State& state) {
  Node node;
  std::unique_ptr<Api> api = Api::StartOrSkip(node, state);
  if (!api) return;
  for (auto _ : state) {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<Clock::time_point> published;
    DriverOptions options = node.Options();
    options.publish_slices = [&](std::vector<kube::SliceDevice> devices) {
      const size_t count = devices.size();
      auto result = api->publisher->Publish(std::move(devices));
      if (result.ok() && count == kGpus.size()) {
        std::lock_guard lock(mu);
        if (!published) published = Clock::now();
        cv.notify_all();
      }
      return result;
    };
    Driver driver(options);
    const Clock::time_point start = Clock::now();
    if (!driver.Start().ok()) {
      state.SkipWithError("driver start");
      break;
    }
    std::unique_lock lock(mu);
    if (!cv.wait_for(lock, 30s, [&] { return published.has_value(); })) {
      state.SkipWithError("no slice within 30 s");
      break;
    }
    state.SetIterationTime(std::chrono::duration<double>(*published - start).count());
    lock.unlock();
    driver.Stop();
    if (!api->publisher->DeleteAll().ok()) {
      state.SkipWithError("deleting the slices");
      break;
    }
  }
}
BENCHMARK(BM_SlicesAfterStart)->UseManualTime()->Iterations(20)->Unit(benchmark::kMillisecond);

// Manual time: from the `allocate` command sent to the fake API server to the agent's on_binding (told once its
// status.devices apply was answered). The claim is deallocated between iterations and its pre-bind undone,
// outside the time. process_cpu_us: this process's CPU in the timed window (the agent's threads; the Python server
// is another process).
void BM_BindingReady(benchmark::State& state) {
  const size_t gpus = static_cast<size_t>(state.range(0));
  Node node;
  std::unique_ptr<Api> api = Api::StartOrSkip(node, state);
  if (!api) return;
  auto claims = kube::ConnectResourceClaimClient(api->kubeconfig, "", {.node_name = kNodeName, .driver = kDriver});
  if (!claims.ok()) {
    state.SkipWithError("claim client");
    return;
  }
  std::mutex mu;
  std::condition_variable cv;
  int outcomes = 0;
  DriverOptions options = node.Options();
  options.bind_on_prepare = true;
  options.binding_conditions = true;
  options.get_claim = [&](const std::string& ns, const std::string& name) { return api->reader->Get(ns, name, 20s); };
  options.publish_slices = [&](std::vector<kube::SliceDevice> devices) { return api->publisher->Publish(std::move(devices)); };
  options.watch_claims = [&](kube::ResourceClaimWatch::Handlers handlers) { return (*claims)->Watch(std::move(handlers)); };
  options.write_claim_status = [&](const kube::ResourceClaim& claim, const std::vector<kube::DeviceStatus>& devices) {
    return (*claims)->ApplyDeviceStatus(claim, devices);
  };
  options.on_binding = [&](const BindingOutcome&) {
    std::lock_guard lock(mu);
    ++outcomes;
    cv.notify_all();
  };
  Driver driver(options);
  if (!driver.Start().ok()) {
    state.SkipWithError("driver start");
    return;
  }
  // The scheduler allocates from slices that carry the conditions.
  const auto published = Clock::now() + 30s;
  while (Clock::now() < published && driver.SliceWrites() == 0) std::this_thread::sleep_for(10ms);
  int n = 0;
  double process_cpu_us = 0;
  for (auto _ : state) {
    const std::string name = absl::StrCat("vm-", n), uid = absl::StrCat("uid-", n);
    ++n;
    const kube::ResourceClaim claim = AllocatedClaim(name, uid, 0, gpus);
    Json unallocated = ClaimJson(claim);
    unallocated.erase("status");
    Json results = ClaimJson(claim)["status"]["allocation"]["devices"]["results"];
    if (!api->server->Control("claim " + unallocated.dump()).ok()) {
      state.SkipWithError("storing the claim");
      break;
    }
    const int before = outcomes;
    const Clock::time_point start = Clock::now();
    const double cpu_before = ProcessCpuUs();
    if (!api->server->Control(absl::StrCat("allocate vms ", name, " ", kNodeName, " [] ", results.dump())).ok()) {
      state.SkipWithError("allocate");
      break;
    }
    std::unique_lock lock(mu);
    if (!cv.wait_for(lock, 30s, [&] { return outcomes > before; })) {
      state.SkipWithError("no condition within 30 s");
      break;
    }
    state.SetIterationTime(std::chrono::duration<double>(Clock::now() - start).count());
    process_cpu_us += ProcessCpuUs() - cpu_before;
    lock.unlock();
    // Undone before the next claim takes the same GPUs.
    if (!api->server->Control(absl::StrCat("delete-claim vms ", name)).ok()) {
      state.SkipWithError("delete");
      break;
    }
    const std::filesystem::path record = node.dir() / "plugins" / kDriver / "claims" / (uid + ".json");
    const auto undone = Clock::now() + 30s;
    while (Clock::now() < undone && std::filesystem::exists(record)) std::this_thread::sleep_for(1ms);
  }
  state.counters["process_cpu_us"] = benchmark::Counter(process_cpu_us, benchmark::Counter::kAvgIterations);
}
BENCHMARK(BM_BindingReady)->ArgName("gpus")->Arg(1)->Arg(8)->UseManualTime()->Iterations(20)->Unit(benchmark::kMillisecond);

// The agent binary as deployed (production defaults), `serve` or `run` with --kubelet-api dra against the fake API
// server, on the node; stopped with SIGTERM by its destructor.
class AgentProcess {
 public:
  AgentProcess(const char* binary, const Node& node, const Api& api, bool run) {
    const DriverOptions paths = node.Options();
    const std::string sysfs = paths.paths.sysfs_root.string(), dev = paths.paths.dev_root.string(),
                      proc = paths.paths.proc_root.string(), registry = paths.registry_dir.string(),
                      plugins = paths.plugins_dir.string(), cdi = paths.cdi_dir.string(),
                      kubeconfig = api.kubeconfig.string(), kubelet_dir = (node.dir() / "device-plugins").string(),
                      health_port = std::to_string(testing::UnusedLoopbackPort()),
                      metrics_port = std::to_string(testing::UnusedLoopbackPort());
    std::vector<const char*> argv = {binary, run ? "run" : "serve", "--kubelet-api", "dra", "--sysfs-root",
                                     sysfs.c_str(), "--dev-root", dev.c_str(), "--proc-root", proc.c_str(),
                                     "--kubelet-registry-dir", registry.c_str(), "--kubelet-plugins-dir",
                                     plugins.c_str(), "--cdi-dir", cdi.c_str(), "--kubeconfig", kubeconfig.c_str(),
                                     "--node-name", kNodeName, "--log-level", "warn"};
    if (run) {
      argv.insert(argv.end(), {"--kubelet-dir", kubelet_dir.c_str(), "--listen-address", "127.0.0.1",
                               "--health-port", health_port.c_str(), "--metrics-port", metrics_port.c_str()});
    }
    argv.push_back(nullptr);
    std::vector<char*> env = bench::AgentEnvironment();
    if (::posix_spawn(&pid_, binary, nullptr, nullptr, const_cast<char* const*>(argv.data()), env.data()) != 0) {
      pid_ = -1;
    }
  }
  ~AgentProcess() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    int wstatus = 0;
    ::waitpid(pid_, &wstatus, 0);
  }
  AgentProcess(const AgentProcess&) = delete;
  AgentProcess& operator=(const AgentProcess&) = delete;
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
};

// The agent up as a cluster would see it: registered, streaming health to the kubelet, its 8 devices in the
// node's slices.
bool AgentReady(const KubeletDraSim& kubelet, Api& api) {
  auto slice_devices = [&] {
    auto slices = api.server->Slices();
    size_t devices = 0;
    if (slices.ok() && slices->is_array()) {
      for (const Json& slice : *slices) devices += slice["spec"].value("devices", Json::array()).size();
    }
    return devices;
  };
  return kubelet.WaitFor([](const KubeletDraSim& k) { return k.LatestHealth(kDriver).has_value(); }, 30s) &&
         sim::KubeApiSim::WaitFor([&] { return slice_devices() == kGpus.size(); }, 30s);
}

// Anonymous memory of the agent process over twice 10,000 prepare/unprepare cycles after 1,000 to warm up: claims
// of 1, 2 and 8 GPUs in turn, each read from the fake API server as in production.
void BM_AgentAnonGrowthPer10000Cycles(benchmark::State& state) {
  const char* binary = bench::AgentBinaryOrSkip(state);
  if (binary == nullptr) return;
  Node node;
  std::unique_ptr<Api> api = Api::StartOrSkip(node, state);
  if (!api) return;
  KubeletDraSim kubelet({.registry_dir = node.Options().registry_dir});
  AgentProcess agent(binary, node, *api, /*run=*/false);
  if (!kubelet.Start().ok() || agent.pid() <= 0 || !AgentReady(kubelet, *api)) {
    state.SkipWithError("the agent did not start, register or publish");
    return;
  }
  int n = 0;
  auto cycle = [&] {
    static constexpr size_t kSizes[] = {1, 2, 8};
    const size_t size = kSizes[n % 3];
    const kube::ResourceClaim claim =
        AllocatedClaim("vm", absl::StrCat("uid-", n), size == 8 ? 0 : static_cast<size_t>(n % 3), size);
    ++n;
    const std::vector<kubeletsim::dra::drav1::Claim> claims = {MakeClaim("vms", "vm", claim.uid)};
    return api->server->Control("claim " + ClaimJson(claim).dump()).ok() &&
           PreparedAll(kubelet.Prepare(kDriver, claims), claim.uid, size) && kubelet.Unprepare(kDriver, claims).ok();
  };
  const std::string pid = std::to_string(agent.pid());
  // Two windows of 10,000: growth that stops after the first is the allocator reaching its working set (an arena
  // per gRPC thread), growth that goes on is a leak.
  int64_t first = 0, second = 0, rss = 0;
  for (auto _ : state) {
    bool ok = true;
    for (int i = 0; i < 1000 && ok; ++i) ok = cycle();
    const int64_t start = bench::RssAnonKb(pid);
    for (int i = 0; i < 10000 && ok; ++i) ok = cycle();
    const int64_t middle = bench::RssAnonKb(pid);
    for (int i = 0; i < 10000 && ok; ++i) ok = cycle();
    rss = bench::RssAnonKb(pid);
    first = middle - start;
    second = rss - middle;
    if (!ok) {
      state.SkipWithError("a cycle failed");
      break;
    }
  }
  state.counters["growth_first_kB"] = static_cast<double>(first);
  state.counters["growth_second_kB"] = static_cast<double>(second);
  state.counters["rss_anon_kB"] = static_cast<double>(rss);
}
BENCHMARK(BM_AgentAnonGrowthPer10000Cycles)->Iterations(1)->Unit(benchmark::kMillisecond);

// The idle agent: registered, the kubelet's health stream open, its slices published (the resync lists them every
// 30 s). run:1 adds the daemon around the driver (readiness, metrics, node condition). Exited threads are not
// counted, so the thread count is reported too.
void BM_IdleCpu(benchmark::State& state) {
  const char* binary = bench::AgentBinaryOrSkip(state);
  if (binary == nullptr) return;
  const int seconds = bench::IdleSeconds();
  Node node;
  std::unique_ptr<Api> api = Api::StartOrSkip(node, state);
  if (!api) return;
  KubeletDraSim kubelet({.registry_dir = node.Options().registry_dir});
  if (!kubelet.Start().ok()) {
    state.SkipWithError("kubelet sim");
    return;
  }
  bench::IdleCpu idle;
  for (auto _ : state) {
    AgentProcess agent(binary, node, *api, state.range(0) == 1);
    const bool ready = agent.pid() > 0 && AgentReady(kubelet, *api);
    // Past the start: the re-lists of the first 5 s after registration are not idle.
    std::this_thread::sleep_for(6s);
    idle = bench::MeasureIdle(agent.pid(), std::chrono::seconds(seconds));
    if (!ready) {
      state.SkipWithError("the driver did not register, stream health or publish its slices");
      break;
    }
    state.SetIterationTime(idle.cpu_ms / 1000.0);
  }
  bench::SetIdleCounters(state, idle, seconds);
}
BENCHMARK(BM_IdleCpu)->ArgName("run")->Arg(0)->Arg(1)->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace vfio_agent::dra

int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::warn);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
