// A resource.k8s.io/v1 ResourceClaim object as the agent reads it: the reader's GET and the claim watch share it.
#pragma once

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "vfio_gpu_agent/kube/resource_claim_reader.h"

namespace vfio_agent::kube {

// DataLoss (no message prefix) when `object` is not a ResourceClaim.
absl::StatusOr<ResourceClaim> ParseResourceClaim(const nlohmann::json& object);

}  // namespace vfio_agent::kube
