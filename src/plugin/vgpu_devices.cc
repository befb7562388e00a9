#include "vfio_gpu_agent/plugin/vgpu_devices.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "vfio_gpu_agent/names/resource_names.h"
#include "vfio_gpu_agent/vgpu/health.h"

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

VgpuSnapshot VgpusOf(const node::Snapshot& node, const vgpu::GoneReasons& gone, const DeviceSnapshot& previous) {
  VgpuSnapshot out;
  out.problems = node.vgpu_problems;
  DeviceSnapshot& snapshot = out.snapshot;
  snapshot.iommufd = node.iommufd;
  for (const node::Device& vgpu : node.devices) {
    if (!node::IsVgpu(vgpu.kind)) continue;
    const DeviceIdKind kind = vgpu.kind == node::Kind::kMdev ? DeviceIdKind::kMdevUuid : DeviceIdKind::kPciAddress;
    ResourceFor(snapshot, vgpu.resource_name, kind)
        .devices.push_back({.id = vgpu.id,
                            .healthy = vgpu.healthy(),
                            .unhealthy_reason = vgpu.unhealthy_reason,
                            .numa_node = vgpu.numa_node,
                            .iommu_group = vgpu.iommu_group,
                            .group_functions = vgpu.group_functions,
                            .vfio_cdevs = vgpu.vfio_cdevs});
  }

  auto by_id = [](const PluginDevice& a, const PluginDevice& b) { return a.id < b.id; };
  for (auto& [name, resource] : snapshot.resources) std::sort(resource.devices.begin(), resource.devices.end(), by_id);

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

VgpuSnapshot BuildVgpuSnapshot(const HostPaths& paths, const pci::Inventory& inventory,
                               const vgpu::Discovery& discovery, std::string_view domain,
                               const DeviceSnapshot& previous) {
  const names::NameResolver names(nullptr, std::string(domain), {});
  const node::Snapshot node = node::Build(paths, inventory, pci::Selection{}, names, &discovery);
  return VgpusOf(node, vgpu::GoneReasons(paths.sysfs_root, inventory, discovery), previous);
}

}  // namespace vfio_agent::plugin
