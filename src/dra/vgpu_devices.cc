#include "vfio_gpu_agent/dra/vgpu_devices.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "vfio_gpu_agent/dra/device_names.h"
#include "vfio_gpu_agent/vgpu/health.h"

namespace vfio_agent::dra {
namespace {

using kube::DeviceAttribute;

// "nvidia.com/GRID_T4-1Q" -> "GRID_T4-1Q", the part a GPU's resourceName attribute carries too.
std::string NamePart(const std::string& resource_name) { return resource_name.substr(resource_name.find('/') + 1); }

// What both frameworks publish: the name, resourceName, vgpuType, the card's product name, the group, the taint.
VgpuDevice Common(const node::Device& vgpu, std::string name, std::string_view driver,
                  const names::PciIdsDatabase* pci_ids) {
  VgpuDevice out{.mdev = vgpu.kind == node::Kind::kMdev, .id = vgpu.id, .resource_name = vgpu.resource_name,
                 .iommu_group = vgpu.iommu_group, .vfio_cdevs = vgpu.vfio_cdevs};
  out.device.bdf = vgpu.bdf;
  out.device.unhealthy_reason = vgpu.unhealthy_reason;
  kube::SliceDevice& slice = out.device.slice;
  slice.name = std::move(name);
  slice.attributes[Qualified(driver, kResourceNameAttribute)] = DeviceAttribute::String(vgpu.name);
  slice.attributes[Qualified(driver, kVgpuTypeAttribute)] = DeviceAttribute::String(vgpu.vgpu_type);
  if (vgpu.card) {
    if (std::optional<std::string> product = ProductName(pci_ids, vgpu.card->vendor_id, vgpu.card->device_id)) {
      slice.attributes[Qualified(driver, kProductNameAttribute)] = DeviceAttribute::String(*product);
    }
    if (vgpu.card->numa_node) slice.attributes[std::string(kNumaNodeAttribute)] = DeviceAttribute::Int(*vgpu.card->numa_node);
  }
  if (vgpu.iommu_group) slice.attributes[Qualified(driver, kIommuGroupAttribute)] = DeviceAttribute::Int(*vgpu.iommu_group);
  if (!vgpu.pcie_root.empty()) slice.attributes[std::string(kPcieRootAttribute)] = DeviceAttribute::String(vgpu.pcie_root);
  if (!out.device.healthy()) slice.taints.push_back(UnhealthyTaint(driver));
  return out;
}

}  // namespace

VgpuDevices VgpusOf(const node::Snapshot& node, const vgpu::GoneReasons& gone, const names::PciIdsDatabase* pci_ids,
                    std::string_view domain, std::string_view driver, const std::vector<GpuDevice>& previous) {
  VgpuDevices out;
  out.problems = node.vgpu_problems;
  for (const node::Device& vgpu : node.devices) {
    if (vgpu.kind == node::Kind::kMdev) {
      VgpuDevice device = Common(vgpu, MdevDeviceName(vgpu.id), driver, pci_ids);
      device.device.slice.attributes[std::string(kMdevUuidAttribute)] = DeviceAttribute::String(vgpu.id);
      device.device.slice.attributes[Qualified(driver, kParentPciBusIdAttribute)] = DeviceAttribute::String(vgpu.bdf);
      out.vgpus.push_back(std::move(device));
    } else if (vgpu.kind == node::Kind::kSriovVgpu) {
      VgpuDevice device = Common(vgpu, VfDeviceName(vgpu.id), driver, pci_ids);
      device.device.slice.attributes[std::string(kPciBusIdAttribute)] = DeviceAttribute::String(vgpu.bdf);
      out.vgpus.push_back(std::move(device));
    }
  }

  // Gone since `previous`: kept unhealthy unless their resource now has vGPUs it did not have (recreated).
  std::set<std::string> before;
  for (const GpuDevice& device : previous) before.insert(device.slice.name);
  std::set<std::string> recreated;  // resourceName attributes
  std::set<std::string> now;
  const std::string resource_key = Qualified(driver, kResourceNameAttribute);
  for (const VgpuDevice& vgpu : out.vgpus) {
    now.insert(vgpu.device.slice.name);
    if (!before.contains(vgpu.device.slice.name)) recreated.insert(NamePart(vgpu.resource_name));
  }
  for (const GpuDevice& device : previous) {
    if (now.contains(device.slice.name)) continue;
    auto resource = device.slice.attributes.find(resource_key);
    if (resource != device.slice.attributes.end() && recreated.contains(resource->second.text)) continue;
    absl::StatusOr<VgpuId> id = VgpuOfDevice(device.slice.name);
    if (!id.ok()) continue;  // a whole GPU of a passthrough list: not this model's
    VgpuDevice kept{.mdev = id->mdev, .id = id->id, .device = device};
    if (resource != device.slice.attributes.end()) kept.resource_name = absl::StrCat(std::string(domain), "/", resource->second.text);
    kept.device.unhealthy_reason = id->mdev ? gone.OfMdev(id->id) : gone.OfVf(id->id);
    kept.device.slice.taints = {UnhealthyTaint(driver)};
    out.vgpus.push_back(std::move(kept));
  }
  std::sort(out.vgpus.begin(), out.vgpus.end(),
            [](const VgpuDevice& a, const VgpuDevice& b) { return a.device.slice.name < b.device.slice.name; });
  return out;
}

VgpuDevices BuildVgpuDevices(const HostPaths& paths, const pci::Inventory& inventory, const vgpu::Discovery& discovery,
                             const names::PciIdsDatabase* pci_ids, std::string_view domain, std::string_view driver,
                             const std::vector<GpuDevice>& previous) {
  const names::NameResolver names(nullptr, std::string(domain), {});
  const node::Snapshot node = node::Build(paths, inventory, pci::Selection{}, names, &discovery);
  return VgpusOf(node, vgpu::GoneReasons(paths.sysfs_root, inventory, discovery), pci_ids, domain, driver, previous);
}

}  // namespace vfio_agent::dra
