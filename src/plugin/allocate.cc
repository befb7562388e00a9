#include "vfio_gpu_agent/plugin/allocate.h"

#include <algorithm>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "vfio_gpu_agent/pci/inventory.h"
#include "vfio_gpu_agent/plugin/cdi.h"

namespace vfio_agent::plugin {
namespace {

constexpr char kPermissions[] = "mrw";

void AddNode(ContainerAllocation& out, std::set<std::string>& seen, const std::string& path) {
  if (seen.insert(path).second) out.devices.push_back({path, path, kPermissions});
}

}  // namespace

absl::StatusOr<ContainerAllocation> AllocateContainer(const ResourceDevices& resource, const AllocateConfig& config,
                                                      const std::vector<std::string>& ids) {
  std::vector<std::string> malformed, unknown, unhealthy;
  std::set<std::string> requested;
  for (const std::string& id : ids) {
    if (!pci::CanonicalBdf(id).ok()) {
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

  ContainerAllocation out;
  if (requested.empty()) return out;
  // KubeVirt hands the addresses to the VM's GPU slots in list order; sorting keeps that mapping stable
  // whatever order the kubelet sends.
  out.envs[resource.env_name] = absl::StrJoin(requested, ",");
  // Same order as the peer plugin per device: [cdevs], /dev/vfio/vfio, /dev/vfio/<group>, [/dev/iommu].
  std::set<std::string> seen;
  for (const std::string& id : requested) {
    const PluginDevice& device = *resource.Find(id);
    if (config.iommufd) {
      for (const std::string& cdev : device.vfio_cdevs) AddNode(out, seen, "/dev/vfio/devices/" + cdev);
    }
    AddNode(out, seen, "/dev/vfio/vfio");
    if (device.iommu_group) AddNode(out, seen, absl::StrCat("/dev/vfio/", *device.iommu_group));
    if (config.iommufd) AddNode(out, seen, "/dev/iommu");
    if (config.cdi) out.cdi_devices.push_back(CdiDeviceName(resource.resource_name, id));
  }
  return out;
}

}  // namespace vfio_agent::plugin
