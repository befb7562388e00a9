#include "vfio_gpu_agent/dra/devices.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "vfio_gpu_agent/dra/device_names.h"

namespace vfio_agent::dra {
namespace {

constexpr size_t kMaxAttributeString = 64;  // resource.k8s.io/v1 DeviceAttributeMaxValueLength

}  // namespace

std::string Qualified(std::string_view driver, std::string_view attribute) {
  return absl::StrCat(std::string(driver), "/", std::string(attribute));
}

kube::DeviceTaint UnhealthyTaint(std::string_view driver) {
  return {.key = Qualified(driver, kUnhealthyTaint), .effect = "NoSchedule"};
}

std::optional<std::string> ProductName(const names::PciIdsDatabase* pci_ids, uint16_t vendor_id, uint16_t device_id) {
  std::optional<std::string> product = pci_ids == nullptr ? std::nullopt : pci_ids->DeviceName(vendor_id, device_id);
  if (product) product->resize(std::min(product->size(), kMaxAttributeString));
  return product;
}

std::vector<GpuDevice> GpusOf(const node::Snapshot& node, const pci::Inventory& inventory,
                              const names::PciIdsDatabase* pci_ids, std::string_view driver,
                              const std::vector<GpuDevice>& previous) {
  std::vector<GpuDevice> devices;
  for (const node::Device& gpu : node.devices) {
    if (gpu.kind != node::Kind::kGpu) continue;
    GpuDevice device{.bdf = gpu.bdf, .unhealthy_reason = gpu.unhealthy_reason};
    kube::SliceDevice& slice = device.slice;
    slice.name = DeviceName(gpu.bdf);
    slice.attributes[std::string(kPciBusIdAttribute)] = kube::DeviceAttribute::String(gpu.bdf);
    if (!gpu.pcie_root.empty()) {
      slice.attributes[std::string(kPcieRootAttribute)] = kube::DeviceAttribute::String(gpu.pcie_root);
    }
    if (gpu.numa_node) slice.attributes[std::string(kNumaNodeAttribute)] = kube::DeviceAttribute::Int(*gpu.numa_node);
    slice.attributes[Qualified(driver, kResourceNameAttribute)] = kube::DeviceAttribute::String(gpu.name);
    if (std::optional<std::string> product = ProductName(pci_ids, gpu.card->vendor_id, gpu.card->device_id)) {
      slice.attributes[Qualified(driver, kProductNameAttribute)] = kube::DeviceAttribute::String(*product);
    }
    slice.attributes[Qualified(driver, kVendorIdAttribute)] =
        kube::DeviceAttribute::String(absl::StrFormat("0x%04x", gpu.card->vendor_id));
    slice.attributes[Qualified(driver, kDeviceIdAttribute)] =
        kube::DeviceAttribute::String(absl::StrFormat("0x%04x", gpu.card->device_id));
    if (gpu.iommu_group) slice.attributes[Qualified(driver, kIommuGroupAttribute)] = kube::DeviceAttribute::Int(*gpu.iommu_group);
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

std::vector<GpuDevice> BuildDevices(const HostPaths& paths, const pci::Inventory& inventory,
                                    const pci::Selection& selection, const names::NameResolver& names,
                                    const names::PciIdsDatabase* pci_ids, std::string_view driver,
                                    const std::vector<GpuDevice>& previous, bool bind_on_prepare) {
  const node::Snapshot node =
      node::Build(paths, inventory, selection, names, nullptr, {.bind_on_prepare = bind_on_prepare});
  return GpusOf(node, inventory, pci_ids, driver, previous);
}

}  // namespace vfio_agent::dra
