// Run: bench_plugin --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
// Figures (issue 4): the plugin's own time per Allocate over its unix socket (= Allocate round trip minus
// the round trip of the empty GetDevicePluginOptions call), anonymous memory growth over 1,000 Allocates,
// health event -> ListAndWatch update seen by the kubelet (lost and recovered), kubelet start -> Register.
#include <benchmark/benchmark.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <thread>

#include "grpcpp/client_context.h"
#include "plugin_harness.h"
#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/plugin/allocate.h"

namespace vfio_agent::plugin::testing {
namespace {

using Clock = std::chrono::steady_clock;

// One simulated node for the whole run (starting FUSE per benchmark would dominate); main() destroys it,
// which stops the agent, the kubelet simulator and sysfs-sim.
std::unique_ptr<Node> shared_node;

Node& SharedNode() {
  static Node* node = [] {
    spdlog::set_level(spdlog::level::warn);
    auto created = Node::Create("hgx-h200-8gpu.json");
    if (!created.ok()) {
      fprintf(stderr, "sysfs-sim: %s\n", created.status().ToString().c_str());
      std::abort();
    }
    shared_node = *std::move(created);
    Node* n = shared_node.get();
    if (!n->BindToVfio(kH200Gpus).ok() || !n->StartKubelet().ok() || !n->StartAgent().ok() ||
        !n->WaitForCounts(kH200, 8, 8)) {
      fprintf(stderr, "node setup failed\n");
      std::abort();
    }
    return n;
  }();
  return *node;
}

int64_t RssAnonKb() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("RssAnon:", 0) == 0) return std::stoll(line.substr(8));
  }
  return -1;
}

v1beta1::AllocateRequest OneGpuRequest() {
  v1beta1::AllocateRequest request;
  request.add_container_requests()->add_devices_ids("0000:3b:00.0");
  return request;
}

void BM_AllocateRoundTrip(benchmark::State& state) {
  auto stub = SharedNode().DialPlugin(kH200);
  const v1beta1::AllocateRequest request = OneGpuRequest();
  for (auto _ : state) {
    v1beta1::AllocateResponse response;
    grpc::ClientContext context;
    if (!stub->Allocate(&context, request, &response).ok()) state.SkipWithError("Allocate failed");
  }
}
BENCHMARK(BM_AllocateRoundTrip)->Unit(benchmark::kMicrosecond);

// The transport's share of the round trip: an RPC that does nothing.
void BM_EmptyRpcRoundTrip(benchmark::State& state) {
  auto stub = SharedNode().DialPlugin(kH200);
  for (auto _ : state) {
    v1beta1::DevicePluginOptions response;
    grpc::ClientContext context;
    if (!stub->GetDevicePluginOptions(&context, v1beta1::Empty(), &response).ok()) state.SkipWithError("failed");
  }
}
BENCHMARK(BM_EmptyRpcRoundTrip)->Unit(benchmark::kMicrosecond);

// The Allocate core alone (8 GPUs requested), no transport.
void BM_AllocateCore8(benchmark::State& state) {
  const ResourceDevices devices = SharedNode().agent().Snapshot().resources.at(kH200);
  for (auto _ : state) {
    auto allocation = AllocateContainer(devices, {}, kH200Gpus);
    benchmark::DoNotOptimize(allocation);
  }
}
BENCHMARK(BM_AllocateCore8)->Unit(benchmark::kMicrosecond);

// Anonymous RSS growth of the process (plugin and client) over 1,000 Allocates, after a warm-up round.
void BM_AnonGrowthPer1000Allocates(benchmark::State& state) {
  auto stub = SharedNode().DialPlugin(kH200);
  const v1beta1::AllocateRequest request = OneGpuRequest();
  auto run = [&] {
    for (int i = 0; i < 1000; ++i) {
      v1beta1::AllocateResponse response;
      grpc::ClientContext context;
      (void)stub->Allocate(&context, request, &response);
    }
  };
  run();
  int64_t growth = 0;
  for (auto _ : state) {
    const int64_t before = RssAnonKb();
    run();
    growth = RssAnonKb() - before;
  }
  state.counters["anon_growth_kB"] = static_cast<double>(growth);
  state.counters["rss_anon_kB"] = static_cast<double>(RssAnonKb());
}
BENCHMARK(BM_AnonGrowthPer1000Allocates)->Iterations(1)->Unit(benchmark::kMillisecond);

// From the sim's control write to the kubelet simulator receiving the changed list.
double HealthFlipMs(const std::string& command, int64_t want_allocatable) {
  Node& node = SharedNode();
  const Clock::time_point start = Clock::now();
  if (!node.Control(command).ok()) return -1;
  node.WaitForCounts(kH200, 8, want_allocatable, std::chrono::seconds(5));
  for (const kubeletsim::Event& e : node.kubelet().Events()) {
    if (e.kind == "list" && e.resource == kH200 && e.at >= start &&
        e.detail.find("healthy=" + std::to_string(want_allocatable) + " ") != std::string::npos) {
      return std::chrono::duration<double, std::milli>(e.at - start).count();
    }
  }
  return -1;
}

void BM_HealthLostToUpdate(benchmark::State& state) {
  for (auto _ : state) {
    const double ms = HealthFlipMs("set-driver 0000:9a:00.0 none", 7);
    state.SetIterationTime(ms / 1000.0);
    HealthFlipMs("set-driver 0000:9a:00.0 vfio-pci", 8);
  }
}
BENCHMARK(BM_HealthLostToUpdate)->UseManualTime()->Iterations(20)->Unit(benchmark::kMillisecond);

void BM_HealthRecoveredToUpdate(benchmark::State& state) {
  for (auto _ : state) {
    HealthFlipMs("set-driver 0000:9a:00.0 none", 7);
    const double ms = HealthFlipMs("set-driver 0000:9a:00.0 vfio-pci", 8);
    state.SetIterationTime(ms / 1000.0);
  }
}
BENCHMARK(BM_HealthRecoveredToUpdate)->UseManualTime()->Iterations(20)->Unit(benchmark::kMillisecond);

// Kubelet restart: kubelet.sock listening -> Register received by the kubelet simulator.
void BM_KubeletRestartToRegister(benchmark::State& state) {
  Node& node = SharedNode();
  for (auto _ : state) {
    if (!node.kubelet().Restart().ok() || !node.WaitForCounts(kH200, 8, 8)) state.SkipWithError("restart failed");
    state.SetIterationTime(RegisterDelay(node.kubelet(), kH200).count() / 1000.0);
  }
}
BENCHMARK(BM_KubeletRestartToRegister)->UseManualTime()->Iterations(20)->Unit(benchmark::kMillisecond);

// The CLI binary (`vfio-gpu-agent serve`), when VA_AGENT_BIN names it: process start -> Register received by
// a kubelet simulator that is already listening, and the RSS of the process once registered.
void BM_ProcessStartToRegister(benchmark::State& state) {
  const char* binary = std::getenv("VA_AGENT_BIN");
  if (binary == nullptr || !std::filesystem::exists(binary)) {
    state.SkipWithError("set VA_AGENT_BIN=<build>/src/cli/vfio-gpu-agent");
    for (auto _ : state) {
    }
    return;
  }
  Node& node = SharedNode();
  vfio_agent::testing::TempDir dir("va-bench-cli");
  kubeletsim::KubeletSim kubelet({.dir = dir.path()});
  if (!kubelet.Start().ok()) state.SkipWithError("kubelet sim");
  double rss_kb = 0;
  for (auto _ : state) {
    const size_t events_before = kubelet.Events().size();
    const std::string sysfs = node.options.paths.sysfs_root.string(), dev = node.options.paths.dev_root.string(),
                      kdir = dir.path().string();
    const char* argv[] = {binary, "serve", "--sysfs-root", sysfs.c_str(), "--dev-root", dev.c_str(),
                          "--kubelet-dir", kdir.c_str(), nullptr};
    // posix_spawn (vfork + exec), as a container runtime starts the agent: a fork() of this process, with
    // its simulators' threads and memory, would add the copy of its page tables to the figure.
    const Clock::time_point start = Clock::now();
    pid_t pid = 0;
    if (::posix_spawn(&pid, binary, nullptr, nullptr, const_cast<char* const*>(argv), environ) != 0) {
      state.SkipWithError("posix_spawn of the agent failed");
      break;
    }
    kubelet.WaitFor(
        [&](const kubeletsim::KubeletSim& k) {
          auto resources = k.Resources();
          auto it = resources.find(kH200);
          return it != resources.end() && it->second.registered && it->second.allocatable == 8;
        },
        std::chrono::seconds(10));
    double ms = -1;
    auto events = kubelet.Events();
    for (size_t i = events_before; i < events.size(); ++i) {
      if (events[i].kind == "register" && events[i].resource == kH200) {
        ms = std::chrono::duration<double, std::milli>(events[i].at - start).count();
        break;
      }
    }
    std::ifstream status("/proc/" + std::to_string(pid) + "/status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("VmRSS:", 0) == 0) rss_kb = std::stod(line.substr(6));
    }
    ::kill(pid, SIGTERM);
    int wstatus = 0;
    ::waitpid(pid, &wstatus, 0);
    if (ms < 0) state.SkipWithError("no Register from the CLI");
    state.SetIterationTime(ms / 1000.0);
  }
  state.counters["rss_registered_kB"] = rss_kb;
}
BENCHMARK(BM_ProcessStartToRegister)->UseManualTime()->Iterations(10)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace vfio_agent::plugin::testing

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  vfio_agent::plugin::testing::shared_node.reset();
  return 0;
}
