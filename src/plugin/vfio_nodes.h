// Internal to src/plugin: whether the VFIO device nodes a VM opens for one device are there, shared by the GPU
// and the vGPU device models.
#pragma once

#include "vfio_gpu_agent/pci/vfio_health.h"

namespace vfio_agent::plugin::internal {

// The rule is pci::MissingVfioNode, which the DRA frontend applies too.
using pci::MissingVfioNode;

}  // namespace vfio_agent::plugin::internal
