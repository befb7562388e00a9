#include "vfio_gpu_agent/common/workload.h"

#include <string>

#include "absl/status/status.h"

namespace vfio_agent {

const char* WorkloadName(Workload workload) { return workload == Workload::kVmVgpu ? "vm-vgpu" : "vm-passthrough"; }

absl::StatusOr<Workload> ParseWorkload(std::string_view text) {
  if (text == "vm-passthrough") return Workload::kVmPassthrough;
  if (text == "vm-vgpu") return Workload::kVmVgpu;
  return absl::InvalidArgumentError("workload \"" + std::string(text) + "\": vm-passthrough or vm-vgpu");
}

}  // namespace vfio_agent
