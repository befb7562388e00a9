// Run: bench_plugin --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
// Figures (issue 4): the plugin's own time per Allocate over its unix socket (= Allocate round trip minus
// the round trip of the empty GetDevicePluginOptions call), anonymous memory growth over 1,000 Allocates,
// health event -> ListAndWatch update seen by the kubelet (lost and recovered), kubelet start -> Register.
#include <benchmark/benchmark.h>

#include <fstream>
#include <thread>

#include "grpcpp/client_context.h"
#include "plugin_harness.h"
#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/plugin/allocate.h"

namespace vfio_agent::plugin::testing {
namespace {

using Clock = std::chrono::steady_clock;

// One simulated node for the whole run (starting FUSE per benchmark would dominate).
Node& SharedNode() {
  static Node* node = [] {
    spdlog::set_level(spdlog::level::warn);
    auto created = Node::Create("hgx-h200-8gpu.json");
    if (!created.ok()) {
      fprintf(stderr, "sysfs-sim: %s\n", created.status().ToString().c_str());
      std::abort();
    }
    Node* n = created->release();
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

}  // namespace
}  // namespace vfio_agent::plugin::testing

BENCHMARK_MAIN();
