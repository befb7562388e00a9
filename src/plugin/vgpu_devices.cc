#include "vfio_gpu_agent/plugin/vgpu_devices.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "vfio_gpu_agent/common/fs.h"
#include "vfio_gpu_agent/names/resource_names.h"
#include "vfio_gpu_agent/vgpu/health.h"
#include "vfio_gpu_agent/vgpu/served.h"

namespace vfio_agent::plugin {
namespace {

ResourceDevices& ResourceFor(DeviceSnapshot& snapshot, const std::string& resource_name, DeviceIdKind kind) {
  ResourceDevices& resource = snapshot.resources[resource_name];
  if (resource.resource_name.empty()) {
    resource.resource_name = resource_name;
    resource.id_kind = kind;
    resource.env_name = kind == DeviceIdKind::kMdevUuid ? names::KubevirtMdevEnvName(resource_name)
                                                        : names::KubevirtEnvName(resource_name);
  }
  return resource;
}

}  // namespace

VgpuSnapshot BuildVgpuSnapshot(const HostPaths& paths, const pci::Inventory& inventory,
                               const vgpu::Discovery& discovery, std::string_view domain,
                               const DeviceSnapshot& previous) {
  VgpuSnapshot out;
  DeviceSnapshot& snapshot = out.snapshot;
  snapshot.iommufd = fs::Exists(paths.dev_root / "iommu");
  vgpu::ServedVgpus served = vgpu::ServedVgpusOf(discovery, inventory, domain);
  out.problems = std::move(served.problems);
  for (const vgpu::ServedMdev& entry : served.mdevs) {
    const vgpu::Mdev& mdev = *entry.mdev;
    PluginDevice device;
    device.id = mdev.uuid;
    device.unhealthy_reason = vgpu::MdevUnhealthyReason(paths, mdev, entry.parent);
    device.healthy = device.unhealthy_reason.empty();
    device.numa_node = entry.parent != nullptr ? entry.parent->numa_node : std::nullopt;
    device.iommu_group = mdev.iommu_group;
    device.group_functions = {mdev.uuid};
    ResourceFor(snapshot, entry.resource_name, DeviceIdKind::kMdevUuid).devices.push_back(std::move(device));
  }
  for (const vgpu::ServedVf& entry : served.vfs) {
    const pci::Function& fn = *entry.vf;
    PluginDevice device;
    device.id = fn.bdf;
    device.unhealthy_reason = vgpu::VfUnhealthyReason(paths, fn, snapshot.iommufd);
    device.healthy = device.unhealthy_reason.empty();
    device.numa_node = entry.pf != nullptr ? entry.pf->numa_node : fn.numa_node;
    device.iommu_group = fn.iommu_group;
    device.group_functions = {fn.bdf};
    device.vfio_cdevs = fn.vfio_cdevs;
    ResourceFor(snapshot, entry.resource_name, DeviceIdKind::kPciAddress).devices.push_back(std::move(device));
  }

  auto by_id = [](const PluginDevice& a, const PluginDevice& b) { return a.id < b.id; };
  for (auto& [name, resource] : snapshot.resources) std::sort(resource.devices.begin(), resource.devices.end(), by_id);

  const vgpu::GoneReasons gone(paths.sysfs_root, inventory, discovery);
  std::map<std::string, std::vector<PluginDevice>> kept;  // by resource name
  for (const auto& entry : previous.resources) {
    const ResourceDevices& before = entry.second;
    auto now = snapshot.resources.find(entry.first);
    const ResourceDevices* current = now != snapshot.resources.end() ? &now->second : nullptr;
    if (current != nullptr && std::any_of(current->devices.begin(), current->devices.end(), [&](const PluginDevice& d) {
          return before.Find(d.id) == nullptr;
        })) {
      continue;  // recreated: the vGPUs that went are not coming back
    }
    for (const PluginDevice& device : before.devices) {
      if (current != nullptr && current->Find(device.id) != nullptr) continue;
      PluginDevice& gone_device = kept[entry.first].emplace_back(device);
      gone_device.healthy = false;
      gone_device.unhealthy_reason =
          before.id_kind == DeviceIdKind::kMdevUuid ? gone.OfMdev(device.id) : gone.OfVf(device.id);
    }
  }
  for (auto& [name, devices] : kept) {
    ResourceDevices& resource = ResourceFor(snapshot, name, previous.resources.at(name).id_kind);
    resource.devices.insert(resource.devices.end(), devices.begin(), devices.end());
    std::sort(resource.devices.begin(), resource.devices.end(), by_id);
  }
  return out;
}

}  // namespace vfio_agent::plugin
