// PROVISIONAL (claim-router branch): written against the API the binding-conditions branch announced; replaced
// by that branch's own header once it is committed.
#pragma once

#include <string>
#include <string_view>

namespace vfio_agent::kube {

// The label the claim router puts on an allocated ResourceClaim of our driver, naming the node of its pool.
inline constexpr char kClaimNodeLabel[] = "gpu.vfio-agent.cozystack.io/node";

// The node name when it is a valid label value, else "h-" + the first 40 hex digits of its SHA-256.
std::string ClaimNodeLabelValue(std::string_view node);

}  // namespace vfio_agent::kube
