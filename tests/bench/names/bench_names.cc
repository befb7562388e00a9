// Cost of the name database: loading the host's pci.ids through libpci (with the first lookup, the
// point where a lazy loader would pay) and resolving names for 4,096 distinct device ids.
// Run: bench_names --benchmark_repetitions=10 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <set>

#include "vfio_gpu_agent/names/resource_names.h"

namespace vfio_agent::names {
namespace {

const char* const kPciIds = "/usr/share/misc/pci.ids";
constexpr uint16_t kNvidia = 0x10de;
constexpr size_t kDistinctIds = 4096;

// 4,096 distinct NVIDIA device ids: the 19 pinned Cozystack ids and 21 other NVIDIA functions (GPUs,
// NVSwitches, audio, some absent from older snapshots, some sharing a name), then every further id from 0x1000
// up, most of them in pci.ids and the rest not, so each of the 4,096 is its own lookup.
std::vector<std::pair<uint16_t, uint16_t>> NodeFunctions() {
  static const uint16_t kDevices[] = {
      0x2335, 0x2330, 0x2331, 0x2321, 0x26b9, 0x26b5, 0x27b8, 0x20b2, 0x20b0, 0x20b5, 0x20f1, 0x20b7, 0x2235, 0x2236,
      0x1eb8, 0x1db1, 0x1db5, 0x1db4, 0x1df6, 0x2342, 0x25b6, 0x20b3, 0x2339, 0x2324, 0x1aef, 0x20b1, 0x1df5, 0x22a3,
      0x1af1, 0x2322, 0x233d, 0x26ba, 0x2237, 0x1db6, 0x1db8, 0x2901, 0x2bb5, 0x233b, 0x2348, 0x24fa};
  std::set<uint16_t> devices(std::begin(kDevices), std::end(kDevices));
  for (uint32_t device = 0x1000; devices.size() < kDistinctIds; ++device) devices.insert(static_cast<uint16_t>(device));
  std::vector<std::pair<uint16_t, uint16_t>> functions;
  for (uint16_t device : devices) functions.emplace_back(kNvidia, device);
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

void BM_Resolve4096DistinctIds(benchmark::State& state) {
  std::unique_ptr<PciIdsDatabase> db = LoadOrSkip(state);
  if (db == nullptr) return;
  const auto ids = NodeFunctions();
  const NameResolver resolver(db.get(), "nvidia.com", {});
  size_t resolved_count = 0, from_pci_ids = 0;
  for (auto _ : state) {
    auto resolved = resolver.Resolve(ids);
    resolved_count = resolved.size();
    benchmark::DoNotOptimize(resolved);
  }
  for (const auto& [key, name] : resolver.Resolve(ids)) from_pci_ids += name.source == NameSource::kPciIds;
  if (resolved_count != kDistinctIds) state.SkipWithError("the resolver did not name every id");
  state.counters["ids"] = static_cast<double>(resolved_count);
  state.counters["named_by_pci_ids"] = static_cast<double>(from_pci_ids);
}
BENCHMARK(BM_Resolve4096DistinctIds)->Unit(benchmark::kMicrosecond);

// What `inspect` pays for names from a cold start: load, then name 4,096 distinct ids.
void BM_LoadAndResolve4096DistinctIds(benchmark::State& state) {
  const auto ids = NodeFunctions();
  for (auto _ : state) {
    std::unique_ptr<PciIdsDatabase> db = LoadOrSkip(state);
    if (db == nullptr) return;
    auto resolved = NameResolver(db.get(), "nvidia.com", {}).Resolve(ids);
    benchmark::DoNotOptimize(resolved);
  }
}
BENCHMARK(BM_LoadAndResolve4096DistinctIds)->Unit(benchmark::kMillisecond);

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
