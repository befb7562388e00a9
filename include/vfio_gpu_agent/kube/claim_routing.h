// Which node's agent a ResourceClaim is for, as a label the cluster-level claim router writes and each agent selects
// on (resource.k8s.io/v1 ResourceClaims have no node field a field selector could use). The router labels every
// allocated claim whose results name our driver with the pool's node; an agent lists and watches
// `labelSelector=<kClaimNodeLabel>=<ClaimNodeLabelValue(its node)>`, so each claim event reaches one agent, not all.
// Shared by the router and the agent: both must compute the same value, so the rule lives only here.
#pragma once

#include <string>
#include <string_view>

namespace vfio_agent::kube {

inline constexpr std::string_view kClaimNodeLabel = "gpu.vfio-agent.cozystack.io/node";

// The label value for a node: the node's name when it is a non-empty valid label value (at most 63 characters,
// alphanumerics, '-', '_' and '.', starting and ending alphanumeric), else "h-" followed by the first 40 hex digits
// (lower case) of the SHA-256 of the name. Node names are DNS subdomains of up to 253 characters, so in practice only
// length sends a name to the hash. A short node literally named "h-<40 hex>" could meet a hashed long name only by a
// 160-bit hash collision.
std::string ClaimNodeLabelValue(std::string_view node);

// Whether `value` is a valid label value (k8s.io/apimachinery IsValidLabelValue).
bool IsValidLabelValue(std::string_view value);

// Lower-case hex SHA-256 of `data` (FIPS 180-4), 64 digits.
std::string Sha256Hex(std::string_view data);

}  // namespace vfio_agent::kube
