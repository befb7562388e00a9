// The VFIO backend a VM's device nodes are for: the legacy container/group API (/dev/vfio/vfio and the group's
// /dev/vfio/<group>) or iommufd (the device's cdev under /dev/vfio/devices and /dev/iommu). One claim or one
// allocation gets the nodes of one backend only: Kata refuses a CDI spec that carries both (dra-driver-nvidia-gpu
// #1036), AMD's ROCm DRA driver forbids mixing them, and KubeVirt >= 1.9 opens iommufd only when asked.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace vfio_agent::pci {

enum class VfioBackend { kLegacy, kIommufd };

std::string_view VfioBackendName(VfioBackend backend);  // "legacy", "iommufd"
std::optional<VfioBackend> ParseVfioBackend(std::string_view name);

// Which nodes of a device a VM is handed, once the choice is resolved (a DRA claim's DeviceClass, the device
// plugin's --vfio-backend):
//   kLegacy          /dev/vfio/vfio, /dev/vfio/<group>: KubeVirt's PCI device plugin before v1.9 and its mdev plugin
//   kLegacyAndCdevs  the same, then the device's /dev/vfio/devices/vfioN: KubeVirt's PCI plugin from v1.9 on, which
//                    adds whatever cdevs sysfs lists and never /dev/iommu (its own iommufd plugin serves that); a
//                    launcher that opens the group leaves the cdev unopened
//   kIommufd         the cdevs, then /dev/iommu, no group node
enum class VfioNodeSet { kLegacy, kLegacyAndCdevs, kIommufd };

std::string_view VfioNodeSetName(VfioNodeSet set);  // "legacy", "legacy+cdevs", "iommufd"
inline VfioNodeSet NodeSetOf(VfioBackend backend) {
  return backend == VfioBackend::kIommufd ? VfioNodeSet::kIommufd : VfioNodeSet::kLegacy;
}

// The nodes of one device under `set`, paths inside the container, in KubeVirt's order. The legacy sets need an
// IOMMU group; iommufd needs the host's /dev/iommu (`host_iommufd`) and the device's cdevs (vfio-pci of kernel
// >= 6.2 with VFIO_DEVICE_CDEV). `what` names the device in the error. The one rule for both kubelet frontends.
absl::StatusOr<std::vector<std::string>> VfioNodes(VfioNodeSet set, const std::vector<std::string>& cdevs,
                                                   std::optional<int> iommu_group, bool host_iommufd,
                                                   std::string_view what);
inline absl::StatusOr<std::vector<std::string>> VfioBackendNodes(VfioBackend backend,
                                                                 const std::vector<std::string>& cdevs,
                                                                 std::optional<int> iommu_group, bool host_iommufd,
                                                                 std::string_view what) {
  return VfioNodes(NodeSetOf(backend), cdevs, iommu_group, host_iommufd, what);
}

}  // namespace vfio_agent::pci
