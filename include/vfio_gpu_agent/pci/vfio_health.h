// Whether a function can be handed to a VM right now: the health rule both kubelet frontends (the device plugin's
// ListAndWatch and the DRA driver's health stream and slice taints) apply to a GPU, read from sysfs and the dev
// root only.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "vfio_gpu_agent/common/host_paths.h"
#include "vfio_gpu_agent/pci/inventory.h"
#include "vfio_gpu_agent/pci/selection.h"

namespace vfio_agent::pci {

// Why `fn` cannot be handed to a VM now; "" when it can. Healthy = on a vfio driver, group node present under
// <dev_root>/vfio (or, on an iommufd host, all its cdevs under <dev_root>/vfio/devices), config space readable
// with a vendor other than 0xffff (not read while vfio-pci keeps it in D3cold), and the group (`group`, may be
// null) viable. Reasons read "driver nvidia", "no /dev/vfio/73", ...
std::string VfioUnhealthyReason(const HostPaths& paths, const Function& fn, const GroupAssessment* group,
                                bool iommufd);

// "" when <dev_root>/vfio/<group> exists, or, on an iommufd host, every one of `cdevs` under
// <dev_root>/vfio/devices (a cdev-only host still works through iommufd); else "no <group node path>".
std::string MissingVfioNode(const HostPaths& paths, int group, const std::vector<std::string>& cdevs, bool iommufd);

// The config-space probe used for health: NotFound/Unavailable when unreadable, or the vendor id
// (0xffff for a device that fell off the bus).
absl::StatusOr<uint16_t> ReadConfigVendor(const HostPaths& paths, const std::string& bdf);

}  // namespace vfio_agent::pci
