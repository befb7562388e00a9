// Shared by the KubeVirt layer's passthrough checks (kubevirt_checks.cc) and its vGPU checks
// (vgpu_kubevirt_checks.cc).
#pragma once

#include <string>
#include <vector>

#include "kubevirt_cr.h"
#include "vfio_gpu_agent/validation/check.h"

namespace vfio_agent::validation::internal {

inline constexpr char kPciHostDevicesPath[] = "spec.configuration.permittedHostDevices.pciHostDevices";

// "kubevirt <namespace>/<name>", the evidence's source prefix.
std::string CrName(const KubevirtCr& cr);

// kubevirt.feature_gate for HostDevices (fail without it) and GPU (warn without it).
void CheckFeatureGates(const KubevirtCr& cr, std::vector<Check>* out);

}  // namespace vfio_agent::validation::internal
