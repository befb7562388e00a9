// Cost of the name database: loading the host's pci.ids through libpci (with the first lookup, the
// point where a lazy loader would pay) and resolving names for a 4,096-function node.
// Run: bench_names --benchmark_repetitions=10 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <set>

#include "vfio_gpu_agent/names/resource_names.h"

namespace vfio_agent::names {
namespace {

const char* const kPciIds = "/usr/share/misc/pci.ids";
constexpr uint16_t kNvidia = 0x10de;

// 19 pinned Cozystack ids plus 21 other NVIDIA functions (GPUs, NVSwitches, audio, some absent from
// older snapshots, some sharing a name), spread over 4,096 functions.
std::vector<std::pair<uint16_t, uint16_t>> NodeFunctions() {
  static const uint16_t kDevices[] = {
      0x2335, 0x2330, 0x2331, 0x2321, 0x26b9, 0x26b5, 0x27b8, 0x20b2, 0x20b0, 0x20b5, 0x20f1, 0x20b7, 0x2235, 0x2236,
      0x1eb8, 0x1db1, 0x1db5, 0x1db4, 0x1df6, 0x2342, 0x25b6, 0x20b3, 0x2339, 0x2324, 0x1aef, 0x20b1, 0x1df5, 0x22a3,
      0x1af1, 0x2322, 0x233d, 0x26ba, 0x2237, 0x1db6, 0x1db8, 0x2901, 0x2bb5, 0x233b, 0x2348, 0x24fa};
  std::vector<std::pair<uint16_t, uint16_t>> functions;
  for (size_t i = 0; i < 4096; ++i) functions.emplace_back(kNvidia, kDevices[i % std::size(kDevices)]);
  return functions;
}

std::unique_ptr<PciIdsDatabase> LoadOrSkip(benchmark::State& state) {
  absl::StatusOr<std::unique_ptr<PciIdsDatabase>> db = LoadPciIds(kPciIds);
  if (!db.ok()) {
    state.SkipWithError(std::string(db.status().message()).c_str());
    return nullptr;
  }
  return *std::move(db);
}

void BM_LoadPciIdsAndFirstLookup(benchmark::State& state) {
  for (auto _ : state) {
    std::unique_ptr<PciIdsDatabase> db = LoadOrSkip(state);
    if (db == nullptr) return;
    benchmark::DoNotOptimize(db->DeviceName(kNvidia, 0x2236));
  }
}
BENCHMARK(BM_LoadPciIdsAndFirstLookup)->Unit(benchmark::kMillisecond);

void BM_DeviceNameLookup(benchmark::State& state) {
  std::unique_ptr<PciIdsDatabase> db = LoadOrSkip(state);
  if (db == nullptr) return;
  for (auto _ : state) benchmark::DoNotOptimize(db->DeviceName(kNvidia, 0x2236));
}
BENCHMARK(BM_DeviceNameLookup);

void BM_Resolve4096Functions(benchmark::State& state) {
  std::unique_ptr<PciIdsDatabase> db = LoadOrSkip(state);
  if (db == nullptr) return;
  const auto functions = NodeFunctions();
  const NameResolver resolver(db.get(), "nvidia.com", {});
  for (auto _ : state) {
    std::set<std::pair<uint16_t, uint16_t>> distinct(functions.begin(), functions.end());
    auto resolved = resolver.Resolve({distinct.begin(), distinct.end()});
    benchmark::DoNotOptimize(resolved);
  }
}
BENCHMARK(BM_Resolve4096Functions)->Unit(benchmark::kMicrosecond);

// What `inspect` pays for names from a cold start: load, then name the whole node.
void BM_LoadAndResolve4096Functions(benchmark::State& state) {
  const auto functions = NodeFunctions();
  for (auto _ : state) {
    std::unique_ptr<PciIdsDatabase> db = LoadOrSkip(state);
    if (db == nullptr) return;
    std::set<std::pair<uint16_t, uint16_t>> distinct(functions.begin(), functions.end());
    auto resolved = NameResolver(db.get(), "nvidia.com", {}).Resolve({distinct.begin(), distinct.end()});
    benchmark::DoNotOptimize(resolved);
  }
}
BENCHMARK(BM_LoadAndResolve4096Functions)->Unit(benchmark::kMillisecond);

// What `serve` pays for names at start on a node of Cozystack GPUs (8x H200): with the lazy database pci.ids is
// never parsed, because every id has a pinned name.
void BM_ServeStartNamesPinnedNode(benchmark::State& state) {
  const std::vector<std::pair<uint16_t, uint16_t>> h200(8, {kNvidia, 0x2335});
  for (auto _ : state) {
    std::unique_ptr<PciIdsDatabase> db = LazyPciIds(kPciIds);
    auto resolved = NameResolver(db.get(), "nvidia.com", {}).Resolve(h200);
    benchmark::DoNotOptimize(resolved);
  }
}
BENCHMARK(BM_ServeStartNamesPinnedNode)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace vfio_agent::names

BENCHMARK_MAIN();
