#include "vfio_gpu_agent/dra/vgpu_devices.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "vfio_gpu_agent/common/fs.h"
#include "vfio_gpu_agent/dra/device_names.h"
#include "vfio_gpu_agent/vgpu/health.h"
#include "vfio_gpu_agent/vgpu/served.h"

namespace vfio_agent::dra {
namespace {

using kube::DeviceAttribute;

// "nvidia.com/GRID_T4-1Q" -> "GRID_T4-1Q", the part a GPU's resourceName attribute carries too.
std::string NamePart(const std::string& resource_name) { return resource_name.substr(resource_name.find('/') + 1); }

// What both frameworks publish: the name, resourceName, vgpuType, the card's product name, the group, the taint.
VgpuDevice Common(std::string name, std::string_view driver, const std::string& resource_name,
                  const pci::Function* card, const names::PciIdsDatabase* pci_ids, const std::string& type_name,
                  std::optional<int> group, std::string unhealthy_reason) {
  VgpuDevice vgpu{.resource_name = resource_name, .iommu_group = group};
  vgpu.device.unhealthy_reason = std::move(unhealthy_reason);
  kube::SliceDevice& slice = vgpu.device.slice;
  slice.name = std::move(name);
  slice.attributes[Qualified(driver, kResourceNameAttribute)] = DeviceAttribute::String(NamePart(resource_name));
  slice.attributes[Qualified(driver, kVgpuTypeAttribute)] = DeviceAttribute::String(type_name);
  if (card != nullptr) {
    if (std::optional<std::string> product = ProductName(pci_ids, card->vendor_id, card->device_id)) {
      slice.attributes[Qualified(driver, kProductNameAttribute)] = DeviceAttribute::String(*product);
    }
    if (card->numa_node) slice.attributes[std::string(kNumaNodeAttribute)] = DeviceAttribute::Int(*card->numa_node);
  }
  if (group) slice.attributes[Qualified(driver, kIommuGroupAttribute)] = DeviceAttribute::Int(*group);
  if (!vgpu.device.healthy()) slice.taints.push_back(UnhealthyTaint(driver));
  return vgpu;
}

void AddPcieRoot(const HostPaths& paths, const std::string& bdf, kube::SliceDevice& slice) {
  if (std::string root = PcieRoot(paths, bdf); !root.empty()) {
    slice.attributes[std::string(kPcieRootAttribute)] = DeviceAttribute::String(root);
  }
}

}  // namespace

VgpuDevices BuildVgpuDevices(const HostPaths& paths, const pci::Inventory& inventory, const vgpu::Discovery& discovery,
                             const names::PciIdsDatabase* pci_ids, std::string_view domain, std::string_view driver,
                             const std::vector<GpuDevice>& previous) {
  VgpuDevices out;
  vgpu::ServedVgpus served = vgpu::ServedVgpusOf(discovery, inventory, domain);
  out.problems = std::move(served.problems);
  const bool iommufd = fs::Exists(paths.dev_root / "iommu");
  for (const vgpu::ServedMdev& entry : served.mdevs) {
    const vgpu::Mdev& mdev = *entry.mdev;
    // An Ampere mdev lives on a VF: the card (product name, NUMA node) is its PF.
    const pci::Function* card = entry.parent;
    if (card != nullptr && card->physfn) {
      if (const pci::Function* pf = inventory.Find(*card->physfn)) card = pf;
    }
    VgpuDevice vgpu = Common(MdevDeviceName(mdev.uuid), driver, entry.resource_name, card, pci_ids, mdev.type_name,
                             mdev.iommu_group, vgpu::MdevUnhealthyReason(paths, mdev, entry.parent));
    vgpu.mdev = true;
    vgpu.id = mdev.uuid;
    vgpu.device.bdf = mdev.parent_bdf;
    kube::SliceDevice& slice = vgpu.device.slice;
    slice.attributes[std::string(kMdevUuidAttribute)] = DeviceAttribute::String(mdev.uuid);
    slice.attributes[Qualified(driver, kParentPciBusIdAttribute)] = DeviceAttribute::String(mdev.parent_bdf);
    AddPcieRoot(paths, mdev.parent_bdf, slice);
    out.vgpus.push_back(std::move(vgpu));
  }
  for (const vgpu::ServedVf& entry : served.vfs) {
    const pci::Function& fn = *entry.vf;
    VgpuDevice vgpu = Common(VfDeviceName(fn.bdf), driver, entry.resource_name, entry.pf != nullptr ? entry.pf : &fn,
                             pci_ids, entry.vgpu->type_name, fn.iommu_group, vgpu::VfUnhealthyReason(paths, fn, iommufd));
    vgpu.id = fn.bdf;
    vgpu.vfio_cdevs = fn.vfio_cdevs;
    vgpu.device.bdf = fn.bdf;
    kube::SliceDevice& slice = vgpu.device.slice;
    slice.attributes[std::string(kPciBusIdAttribute)] = DeviceAttribute::String(fn.bdf);
    AddPcieRoot(paths, fn.bdf, slice);
    out.vgpus.push_back(std::move(vgpu));
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
  const vgpu::GoneReasons gone(paths.sysfs_root, inventory, discovery);
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

}  // namespace vfio_agent::dra
