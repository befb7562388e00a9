#include "vfio_gpu_agent/plugin/devices.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "vfio_gpu_agent/common/fs.h"
#include "vfio_gpu_agent/pci/vfio_health.h"

namespace vfio_agent::plugin {
namespace {

// NVSwitches (selected only with --nvswitches) are a resource of their own, for VMs that take the whole board.
bool IsAdvertisedRole(pci::Role role) { return role == pci::Role::kGpu || role == pci::Role::kNvSwitch; }

}  // namespace

const PluginDevice* ResourceDevices::Find(std::string_view id) const {
  auto it = std::lower_bound(devices.begin(), devices.end(), id,
                             [](const PluginDevice& d, std::string_view v) { return d.id < v; });
  return it != devices.end() && it->id == id ? &*it : nullptr;
}

std::vector<std::pair<uint16_t, uint16_t>> AdvertisableIds(const pci::Inventory& inventory,
                                                           const pci::Selection& selection) {
  std::vector<std::pair<uint16_t, uint16_t>> ids;
  for (const std::string& bdf : selection.gpus) {
    if (!IsAdvertisedRole(selection.RoleOf(bdf))) continue;
    if (const pci::Function* fn = inventory.Find(bdf)) ids.emplace_back(fn->vendor_id, fn->device_id);
  }
  return ids;
}

DeviceSnapshot BuildSnapshot(const HostPaths& paths, const pci::Inventory& inventory,
                             const pci::Selection& selection, const names::NameResolver& names,
                             const std::set<std::string>& remembered) {
  DeviceSnapshot snapshot;
  snapshot.iommufd = fs::Exists(paths.dev_root / "iommu");

  std::vector<const pci::Function*> advertised;
  for (const std::string& bdf : selection.gpus) {
    if (!IsAdvertisedRole(selection.RoleOf(bdf))) continue;
    const pci::Function* fn = inventory.Find(bdf);
    if (fn == nullptr) continue;
    if (!pci::IsVfioDriver(fn->driver) && !remembered.contains(bdf)) continue;
    advertised.push_back(fn);
  }
  // Over every selected GPU, not only the advertised ones: names must not depend on which GPUs are on vfio.
  const std::map<uint32_t, names::ResolvedName> resolved = names.Resolve(AdvertisableIds(inventory, selection));
  if (advertised.empty()) return snapshot;

  for (const pci::Function* fn : advertised) {
    auto name = resolved.find(static_cast<uint32_t>(fn->vendor_id) << 16 | fn->device_id);
    if (name == resolved.end()) continue;  // the resolver answers every id it is given
    ResourceDevices& resource = snapshot.resources[name->second.resource_name];
    if (resource.resource_name.empty()) {
      resource.resource_name = name->second.resource_name;
      resource.env_name = names::KubevirtEnvName(resource.resource_name);
    }
    const pci::GroupAssessment* group = selection.GroupOf(*fn);
    PluginDevice device;
    device.id = fn->bdf;
    device.unhealthy_reason = pci::VfioUnhealthyReason(paths, *fn, group, snapshot.iommufd);
    device.healthy = device.unhealthy_reason.empty();
    device.numa_node = fn->numa_node;
    device.iommu_group = fn->iommu_group;
    const bool nvswitch = selection.RoleOf(fn->bdf) == pci::Role::kNvSwitch;
    if (group != nullptr) {
      for (const pci::Member& member : group->members) {
        if (IsAdvertisedRole(member.role) || member.role == pci::Role::kCompanion) {
          device.group_functions.push_back(member.bdf);
        }
        if (nvswitch && member.role == pci::Role::kNvSwitch && member.bdf != fn->bdf) {
          device.group_peers.push_back(member.bdf);
        }
      }
    }
    device.vfio_cdevs = fn->vfio_cdevs;
    std::sort(device.vfio_cdevs.begin(), device.vfio_cdevs.end());
    resource.devices.push_back(std::move(device));
  }
  for (auto& [name, resource] : snapshot.resources) {
    std::sort(resource.devices.begin(), resource.devices.end(),
              [](const PluginDevice& a, const PluginDevice& b) { return a.id < b.id; });
  }
  return snapshot;
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

}  // namespace vfio_agent::plugin
