// Which VFIO backend a DRA claim's devices get: the DeviceClass its request named. Each GPU model has two classes,
// "<model>.<driver>" (the legacy group, and the one with the model's extendedResourceName) and
// "<model>-iommufd.<driver>" (iommufd); `kubevirt-config --format dra` prints both and the chart renders both.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "vfio_gpu_agent/kube/resource_claim_reader.h"
#include "vfio_gpu_agent/pci/vfio_backend.h"

namespace vfio_agent::dra {

inline constexpr std::string_view kIommufdClassSuffix = "-iommufd";

// iommufd for a class named "<x>-iommufd.<driver>", legacy for any other (and for "", a request the reader could
// not match), since legacy is what every KubeVirt release opens.
pci::VfioBackend BackendOfDeviceClass(std::string_view device_class, std::string_view driver);

// The one backend of a claim's results of this driver; an error that names the classes when they disagree (one CDI
// spec never carries both kinds of node).
absl::StatusOr<pci::VfioBackend> ClaimBackend(const std::vector<const kube::AllocationResult*>& results,
                                              std::string_view driver, std::string_view claim);

}  // namespace vfio_agent::dra
