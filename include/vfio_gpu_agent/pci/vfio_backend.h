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

// The nodes of one device under `backend`, paths inside the container. iommufd needs the host's /dev/iommu and
// the device's cdevs (vfio-pci of kernel >= 6.2 with VFIO_DEVICE_CDEV); legacy needs its IOMMU group. `what` names the
// device in the error.
absl::StatusOr<std::vector<std::string>> VfioBackendNodes(VfioBackend backend, const std::vector<std::string>& cdevs,
                                                          std::optional<int> iommu_group, bool host_iommufd,
                                                          std::string_view what);

}  // namespace vfio_agent::pci
