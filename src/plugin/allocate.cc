#include "vfio_gpu_agent/plugin/allocate.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "vfio_gpu_agent/pci/inventory.h"
#include "vfio_gpu_agent/plugin/cdi.h"
#include "vfio_gpu_agent/vgpu/discovery.h"
#include "vfio_gpu_agent/pci/vfio_backend.h"

namespace vfio_agent::plugin {
namespace {

constexpr char kPermissions[] = "mrw";

void AddNode(ContainerAllocation& out, std::set<std::string>& seen, const std::string& path) {
  if (seen.insert(path).second) out.devices.push_back({path, path, kPermissions});
}

// A VM given part of an NVSwitch group would open /dev/vfio/<group> (so no other VM can have the rest) and its
// Fabric Manager would still miss switches: NVLink never comes up. Such a request is refused, naming what it lacks.
absl::Status CheckWholeGroups(const ResourceDevices& resource, const std::set<std::string>& requested) {
  struct Shortfall {
    std::set<std::string> asked, missing;
  };
  std::map<int, Shortfall> by_group;  // group_peers is non-empty only for a device with a group
  for (const std::string& id : requested) {
    const PluginDevice& device = *resource.Find(id);
    for (const std::string& peer : device.group_peers) {
      if (requested.contains(peer)) continue;
      Shortfall& shortfall = by_group[*device.iommu_group];
      shortfall.asked.insert(id);
      shortfall.missing.insert(peer);
    }
  }
  if (by_group.empty()) return absl::OkStatus();
  std::vector<std::string> parts;
  for (const auto& [group, shortfall] : by_group) {
    parts.push_back(absl::StrCat("IOMMU group ", group, " (/dev/vfio/", group, "): ",
                                 absl::StrJoin(shortfall.asked, ", "), " requested without ",
                                 absl::StrJoin(shortfall.missing, ", ")));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("incomplete NVSwitch group for ", resource.resource_name, ": ", absl::StrJoin(parts, "; "),
                   "; a VM takes every NVSwitch of a group or none (its Fabric Manager needs all of them)"));
}

}  // namespace

absl::StatusOr<ContainerAllocation> AllocateContainer(const ResourceDevices& resource, const AllocateConfig& config,
                                                      const std::vector<std::string>& ids) {
  std::vector<std::string> malformed, unknown, unhealthy;
  std::set<std::string> requested;
  const bool mdev = resource.id_kind == DeviceIdKind::kMdevUuid;
  for (const std::string& id : ids) {
    if (mdev ? !vgpu::IsMdevUuid(id) : !pci::CanonicalBdf(id).ok()) {
      malformed.push_back(absl::StrCat("\"", id, "\""));
      continue;
    }
    const PluginDevice* device = resource.Find(id);
    if (device == nullptr) {
      unknown.push_back(id);
    } else if (!device->healthy) {
      unhealthy.push_back(absl::StrCat(id, " (", device->unhealthy_reason, ")"));
    }
    requested.insert(id);
  }
  if (!malformed.empty() || !unknown.empty()) {
    std::vector<std::string> parts;
    if (!malformed.empty()) parts.push_back(absl::StrCat("malformed device ids: ", absl::StrJoin(malformed, ", ")));
    if (!unknown.empty()) {
      parts.push_back(absl::StrCat("unknown devices for ", resource.resource_name, ": ", absl::StrJoin(unknown, ", ")));
    }
    return absl::InvalidArgumentError(absl::StrJoin(parts, "; "));
  }
  if (!unhealthy.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("unhealthy devices for ", resource.resource_name, ": ", absl::StrJoin(unhealthy, ", ")));
  }
  if (absl::Status whole = CheckWholeGroups(resource, requested); !whole.ok()) return whole;

  ContainerAllocation out;
  if (requested.empty()) return out;
  // KubeVirt hands the addresses to the VM's GPU slots in list order; sorting keeps that mapping stable
  // whatever order the kubelet sends.
  out.envs[resource.env_name] = absl::StrJoin(requested, ",");
  // Per device, in the peer plugin's order (pci::VfioNodes). An mdev gets its own group node only, as
  // KubeVirt's in-tree mdev plugin hands out (never the whole /dev/vfio).
  const pci::VfioNodeSet set = resource.NodeSetFor(config.node_set);
  std::set<std::string> seen;
  for (const std::string& id : requested) {
    const PluginDevice& device = *resource.Find(id);
    absl::StatusOr<std::vector<std::string>> nodes =
        pci::VfioNodes(set, device.vfio_cdevs, device.iommu_group, config.host_iommufd,
                       absl::StrCat(resource.resource_name, " ", id));
    if (!nodes.ok()) return nodes.status();
    for (const std::string& node : *nodes) AddNode(out, seen, node);
    if (config.cdi) out.cdi_devices.push_back(CdiDeviceName(resource.resource_name, id));
  }
  return out;
}

}  // namespace vfio_agent::plugin
