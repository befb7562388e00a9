#include "vfio_gpu_agent/dra/devices.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bind_policy.h"
#include "vfio_gpu_agent/common/fs.h"
#include "vfio_gpu_agent/dra/device_names.h"
#include "vfio_gpu_agent/pci/vfio_health.h"

namespace vfio_agent::dra {
namespace {

constexpr size_t kMaxAttributeString = 64;  // resource.k8s.io/v1 DeviceAttributeMaxValueLength

std::string Qualified(std::string_view driver, std::string_view attribute) {
  return absl::StrCat(std::string(driver), "/", std::string(attribute));
}

kube::DeviceTaint UnhealthyTaint(std::string_view driver) {
  return {.key = Qualified(driver, kUnhealthyTaint), .effect = "NoSchedule"};
}

}  // namespace

std::string PcieRoot(const HostPaths& paths, const std::string& bdf) {
  std::error_code ec;
  const std::filesystem::path real = std::filesystem::canonical(paths.PciDevice(bdf), ec);
  if (ec) return "";
  for (const std::filesystem::path& part : real) {
    if (part.string().starts_with("pci")) return part.string();
  }
  return "";
}

std::vector<GpuDevice> BuildDevices(const HostPaths& paths, const pci::Inventory& inventory,
                                    const pci::Selection& selection, const names::NameResolver& names,
                                    const names::PciIdsDatabase* pci_ids, std::string_view driver,
                                    const std::vector<GpuDevice>& previous, bool bind_on_prepare) {
  std::vector<const pci::Function*> gpus;
  std::vector<std::pair<uint16_t, uint16_t>> ids;
  for (const std::string& bdf : selection.gpus) {
    if (selection.RoleOf(bdf) != pci::Role::kGpu) continue;
    const pci::Function* fn = inventory.Find(bdf);
    if (fn == nullptr) continue;
    gpus.push_back(fn);
    ids.emplace_back(fn->vendor_id, fn->device_id);
  }
  const std::map<uint32_t, names::ResolvedName> resolved = names.Resolve(ids);
  const bool iommufd = fs::Exists(paths.dev_root / "iommu");

  std::vector<GpuDevice> devices;
  for (const pci::Function* fn : gpus) {
    const pci::GroupAssessment* group = selection.GroupOf(*fn);
    GpuDevice device{.bdf = fn->bdf,
                     .unhealthy_reason = bind_on_prepare
                                             ? internal::BindOnPrepareUnhealthyReason(paths, *fn, group, iommufd)
                                             : pci::VfioUnhealthyReason(paths, *fn, group, iommufd)};
    kube::SliceDevice& slice = device.slice;
    slice.name = DeviceName(fn->bdf);
    slice.attributes[std::string(kPciBusIdAttribute)] = kube::DeviceAttribute::String(fn->bdf);
    if (std::string root = PcieRoot(paths, fn->bdf); !root.empty()) {
      slice.attributes[std::string(kPcieRootAttribute)] = kube::DeviceAttribute::String(root);
    }
    if (fn->numa_node) slice.attributes[std::string(kNumaNodeAttribute)] = kube::DeviceAttribute::Int(*fn->numa_node);
    if (auto name = resolved.find(names::NameKey(fn->vendor_id, fn->device_id)); name != resolved.end()) {
      slice.attributes[Qualified(driver, kResourceNameAttribute)] = kube::DeviceAttribute::String(name->second.name);
    }
    if (std::optional<std::string> product = pci_ids == nullptr ? std::nullopt : pci_ids->DeviceName(fn->vendor_id, fn->device_id)) {
      slice.attributes[Qualified(driver, kProductNameAttribute)] =
          kube::DeviceAttribute::String(product->substr(0, kMaxAttributeString));
    }
    slice.attributes[Qualified(driver, kVendorIdAttribute)] =
        kube::DeviceAttribute::String(absl::StrFormat("0x%04x", fn->vendor_id));
    slice.attributes[Qualified(driver, kDeviceIdAttribute)] =
        kube::DeviceAttribute::String(absl::StrFormat("0x%04x", fn->device_id));
    if (fn->iommu_group) slice.attributes[Qualified(driver, kIommuGroupAttribute)] = kube::DeviceAttribute::Int(*fn->iommu_group);
    if (!device.healthy()) slice.taints.push_back(UnhealthyTaint(driver));
    devices.push_back(std::move(device));
  }
  for (const GpuDevice& before : previous) {
    if (inventory.Find(before.bdf) != nullptr) continue;
    GpuDevice gone = before;
    gone.unhealthy_reason = "gone from sysfs";
    gone.slice.taints = {UnhealthyTaint(driver)};
    devices.push_back(std::move(gone));
  }
  std::sort(devices.begin(), devices.end(),
            [](const GpuDevice& a, const GpuDevice& b) { return a.slice.name < b.slice.name; });
  return devices;
}

}  // namespace vfio_agent::dra
