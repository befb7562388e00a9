// vGPU discovery and profile apply on plain-directory trees (no FUSE: the figures are the agent's own cost, the
// kernel's work behind each write is not in them). Targets from issue 19: discovery of 8 GPUs x 32 vGPUs under
// 50 ms; Allocate as for whole GPUs; applying 256 vGPUs bounded by the sysfs writes.
#include <benchmark/benchmark.h>

#include <fstream>

#include "absl/strings/str_format.h"
#include "support/sysfs_tree.h"
#include "vfio_gpu_agent/names/resource_names.h"
#include "vfio_gpu_agent/pci/selection.h"
#include "vfio_gpu_agent/plugin/allocate.h"
#include "vfio_gpu_agent/plugin/devices.h"
#include "vfio_gpu_agent/plugin/vgpu_devices.h"
#include "vfio_gpu_agent/vgpu/apply.h"
#include "vfio_gpu_agent/vgpu/discovery.h"

namespace vfio_agent::vgpu {
namespace {

using vfio_agent::testing::SysfsTree;
using vfio_agent::testing::TempDir;

constexpr int kGpus = 8;
constexpr int kVgpusPerGpu = 32;

std::string Pf(int gpu) { return absl::StrFormat("0000:%02x:00.0", 0x10 + gpu); }
// VF i of a GPU at routing id + 4 + i, as sysfs-sim places them.
std::string Vf(int gpu, int i) { return absl::StrFormat("0000:%02x:%02x.%x", 0x10 + gpu, (4 + i) / 8, (4 + i) % 8); }

enum Framework : int64_t { kMdev = 0, kSriov = 1 };

// Eight GPUs, each with 32 vGPUs (mdev: T4-like parents with 32 instances; SR-IOV: L40S-like PFs with 32 typed
// VFs) when `with_vgpus`, else with none (SR-IOV: 32 free VFs).
void BuildNode(SysfsTree& tree, Framework framework, bool with_vgpus) {
  const std::vector<testing::FakeVgpuType> catalog = {{1155, "NVIDIA L40S-1Q"}, {1157, "NVIDIA L40S-4Q"}};
  int group = 1;
  for (int gpu = 0; gpu < kGpus; ++gpu) {
    tree.AddDevice({.bdf = Pf(gpu),
                    .device = static_cast<uint16_t>(framework == kMdev ? 0x1eb8 : 0x26b9),
                    .driver = "nvidia",
                    .iommu_group = group++});
    if (framework == kMdev) {
      tree.AddMdevParent(Pf(gpu), {{.id = "nvidia-222", .name = "GRID T4-1Q", .available_instances = 32, .description = ""},
                                   {.id = "nvidia-231", .name = "GRID T4-2Q", .available_instances = 16, .description = ""}});
      for (int i = 0; with_vgpus && i < kVgpusPerGpu; ++i) {
        tree.AddMdev({.uuid = absl::StrFormat("00000000-0000-4000-8000-%06d%06d", gpu, i), .parent = Pf(gpu),
                      .type_id = "nvidia-222", .iommu_group = group++});
      }
      continue;
    }
    tree.SetVgpuCatalog(Pf(gpu), catalog);
    for (int i = 0; i < kVgpusPerGpu; ++i) {
      tree.AddDevice({.bdf = Vf(gpu, i), .device = 0x26b9, .driver = "nvidia", .iommu_group = group++,
                      .physfn = Pf(gpu)});
      tree.SetVgpuCatalog(Vf(gpu, i), with_vgpus ? std::vector<testing::FakeVgpuType>{} : catalog);
      tree.SetCurrentVgpuType(Vf(gpu, i), with_vgpus ? 1155 : 0);
    }
  }
}

// Scan + discovery, as the plugin's rescan runs them on a vm-vgpu node.
void BM_Discover8Gpus32VgpusEach(benchmark::State& state) {
  const auto framework = static_cast<Framework>(state.range(0));
  TempDir dir("va-bench-vgpu");
  SysfsTree tree(dir.path() / "sys");
  BuildNode(tree, framework, /*with_vgpus=*/true);
  CatalogStore catalog(dir.path() / "state/vgpu-catalog.txt");
  // The SR-IOV cards are full: their names come from the catalog a previous scan kept.
  for (int gpu = 0; gpu < kGpus && framework == kSriov; ++gpu) {
    catalog.Merge({.pf_bdf = Pf(gpu), .vendor_id = 0x10de, .device_id = 0x26b9, .driver_version = ""},
                  {{1155, "NVIDIA L40S-1Q"}});
  }
  size_t found = 0;
  for (auto _ : state) {
    absl::StatusOr<pci::Inventory> inventory = pci::Scan(tree.root(), {.detail_vendor = 0x10de, .driver_override = false});
    absl::StatusOr<Discovery> discovery = Discover(tree.root(), *inventory, catalog);
    if (!discovery.ok()) state.SkipWithError(discovery.status().ToString().c_str());
    found = discovery->mdevs.size() + discovery->vgpus.size();
    benchmark::DoNotOptimize(found);
  }
  if (found != kGpus * kVgpusPerGpu) state.SkipWithError("not every vGPU was discovered");
  state.counters["vgpus"] = static_cast<double>(found);
}
BENCHMARK(BM_Discover8Gpus32VgpusEach)->ArgName("sriov")->Arg(kMdev)->Arg(kSriov)->Unit(benchmark::kMillisecond);

// The Allocate core (no transport) for 8 devices of one resource: 8 vGPUs (mdev UUIDs / SR-IOV VFs) of the 8x32
// node, or arg 2, 8 whole GPUs on vfio-pci, the device plugin's case (bench_plugin's BM_AllocateCore8) in the same
// run for the ratio. The snapshot is built once, as the plugin holds it between rescans.
void BM_AllocateCore8(benchmark::State& state) {
  constexpr int64_t kWholeGpus = 2;
  TempDir dir("va-bench-vgpu");
  SysfsTree tree(dir.path() / "sys");
  std::filesystem::create_directories(dir.path() / "dev/vfio");
  plugin::ResourceDevices resource;
  std::vector<std::string> ids;
  HostPaths paths;
  paths.sysfs_root = tree.root();
  paths.dev_root = dir.path() / "dev";
  if (state.range(0) == kWholeGpus) {
    for (int gpu = 0; gpu < kGpus; ++gpu) {
      tree.AddDevice({.bdf = Pf(gpu), .driver = "vfio-pci", .iommu_group = 10 + gpu});
      std::ofstream(dir.path() / "dev/vfio" / std::to_string(10 + gpu));
    }
    absl::StatusOr<pci::Inventory> inventory = pci::Scan(tree.root(), {.detail_vendor = 0x10de, .driver_override = false});
    const pci::Selection selection = pci::Select(*inventory, pci::SelectionPolicy{});
    const names::NameResolver names(nullptr, "nvidia.com", {});
    const plugin::DeviceSnapshot snapshot = plugin::BuildSnapshot(paths, *inventory, selection, names, {});
    if (snapshot.resources.size() != 1) {
      state.SkipWithError("no single whole-GPU resource");
      return;
    }
    resource = snapshot.resources.begin()->second;
  } else {
    const auto framework = static_cast<Framework>(state.range(0));
    BuildNode(tree, framework, /*with_vgpus=*/true);
    // Every vGPU's group node, as the kernel makes them (groups 1.. in BuildNode's order).
    for (int group = 1; group <= kGpus * (kVgpusPerGpu + 1); ++group) {
      std::ofstream(dir.path() / "dev/vfio" / std::to_string(group));
    }
    CatalogStore catalog(dir.path() / "state/vgpu-catalog.txt");
    for (int gpu = 0; gpu < kGpus && framework == kSriov; ++gpu) {
      catalog.Merge({.pf_bdf = Pf(gpu), .vendor_id = 0x10de, .device_id = 0x26b9, .driver_version = ""},
                    {{1155, "NVIDIA L40S-1Q"}});
    }
    absl::StatusOr<pci::Inventory> inventory = pci::Scan(tree.root(), {.detail_vendor = 0x10de, .driver_override = false});
    absl::StatusOr<Discovery> discovery = Discover(tree.root(), *inventory, catalog);
    const plugin::VgpuSnapshot vgpus = plugin::BuildVgpuSnapshot(paths, *inventory, *discovery, "nvidia.com", {});
    if (vgpus.snapshot.resources.size() != 1) {
      state.SkipWithError("no single vGPU resource");
      return;
    }
    resource = vgpus.snapshot.resources.begin()->second;
  }
  for (const plugin::PluginDevice& device : resource.devices) {
    if (ids.size() < static_cast<size_t>(kGpus)) ids.push_back(device.id);
  }
  for (auto _ : state) {
    auto allocation = plugin::AllocateContainer(resource, {}, ids);
    if (!allocation.ok()) state.SkipWithError(allocation.status().ToString().c_str());
    benchmark::DoNotOptimize(allocation);
  }
  state.counters["devices"] = static_cast<double>(ids.size());
}
BENCHMARK(BM_AllocateCore8)->ArgName("kind")->Arg(kMdev)->Arg(kSriov)->Arg(2)->Unit(benchmark::kMicrosecond);

constexpr char kConfig[] = R"(version: v1
vgpu-configs:
  full:
    - devices: all
      vgpu-devices: {T4-1Q: 32}
  full-sriov:
    - devices: all
      vgpu-devices: {L40S-1Q: 32}
)";

// One pass that creates all 256 vGPUs (256 sysfs writes; a plain tree does not react, so each iteration starts
// from the same empty host: the written files are put back outside the timing).
void BM_Apply256Vgpus(benchmark::State& state) {
  const auto framework = static_cast<Framework>(state.range(0));
  TempDir dir("va-bench-vgpu");
  SysfsTree tree(dir.path() / "sys");
  BuildNode(tree, framework, /*with_vgpus=*/false);
  std::filesystem::create_directories(dir.path() / "dev/vfio");
  CatalogStore catalog(dir.path() / "state/vgpu-catalog.txt");
  ApplyOptions options{.paths = {}, .catalog = &catalog, .new_uuid = {}};
  options.paths.sysfs_root = tree.root();
  options.paths.dev_root = dir.path() / "dev";
  const VgpuConfigFile file = *ParseVgpuConfig(kConfig);
  size_t created = 0;
  for (auto _ : state) {
    absl::StatusOr<ApplyReport> report = ApplyVgpuConfig(options, file, framework == kMdev ? "full" : "full-sriov");
    if (!report.ok()) state.SkipWithError(report.status().ToString().c_str());
    created = 0;
    for (const GpuApplyResult& gpu : report->gpus) created += gpu.created.size();
    state.PauseTiming();
    for (int gpu = 0; gpu < kGpus; ++gpu) {
      for (int i = 0; i < kVgpusPerGpu && framework == kSriov; ++i) tree.SetCurrentVgpuType(Vf(gpu, i), 0);
    }
    state.ResumeTiming();
  }
  if (created != kGpus * kVgpusPerGpu) state.SkipWithError("not every vGPU was created");
  state.counters["writes"] = static_cast<double>(created);
}
BENCHMARK(BM_Apply256Vgpus)->ArgName("sriov")->Arg(kMdev)->Arg(kSriov)->Unit(benchmark::kMillisecond);

// A pass over a host that already holds the config: reads only, no write.
void BM_ApplyConverged256Vgpus(benchmark::State& state) {
  const auto framework = static_cast<Framework>(state.range(0));
  TempDir dir("va-bench-vgpu");
  SysfsTree tree(dir.path() / "sys");
  BuildNode(tree, framework, /*with_vgpus=*/true);
  std::filesystem::create_directories(dir.path() / "dev/vfio");
  CatalogStore catalog(dir.path() / "state/vgpu-catalog.txt");
  for (int gpu = 0; gpu < kGpus && framework == kSriov; ++gpu) {
    catalog.Merge({.pf_bdf = Pf(gpu), .vendor_id = 0x10de, .device_id = 0x26b9, .driver_version = ""},
                  {{1155, "NVIDIA L40S-1Q"}});
  }
  ApplyOptions options{.paths = {}, .catalog = &catalog, .new_uuid = {}};
  options.paths.sysfs_root = tree.root();
  options.paths.dev_root = dir.path() / "dev";
  const VgpuConfigFile file = *ParseVgpuConfig(kConfig);
  for (auto _ : state) {
    absl::StatusOr<ApplyReport> report = ApplyVgpuConfig(options, file, framework == kMdev ? "full" : "full-sriov");
    if (!report.ok() || report->changed() || report->State() != "success") state.SkipWithError("not converged");
  }
}
BENCHMARK(BM_ApplyConverged256Vgpus)->ArgName("sriov")->Arg(kMdev)->Arg(kSriov)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace vfio_agent::vgpu

BENCHMARK_MAIN();
