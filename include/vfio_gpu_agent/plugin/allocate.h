// Allocate and GetPreferredAllocation as pure functions of the requested ids and a device snapshot.
// The kubelet caches an Allocate response and replays it across restarts and reboots (R16), so the same
// ids must always give the same answer, and nothing is shared between container requests.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "vfio_gpu_agent/plugin/devices.h"

namespace vfio_agent::plugin {

struct DeviceNode {
  std::string container_path;
  std::string host_path;
  std::string permissions;  // "mrw", as the peer plugin
  bool operator==(const DeviceNode&) const = default;
};

struct ContainerAllocation {
  std::map<std::string, std::string> envs;
  std::vector<DeviceNode> devices;
  std::vector<std::string> cdi_devices;  // fully-qualified CDI names, only with CDI enabled
  bool operator==(const ContainerAllocation&) const = default;
};

struct AllocateConfig {
  pci::VfioNodeSet node_set = pci::VfioNodeSet::kLegacy;  // the node's (DeviceSnapshot::node_set)
  bool host_iommufd = false;  // <dev_root>/iommu exists (DeviceSnapshot::iommufd)
  bool cdi = false;           // also name one CDI device per id (see cdi.h)
};

// One container request. Device nodes are the host's /dev paths (the container sees the same paths; the
// dev root only redirects where the agent itself looks): per device in id order, the nodes of the resource's set
// (pci::VfioNodes: /dev/vfio/vfio, /dev/vfio/<group>, then the cdevs, as KubeVirt's PCI plugin lists them), each
// node once. FAILED_PRECONDITION when the set gives a requested device no nodes. Fails with INVALID_ARGUMENT naming malformed or
// unknown ids, with FAILED_PRECONDITION naming unhealthy ones, and with INVALID_ARGUMENT naming the missing
// members when it asks for some but not all NVSwitches of an IOMMU group (PluginDevice::group_peers).
absl::StatusOr<ContainerAllocation> AllocateContainer(const ResourceDevices& resource, const AllocateConfig& config,
                                                      const std::vector<std::string>& ids);

// GetPreferredAllocation for one container: exactly `size` ids from `available` (fewer only when there
// are not enough), every `must_include` id first; then one NUMA node, then whole IOMMU groups (not split
// with another request), then BDF order. The answer does not depend on the order of the inputs.
std::vector<std::string> PreferredAllocation(const ResourceDevices& resource, const std::vector<std::string>& available,
                                             const std::vector<std::string>& must_include, int size);

}  // namespace vfio_agent::plugin
