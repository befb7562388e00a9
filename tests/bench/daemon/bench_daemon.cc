// `run` on the simulated 8x H200 node: process start -> ready (gRPC health SERVING, all 8 GPUs bound from
// nvidia, registered and allocatable); the cost of one reconcile pass with every GPU already bound; RSS of
// the process after churn (GPUs knocked off vfio and re-bound, kubelet restarts) against its RSS at ready;
// the API requests it sends in steady state.
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <thread>

#include "benchmark/benchmark.h"
#include "kube_api_sim.h"
#include "run_harness.h"
#include "vfio_gpu_agent/daemon/daemon.h"
#include "vfio_gpu_agent/pci/inventory.h"

namespace vfio_agent::daemon::testing {
namespace {

using Clock = std::chrono::steady_clock;
using plugin::testing::kH200;
using plugin::testing::kH200Gpus;
using plugin::testing::Node;

std::unique_ptr<Node> FreshNode() {
  auto node = Node::Create("hgx-h200-8gpu.json");
  if (!node.ok()) return nullptr;
  kubeletsim::Options kubelet;
  kubelet.pod_resources_socket = PodResourcesSocket(**node);
  if (!(*node)->StartKubelet(kubelet).ok()) return nullptr;
  return *std::move(node);
}

// The figures of /proc/<pid>/status that tell a leak from allocator warm-up: RssAnon is the heap (and
// thread stacks) alone, Threads and open fds catch per-event threads or descriptors that are never closed.
struct ProcessMemory {
  double rss_kb = 0, anon_kb = 0;
  int threads = 0, fds = 0;
};

ProcessMemory MemoryOf(pid_t pid) {
  ProcessMemory memory;
  const std::string proc = "/proc/" + std::to_string(pid);
  std::ifstream status(proc + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) memory.rss_kb = std::stod(line.substr(6));
    if (line.rfind("RssAnon:", 0) == 0) memory.anon_kb = std::stod(line.substr(8));
    if (line.rfind("Threads:", 0) == 0) memory.threads = std::stoi(line.substr(8));
  }
  std::error_code ec;
  for (std::filesystem::directory_iterator it(proc + "/fd", ec), end; !ec && it != end; it.increment(ec)) ++memory.fds;
  return memory;
}

// Each iteration on a fresh node whose GPUs start on nvidia, so every start binds all eight.
void BM_RunStartToReady(benchmark::State& state) {
  double rss_kb = 0;
  for (auto _ : state) {
    state.PauseTiming();
    std::unique_ptr<Node> node = FreshNode();
    if (!node) {
      state.SkipWithError("simulated node");
      return;
    }
    state.ResumeTiming();
    const Clock::time_point start = Clock::now();
    auto run = RunProcess::Start(*node);
    if (!run.ok() || !(*run)->WaitReady(true, std::chrono::seconds(30))) {
      state.SkipWithError("run did not become ready");
      return;
    }
    state.SetIterationTime(std::chrono::duration<double>(Clock::now() - start).count());
    rss_kb = MemoryOf((*run)->pid()).rss_kb;
    state.PauseTiming();
    (*run)->SignalAndWait(SIGTERM);
    run->reset();
    node.reset();
    state.ResumeTiming();
  }
  state.counters["rss_ready_kB"] = rss_kb;
}
BENCHMARK(BM_RunStartToReady)->UseManualTime()->Iterations(5)->Unit(benchmark::kMillisecond);

// A full pass (scan, nothing to bind, readiness with the pod-resources call, metrics) on a ready node.
void BM_ReconcilePass8Gpus(benchmark::State& state) {
  std::unique_ptr<Node> node = FreshNode();
  if (!node) {
    state.SkipWithError("simulated node");
    return;
  }
  DaemonOptions options;
  options.serve = node->options;
  options.serve.paths.pod_resources_socket = PodResourcesSocket(*node);
  options.bind.paths = options.serve.paths;
  options.bind.targets = binding::Targets::EverySelected();
  options.health_port = 0;
  options.metrics_port = 0;
  options.resync_interval = std::chrono::hours(1);
  Daemon daemon(options, nullptr);
  if (!daemon.Start().ok() || !WaitUntil([&] { daemon.ReconcileNow(); return daemon.State().ready; })) {
    state.SkipWithError("daemon not ready");
    return;
  }
  for (auto _ : state) daemon.ReconcileNow();
  daemon.Stop();
}
BENCHMARK(BM_ReconcilePass8Gpus)->Iterations(200)->Repetitions(5)->ReportAggregatesOnly(true)
    ->Unit(benchmark::kMicrosecond);

// sysfs scans (pci::Scan on every thread of the process: the pass, the frontend's scanner) for one `run` pass on a
// ready node with nothing to do (scans_per_pass), and for a GPU knocked off vfio until the kubelet has it healthy
// again and no scan has started for 300 ms (scans_per_rebind: the loop's pass or passes, the binds, the frontend's
// rescans on the device events).
bool OnVfio(const HostPaths& paths, const std::string& bdf) {
  std::error_code ec;
  return std::filesystem::read_symlink(paths.PciDevice(bdf) / "driver", ec).filename() == "vfio-pci";
}

bool ScansQuiet() {
  uint64_t seen = pci::ScansStarted();
  Clock::time_point since = Clock::now();
  return WaitUntil([&] {
    const uint64_t now = pci::ScansStarted();
    if (now != seen) {
      seen = now;
      since = Clock::now();
    }
    return Clock::now() - since >= std::chrono::milliseconds(300);
  });
}

void BM_ScansPerPass(benchmark::State& state) {
  std::unique_ptr<Node> node = FreshNode();
  if (!node) {
    state.SkipWithError("simulated node");
    return;
  }
  DaemonOptions options;
  options.serve = node->options;
  options.serve.paths.pod_resources_socket = PodResourcesSocket(*node);
  options.bind.paths = options.serve.paths;
  options.bind.targets = binding::Targets::EverySelected();
  // As shipped: the harness's 50 ms safety rescan of the frontend would never let the scans fall quiet.
  options.serve.rescan_interval = std::chrono::minutes(1);
  options.health_port = 0;
  options.metrics_port = 0;
  options.resync_interval = std::chrono::hours(1);
  Daemon daemon(options, nullptr);
  if (!daemon.Start().ok() || !WaitUntil([&] { daemon.ReconcileNow(); return daemon.State().ready; })) {
    state.SkipWithError("daemon not ready");
    return;
  }
  uint64_t pass_scans = 0, rebind_scans = 0;
  int round = 0;
  for (auto _ : state) {
    if (!ScansQuiet()) {
      state.SkipWithError("sysfs scans never fell quiet");
      break;
    }
    uint64_t before = pci::ScansStarted();
    daemon.ReconcileNow();
    if (!ScansQuiet()) {
      state.SkipWithError("sysfs scans never fell quiet");
      break;
    }
    pass_scans += pci::ScansStarted() - before;
    const std::string& bdf = kH200Gpus[round++ % kH200Gpus.size()];
    before = pci::ScansStarted();
    if (!node->Control("set-driver " + bdf + " none").ok() ||
        !WaitUntil([&] { return OnVfio(options.serve.paths, bdf) && daemon.State().ready; }, std::chrono::seconds(30)) ||
        !ScansQuiet()) {
      state.SkipWithError("GPU not re-bound");
      break;
    }
    rebind_scans += pci::ScansStarted() - before;
  }
  state.counters["scans_per_pass"] = static_cast<double>(pass_scans) / static_cast<double>(state.iterations());
  state.counters["scans_per_rebind"] = static_cast<double>(rebind_scans) / static_cast<double>(state.iterations());
  daemon.Stop();
}
BENCHMARK(BM_ScansPerPass)->Iterations(5)->Unit(benchmark::kMillisecond);

// A GPU knocked off vfio by someone else -> the loop re-binds it -> the kubelet gets the healthy list again
// (kubelet simulator timestamps). Covers detection (inotify on /dev/vfio), the bind and "advertised within
// 100 ms of its bind".
void BM_KnockedOffToReadvertised(benchmark::State& state) {
  std::unique_ptr<Node> node = FreshNode();
  if (!node) {
    state.SkipWithError("simulated node");
    return;
  }
  auto run = RunProcess::Start(*node);
  if (!run.ok() || !(*run)->WaitReady()) {
    state.SkipWithError("run did not become ready");
    return;
  }
  int round = 0;
  for (auto _ : state) {
    const std::string& bdf = kH200Gpus[round++ % kH200Gpus.size()];
    const size_t events_before = node->kubelet().Events().size();
    const Clock::time_point start = Clock::now();
    if (!node->Control("set-driver " + bdf + " none").ok()) break;
    std::optional<Clock::time_point> lost, back;
    node->kubelet().WaitFor(
        [&](const kubeletsim::KubeletSim& k) {
          auto events = k.Events();
          for (size_t i = events_before; i < events.size(); ++i) {
            if (events[i].kind != "list" || events[i].resource != kH200) continue;
            if (!lost && events[i].detail.find("healthy=7") != std::string::npos) lost = events[i].at;
            if (lost && events[i].detail.find("healthy=8") != std::string::npos) back = events[i].at;
          }
          return back.has_value();
        },
        std::chrono::seconds(30));
    if (!back) {
      state.SkipWithError("not re-advertised");
      return;
    }
    state.SetIterationTime(std::chrono::duration<double>(*back - start).count());
    if (!(*run)->WaitReady()) {
      state.SkipWithError("not ready again");
      return;
    }
  }
  (*run)->SignalAndWait(SIGTERM);
}
BENCHMARK(BM_KnockedOffToReadvertised)->UseManualTime()->Iterations(20)->Unit(benchmark::kMillisecond);

// The reconcile loop's pass stamp (vfio_gpu_agent_last_reconcile_timestamp_seconds): it changes with every pass.
std::string PassStamp(const RunProcess& run) {
  const std::string metrics = run.Metrics();
  const size_t at = metrics.find("\nvfio_gpu_agent_last_reconcile_timestamp_seconds ");
  return at == std::string::npos ? std::string() : metrics.substr(at, metrics.find('\n', at + 1) - at);
}

// API requests of `run` in steady state (target 0), production defaults but for a 10 s resync (six times the
// default's passes, so more chances to send something; plugin rescan 60 s; udev
// off: the simulated node raises none) against the fake API server. Counted: requests from start to ready,
// from ready until the start's condition and events have gone out (the condition patched, then no request
// for 3 s, three times the rate limiter's 1 s between writes), and over the steady window (the iteration
// time), with the loop's passes in it. A request in the window is counted and printed, never dropped.
void BM_ApiRequestsSteadyState(benchmark::State& state) {
  const std::chrono::seconds window(state.range(0));
  double to_ready = 0, to_settled = 0, in_window = 0, passes = 0;
  for (auto _ : state) {
    // A fresh node and API server each iteration, so every start writes its condition and events anew.
    std::unique_ptr<Node> node = FreshNode();
    if (!node) {
      state.SkipWithError("simulated node");
      return;
    }
    auto api = sim::KubeApiSim::Start(node->kubelet_dir().parent_path(), {.nodes = {"node-a"}});
    if (!api.ok()) {
      state.SkipWithError("fake API server (python3)");
      return;
    }
    auto kubeconfig = (*api)->WriteKubeconfig(node->kubelet_dir().parent_path() / "kubeconfig");
    if (!kubeconfig.ok()) {
      state.SkipWithError("kubeconfig");
      return;
    }
    auto run = RunProcess::Start(*node, {"--kubeconfig", kubeconfig->string(), "--node-name", "node-a",
                                         "--resync-interval", "10000", "--rescan-interval", "60000"});
    if (!run.ok() || !(*run)->WaitReady()) {
      state.SkipWithError("run did not become ready");
      return;
    }
    const size_t at_ready = (*api)->Log().size();
    if (!WaitUntil([&] { return (*api)->Count("PATCH", "/api/v1/nodes/node-a/status", "200") >= 1; })) {
      state.SkipWithError("node condition never patched");
      return;
    }
    size_t seen = (*api)->Log().size();
    Clock::time_point quiet_since = Clock::now();
    const bool settled = WaitUntil(
        [&] {
          const size_t now = (*api)->Log().size();
          if (now != seen) {
            seen = now;
            quiet_since = Clock::now();
          }
          return Clock::now() - quiet_since >= std::chrono::seconds(3);
        },
        std::chrono::seconds(120));
    if (!settled) {
      state.SkipWithError("API requests did not settle after ready");
      return;
    }
    const size_t at_settled = seen;
    const Clock::time_point start = Clock::now();
    std::string stamp = PassStamp(**run);
    int window_passes = 0;
    while (Clock::now() - start < window) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      const std::string now = PassStamp(**run);
      if (!now.empty() && now != stamp) ++window_passes;
      stamp = now;
    }
    const std::chrono::duration<double> elapsed = Clock::now() - start;
    const std::vector<sim::KubeApiRequest> log = (*api)->Log();
    for (size_t i = 0; i < log.size(); ++i) {
      const char* phase = i < at_ready ? "start" : i < at_settled ? "settling" : "STEADY STATE";
      std::cerr << "API request (" << phase << "): " << log[i].method << " " << log[i].path << " -> "
                << log[i].status << "\n";
    }
    state.SetIterationTime(elapsed.count());
    to_ready += static_cast<double>(at_ready);
    to_settled += static_cast<double>(at_settled - at_ready);
    in_window += static_cast<double>(log.size() - at_settled);
    passes += window_passes;
    (*run)->SignalAndWait(SIGTERM);
  }
  const double iterations = static_cast<double>(state.iterations());
  state.counters["requests_start_to_ready"] = to_ready / iterations;
  state.counters["requests_ready_to_settled"] = to_settled / iterations;
  state.counters["requests_in_window"] = in_window / iterations;
  state.counters["requests_per_hour"] = in_window / iterations * 3600.0 / static_cast<double>(window.count());
  state.counters["passes_in_window"] = passes / iterations;
}
BENCHMARK(BM_ApiRequestsSteadyState)->Arg(60)->UseManualTime()->Iterations(1)->Unit(benchmark::kSecond);

// Churn: each round knocks one GPU off vfio (the loop re-binds it) and every tenth restarts the kubelet;
// memory is read once the node is ready again. One process runs all the rounds and is sampled at 100, 400
// and 1600 rounds, so the counters show whether growth keeps pace with the rounds (a leak) or flattens
// (allocator warm-up: glibc arenas of gRPC's threads filling up to their working set).
void BM_RssAfterChurn(benchmark::State& state) {
  const int rounds = static_cast<int>(state.range(0));
  std::unique_ptr<Node> node = FreshNode();
  if (!node) {
    state.SkipWithError("simulated node");
    return;
  }
  auto run = RunProcess::Start(*node);
  if (!run.ok() || !(*run)->WaitReady()) {
    state.SkipWithError("run did not become ready");
    return;
  }
  (*run)->Metrics();  // the first scrape allocates the exposer's buffers; count them at start
  const ProcessMemory start = MemoryOf((*run)->pid());
  state.counters["rss_start_kB"] = start.rss_kb;
  state.counters["threads_start"] = start.threads;
  state.counters["fds_start"] = start.fds;
  for (auto _ : state) {
    for (int i = 0; i < rounds; ++i) {
      const std::string& bdf = kH200Gpus[i % kH200Gpus.size()];
      if (!node->Control("set-driver " + bdf + " none").ok()) break;
      if (i % 10 == 9 && !node->kubelet().Restart().ok()) break;
      const bool rebound = WaitUntil([&] { return DriverOf(*node, bdf) == "vfio-pci"; });
      const bool ready = rebound && (*run)->WaitReady();
      if (!ready || !node->WaitForCounts(kH200, 8, 8, std::chrono::seconds(30))) {
        const std::string log = (*run)->Log();
        std::cerr << "round " << i << " " << bdf << (rebound ? " rebound" : " not rebound")
                  << (ready ? ", ready" : ", not ready") << "\n" << log.substr(log.size() > 4000 ? log.size() - 4000 : 0);
        state.SkipWithError("not ready again after a churn round");
        return;
      }
      (*run)->Metrics();
      const int done = i + 1;
      if (done == 100 || done == 400 || done == 1600 || done == rounds) {
        const ProcessMemory now = MemoryOf((*run)->pid());
        const std::string at = std::to_string(done);
        state.counters["rss_growth_kB@" + at] = now.rss_kb - start.rss_kb;
        state.counters["anon_growth_kB@" + at] = now.anon_kb - start.anon_kb;
        state.counters["threads@" + at] = now.threads;
        state.counters["fds@" + at] = now.fds;
      }
    }
  }
  (*run)->SignalAndWait(SIGTERM);
}
BENCHMARK(BM_RssAfterChurn)->Arg(1600)->Iterations(1)->Repetitions(1)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace vfio_agent::daemon::testing

BENCHMARK_MAIN();
