// GetPreferredAllocation over the 15 partitions of an HGX 8-GPU board, and Allocate's partition activation (and
// its release) against the fake libnvfm: the agent's own cost is the manager's figure minus the raw FM calls'.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include "fabric_fixture.h"
#include "rss.h"
#include "vfio_gpu_agent/fabric/partition_manager.h"

namespace vfio_agent::fabric {
namespace {

using vfio_agent::testing::HgxTable;
using vfio_agent::testing::Module;

std::map<std::string, int> Numa() {
  std::map<std::string, int> numa;
  const auto& gpus = vfio_agent::testing::HgxGpus();
  for (size_t i = 0; i < gpus.size(); ++i) numa[gpus[i]] = i < 4 ? 0 : 1;
  return numa;
}

// Size 1, 2, 4, 8 with every GPU free, and size 2 with module 1 held (the fragmented case).
void BM_PreferredPartition(benchmark::State& state) {
  const PartitionTable table = HgxTable();
  std::set<std::string> free(vfio_agent::testing::HgxGpus().begin(), vfio_agent::testing::HgxGpus().end());
  if (state.range(1) != 0) free.erase(Module(1));
  const std::map<std::string, int> numa = Numa();
  for (auto _ : state) {
    auto chosen = PreferredPartition(table, free, {}, static_cast<int>(state.range(0)), numa);
    benchmark::DoNotOptimize(chosen);
  }
}
BENCHMARK(BM_PreferredPartition)->ArgNames({"size", "held"})->Args({1, 0})->Args({2, 0})->Args({4, 0})->Args({8, 0})->Args({2, 1});

struct FakeFm {
  FakeFm() : dir("/tmp/bench-fabric-" + std::to_string(::getpid())) {
    file = vfio_agent::testing::MakeFakeFm(dir);
  }
  ~FakeFm() { std::filesystem::remove_all(dir); }
  std::filesystem::path dir, file;
};

// The raw FM calls one allocate/release cycle makes: activate, deactivate, and the two reads around them.
void BM_RawFmCycle(benchmark::State& state) {
  FakeFm fm;
  auto client = ConnectNvfm({.address = "unix:" + fm.file.string(), .library = FAKE_NVFM_LIBRARY});
  if (!client.ok()) return state.SkipWithError(client.status().ToString().c_str());
  for (auto _ : state) {
    benchmark::DoNotOptimize((*client)->Activate(4));
    benchmark::DoNotOptimize((*client)->Partitions());
    benchmark::DoNotOptimize((*client)->Deactivate(4));
    benchmark::DoNotOptimize((*client)->Partitions());
  }
}
BENCHMARK(BM_RawFmCycle)->Unit(benchmark::kMicrosecond);

// PrepareAllocation of a pair, then the release pass once no pod holds it.
void BM_AllocateActivateRelease(benchmark::State& state) {
  FakeFm fm;
  const std::string address = "unix:" + fm.file.string();
  const NvfmOptions nvfm{.address = address, .library = FAKE_NVFM_LIBRARY};
  PartitionManager manager({.address = address, .activation_grace = std::chrono::milliseconds(0)},
                           [nvfm] { return ConnectNvfm(nvfm); });
  if (absl::Status status = manager.Reconcile(std::set<std::string>{}); !status.ok()) {
    return state.SkipWithError(status.ToString().c_str());
  }
  const std::set<std::string> pair = {Module(3), Module(4)};
  for (auto _ : state) {
    if (!manager.PrepareAllocation(pair).ok()) return state.SkipWithError("activation failed");
    if (!manager.Reconcile(std::set<std::string>{}).ok()) return state.SkipWithError("release failed");
  }
}
BENCHMARK(BM_AllocateActivateRelease)->Unit(benchmark::kMicrosecond);

// Anonymous memory after 10,000 allocate/release cycles, against the level after a first 1,000.
void BM_AnonGrowthPer10000Cycles(benchmark::State& state) {
  FakeFm fm;
  const std::string address = "unix:" + fm.file.string();
  const NvfmOptions nvfm{.address = address, .library = FAKE_NVFM_LIBRARY};
  PartitionManager manager({.address = address, .activation_grace = std::chrono::milliseconds(0)},
                           [nvfm] { return ConnectNvfm(nvfm); });
  const std::set<std::string> sets[] = {{Module(1), Module(2)}, {Module(5), Module(6), Module(7), Module(8)}, {Module(3)}};
  auto cycles = [&](int n) {
    for (int i = 0; i < n; ++i) {
      (void)manager.PrepareAllocation(sets[i % 3]);
      (void)manager.Reconcile(std::set<std::string>{});
    }
  };
  cycles(1000);
  int64_t growth = 0;
  for (auto _ : state) {
    const int64_t before = bench::RssAnonKb();
    cycles(10000);
    growth = bench::RssAnonKb() - before;
  }
  state.counters["anon_growth_kB"] = static_cast<double>(growth);
  state.counters["rss_anon_kB"] = static_cast<double>(bench::RssAnonKb());
}
BENCHMARK(BM_AnonGrowthPer10000Cycles)->Unit(benchmark::kMillisecond)->Iterations(1);

}  // namespace
}  // namespace vfio_agent::fabric

BENCHMARK_MAIN();
