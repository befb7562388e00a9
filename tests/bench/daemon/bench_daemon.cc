// `run` on the simulated 8x H200 node: process start -> ready (gRPC health SERVING, all 8 GPUs bound from
// nvidia, registered and allocatable); the cost of one reconcile pass with every GPU already bound; RSS of
// the process after churn (GPUs knocked off vfio and re-bound, kubelet restarts) against its RSS at ready.
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>

#include "benchmark/benchmark.h"
#include "run_harness.h"
#include "vfio_gpu_agent/daemon/daemon.h"

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
