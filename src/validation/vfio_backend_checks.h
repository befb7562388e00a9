// kubevirt.vfio_backend: which VFIO backend this node offers its GPUs through (the legacy group nodes, iommufd's
// /dev/iommu and cdevs) and whether the KubeVirt the CR describes opens what it needs. iommufd needs KubeVirt >= 1.9
// with its IOMMUFD feature gate (alpha, reference dra.md section 6); every release opens the legacy nodes.
#pragma once

#include <optional>
#include <string_view>
#include <utility>

#include "kubevirt_cr.h"
#include "vfio_gpu_agent/kube/kubevirt_release.h"
#include "vfio_gpu_agent/validation/check.h"

namespace vfio_agent::validation {

// Whether KubeVirt hands a VM iommufd: >= 1.9 and the IOMMUFD gate on.
bool KubevirtEnablesIommufd(const KubevirtCr& cr);
Check VfioBackendCheck(const NodeView& node, const KubevirtCr& cr);

}  // namespace vfio_agent::validation
