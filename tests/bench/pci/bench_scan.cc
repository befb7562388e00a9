// Scan + Select over a generated plain-directory sysfs tree of 4,096 PCI functions (no FUSE).
// Target from issue 2: under 50 ms per scan.
#include <benchmark/benchmark.h>
#include <sched.h>
#include <sys/mount.h>

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_format.h"
#include "support/sysfs_tree.h"
#include "vfio_gpu_agent/pci/inventory.h"
#include "vfio_gpu_agent/pci/selection.h"

namespace vfio_agent::pci {
namespace {

using vfio_agent::testing::FakePciDevice;
using vfio_agent::testing::SysfsTree;

constexpr int kBuses = 512;  // 8 functions each: 4,096 functions over two PCI domains
constexpr size_t kFunctions = kBuses * 8;
constexpr uint16_t kIntel = 0x8086;

std::string Bdf(int bus, int function) {
  return absl::StrFormat("%04x:%02x:00.%x", bus / 256, bus % 256, function);
}

FakePciDevice Endpoint(int bus, int function, uint16_t vendor, uint32_t class_code, const char* driver, int group) {
  return {.bdf = Bdf(bus, function), .vendor = vendor, .device = 0x1572, .class_code = class_code,
          .numa_node = bus % 2, .driver = driver, .iommu_group = group};
}

// Four kinds of card, one per bus in turn: a workstation GPU with HDA/USB/UCSI in its group plus NICs;
// a 3D-controller GPU sharing its group with a NIC plus NVMe drives; a GPU behind a bridge in its group
// plus NICs; an NVSwitch plus NVMe drives. Every other function has a group of its own.
void BuildNode(SysfsTree* tree) {
  int group = 0;
  for (int bus = 0; bus < kBuses; ++bus) {
    int first_own_group_fn = 0;
    switch (bus % 4) {
      case 0: {
        const int shared = group++;
        FakePciDevice gpu = Endpoint(bus, 0, kVendorNvidia, kClassVgaController, "nvidia", shared);
        gpu.consumers = {Bdf(bus, 1), Bdf(bus, 2), Bdf(bus, 3)};
        tree->AddDevice(gpu);
        tree->AddDevice(Endpoint(bus, 1, kVendorNvidia, kClassHdAudio, "snd_hda_intel", shared));
        tree->AddDevice(Endpoint(bus, 2, kVendorNvidia, kClassUsb, "xhci_hcd", shared));
        tree->AddDevice(Endpoint(bus, 3, kVendorNvidia, kClassUcsi, "", shared));
        first_own_group_fn = 4;
        break;
      }
      case 1: {
        const int shared = group++;
        FakePciDevice gpu = Endpoint(bus, 0, kVendorNvidia, kClass3dController, "vfio-pci", shared);
        gpu.vfio_cdevs = {absl::StrFormat("vfio%d", bus)};
        tree->AddDevice(gpu);
        tree->AddDevice(Endpoint(bus, 1, kIntel, 0x020000, "i40e", shared));
        first_own_group_fn = 2;
        break;
      }
      case 2: {
        const int shared = group++;
        FakePciDevice bridge = Endpoint(bus, 0, kIntel, 0x060400, "pcieport", shared);
        bridge.header_type = 1;
        tree->AddDevice(bridge);
        tree->AddDevice(Endpoint(bus, 1, kVendorNvidia, kClass3dController, "vfio-pci", shared));
        first_own_group_fn = 2;
        break;
      }
      default:
        tree->AddDevice(Endpoint(bus, 0, kVendorNvidia, kClassBridgeOther, "nvidia-nvswitch", group++));
        first_own_group_fn = 1;
    }
    for (int fn = first_own_group_fn; fn < 8; ++fn) {
      const bool nic = bus % 2 == 0;
      tree->AddDevice(Endpoint(bus, fn, nic ? kIntel : 0x144d, nic ? 0x020000 : 0x010802, nic ? "i40e" : "nvme",
                               group++));
    }
  }
}

const std::filesystem::path* g_root = nullptr;

bool MountPrivateTmpfs(const std::filesystem::path& dir) {
  return ::unshare(CLONE_NEWNS) == 0 && ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0 &&
         ::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=1g,mode=0700") == 0;
}

// As the agent scans: functions of other vendors only as far as selection needs them (ScanOptions).
void BM_ScanAndSelect(benchmark::State& state) {
  size_t selected = 0;
  for (auto _ : state) {
    auto inventory = Scan(*g_root, {.detail_vendor = kVendorNvidia});
    if (!inventory.ok() || inventory->functions().size() != kFunctions || !inventory->errors().empty()) {
      state.SkipWithError("scan of the generated tree failed or was incomplete");
      return;
    }
    Selection selection = Select(*inventory, SelectionPolicy{});
    selected = selection.gpus.size();
    benchmark::DoNotOptimize(selection);
  }
  state.counters["functions"] = kFunctions;
  state.counters["gpus"] = static_cast<double>(selected);
}
// Scan reads devices on several threads: report wall time, and CPU time summed over all threads.
BENCHMARK(BM_ScanAndSelect)->Unit(benchmark::kMillisecond)->UseRealTime()->MeasureProcessCPUTime();

// Every function in full (ScanOptions{}), for the ratio: what reading other vendors' details would cost.
void BM_ScanEveryFunctionInFull(benchmark::State& state) {
  for (auto _ : state) {
    auto inventory = Scan(*g_root);
    if (!inventory.ok() || inventory->functions().size() != kFunctions || !inventory->errors().empty()) {
      state.SkipWithError("scan of the generated tree failed or was incomplete");
      return;
    }
    benchmark::DoNotOptimize(inventory);
  }
}
BENCHMARK(BM_ScanEveryFunctionInFull)->Unit(benchmark::kMillisecond)->UseRealTime()->MeasureProcessCPUTime();

void BM_SelectOnly(benchmark::State& state) {
  auto inventory = Scan(*g_root);
  if (!inventory.ok()) {
    state.SkipWithError("scan failed");
    return;
  }
  for (auto _ : state) benchmark::DoNotOptimize(Select(*inventory, SelectionPolicy{}));
}
BENCHMARK(BM_SelectOnly)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace vfio_agent::pci

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  vfio_agent::testing::TempDir dir("va-bench-scan");
  // Sysfs lives in memory, and creating ~60,000 files on a busy disk can take minutes, so the tree goes
  // on a tmpfs visible to this process only when it may create a mount namespace (root); else on disk.
  const bool on_tmpfs = vfio_agent::pci::MountPrivateTmpfs(dir.path());
  std::fprintf(stderr, "generating %d PCI functions under %s (%s)\n", static_cast<int>(vfio_agent::pci::kFunctions),
               dir.path().c_str(), on_tmpfs ? "private tmpfs" : "disk");
  {
    vfio_agent::testing::SysfsTree tree(dir.path());
    vfio_agent::pci::BuildNode(&tree);
    vfio_agent::pci::g_root = &tree.root();
    benchmark::RunSpecifiedBenchmarks();
  }
  if (on_tmpfs) ::umount2(dir.path().c_str(), MNT_DETACH);
  benchmark::Shutdown();
  return 0;
}
