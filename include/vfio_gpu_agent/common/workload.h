// The node's workload mode, as the GPU Operator's label nvidia.com/gpu.workload.config names it. It decides what
// the agent advertises (whole GPUs on vfio-pci, or vGPUs) and whether it binds anything at all.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"

namespace vfio_agent {

enum class Workload {
  kVmPassthrough,  // "vm-passthrough": whole GPUs bound to vfio-pci
  kVmVgpu,         // "vm-vgpu": mdev or SR-IOV vGPUs; GPUs stay on nvidia (the vGPU manager), nothing is bound
};

const char* WorkloadName(Workload workload);
// "vm-passthrough" or "vm-vgpu"; anything else is InvalidArgument naming the text and both values.
absl::StatusOr<Workload> ParseWorkload(std::string_view text);

}  // namespace vfio_agent
