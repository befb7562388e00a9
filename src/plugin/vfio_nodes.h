// Internal to src/plugin: whether the VFIO device nodes a VM opens for one device are there, shared by the GPU
// and the vGPU device models.
#pragma once

#include <string>
#include <vector>

#include "vfio_gpu_agent/common/host_paths.h"

namespace vfio_agent::plugin::internal {

// "" when <dev_root>/vfio/<group> exists, or, on an iommufd host, every one of `cdevs` under
// <dev_root>/vfio/devices (a cdev-only host still works through iommufd); else "no <group node path>".
std::string MissingVfioNode(const HostPaths& paths, int group, const std::vector<std::string>& cdevs, bool iommufd);

}  // namespace vfio_agent::plugin::internal
