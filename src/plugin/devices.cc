#include "vfio_gpu_agent/plugin/devices.h"

#include "absl/strings/str_cat.h"
#include "vfio_gpu_agent/common/fs.h"

#include <algorithm>

#include "vfio_gpu_agent/pci/vfio_health.h"

namespace vfio_agent::plugin {

const PluginDevice* ResourceDevices::Find(std::string_view id) const {
  auto it = std::lower_bound(devices.begin(), devices.end(), id,
                             [](const PluginDevice& d, std::string_view v) { return d.id < v; });
  return it != devices.end() && it->id == id ? &*it : nullptr;
}

DeviceSnapshot WholeDevicesOf(const node::Snapshot& node, const std::set<std::string>& remembered) {
  DeviceSnapshot snapshot;
  snapshot.iommufd = node.iommufd;
  for (const node::Device& device : node.devices) {
    if (node::IsVgpu(device.kind)) continue;
    if (!pci::IsVfioDriver(device.driver) && !remembered.contains(device.id)) continue;
    ResourceDevices& resource = snapshot.resources[device.resource_name];
    if (resource.resource_name.empty()) {
      resource.resource_name = device.resource_name;
      resource.env_name = names::KubevirtEnvName(resource.resource_name);
    }
    resource.devices.push_back({.id = device.id,
                                .healthy = device.healthy(),
                                .unhealthy_reason = device.unhealthy_reason,
                                .numa_node = device.numa_node,
                                .iommu_group = device.iommu_group,
                                .group_functions = device.group_functions,
                                .group_peers = device.group_peers,
                                .vfio_cdevs = device.vfio_cdevs});
  }
  for (auto& [name, resource] : snapshot.resources) {
    std::sort(resource.devices.begin(), resource.devices.end(),
              [](const PluginDevice& a, const PluginDevice& b) { return a.id < b.id; });
  }
  return snapshot;
}

DeviceSnapshot BuildSnapshot(const HostPaths& paths, const pci::Inventory& inventory,
                             const pci::Selection& selection, const names::NameResolver& names,
                             const std::set<std::string>& remembered) {
  return WholeDevicesOf(node::Build(paths, inventory, selection, names, nullptr), remembered);
}

std::set<std::string> AdvertisedIds(const DeviceSnapshot& snapshot) {
  std::set<std::string> ids;
  for (const auto& [name, resource] : snapshot.resources) {
    for (const PluginDevice& device : resource.devices) ids.insert(device.id);
  }
  return ids;
}

void MarkUnusable(DeviceSnapshot& snapshot, const std::function<std::string(const std::string& id)>& unusable) {
  for (auto& [name, resource] : snapshot.resources) {
    for (PluginDevice& device : resource.devices) {
      if (!device.healthy) continue;
      std::string reason = unusable(device.id);
      if (reason.empty()) continue;
      device.healthy = false;
      device.unhealthy_reason = std::move(reason);
    }
  }
}

void ApplyNodeSet(DeviceSnapshot& snapshot, pci::VfioNodeSet set, const std::filesystem::path& dev_root) {
  snapshot.node_set = set;
  for (auto& [name, resource] : snapshot.resources) {
    const pci::VfioNodeSet mine = resource.NodeSetFor(set);
    const std::string what = absl::StrCat("VFIO nodes ", std::string(pci::VfioNodeSetName(mine)));
    for (PluginDevice& device : resource.devices) {
      if (!device.healthy) continue;
      absl::StatusOr<std::vector<std::string>> nodes =
          pci::VfioNodes(mine, device.vfio_cdevs, device.iommu_group, snapshot.iommufd, what);
      if (!nodes.ok()) {
        device.healthy = false;
        device.unhealthy_reason = std::string(nodes.status().message());
      } else if (mine != pci::VfioNodeSet::kIommufd && snapshot.iommufd && device.iommu_group &&
                 !fs::Exists(dev_root / "vfio" / std::to_string(*device.iommu_group))) {
        device.healthy = false;
        device.unhealthy_reason = absl::StrCat("no /dev/vfio/", *device.iommu_group, " for the ", std::string(pci::VfioNodeSetName(mine)),
                                               " VFIO nodes (an iommufd-only host: --vfio-backend iommufd)");
      }
    }
  }
}

}  // namespace vfio_agent::plugin
