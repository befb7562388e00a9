// Shared by the claim router's tests: claims as the scheduler allocates them, and reads of what the fake API
// server stores.
#pragma once

#include <optional>
#include <string>

#include "gtest/gtest.h"
#include "kube_api_sim.h"
#include "nlohmann/json.hpp"
#include "vfio_gpu_agent/kube/claim_routing.h"

namespace vfio_agent::router::testing {

inline constexpr char kDriver[] = "gpu.vfio-agent.cozystack.io";
inline constexpr char kNamespace[] = "vms";

// status.allocation as kube-scheduler writes it: one result per device, the pool named after the node.
inline nlohmann::json Allocation(const std::string& driver, const std::string& pool, int devices = 1) {
  nlohmann::json results = nlohmann::json::array();
  for (int i = 0; i < devices; ++i) {
    results.push_back({{"request", "gpu"}, {"driver", driver}, {"pool", pool}, {"device", "gpu-" + std::to_string(i)}});
  }
  return {{"allocation", {{"devices", {{"results", results}}},
                          {"nodeSelector", {{"nodeSelectorTerms", {{{"matchFields", {{{"key", "metadata.name"},
                                                                                       {"operator", "In"},
                                                                                       {"values", {pool}}}}}}}}}}}}};
}

inline nlohmann::json Claim(const std::string& name, const nlohmann::json& status = nlohmann::json::object()) {
  return {{"apiVersion", "resource.k8s.io/v1"},
          {"kind", "ResourceClaim"},
          {"metadata", {{"namespace", kNamespace}, {"name", name}}},
          {"spec", {{"devices", {{"requests", {{{"name", "gpu"}, {"exactly", {{"deviceClassName", "gpu-h200"}}}}}}}}}},
          {"status", status}};
}

// The claim's node label as the fake API server stores it; nullopt without one (or without the claim).
inline std::optional<std::string> NodeLabel(sim::KubeApiSim& api, const std::string& name) {
  absl::StatusOr<std::string> reply = api.Control("get-claim " + std::string(kNamespace) + " " + name);
  if (!reply.ok()) return std::nullopt;
  const nlohmann::json claim = nlohmann::json::parse(*reply, nullptr, false);
  const std::string key(kube::kClaimNodeLabel);
  if (!claim.is_object() || !claim["metadata"].contains("labels") || !claim["metadata"]["labels"].contains(key)) {
    return std::nullopt;
  }
  return claim["metadata"]["labels"][key].get<std::string>();
}

inline std::string LeaseHolder(sim::KubeApiSim& api, const std::string& lease_namespace, const std::string& name) {
  absl::StatusOr<std::string> reply = api.Control("get-lease " + lease_namespace + " " + name);
  if (!reply.ok()) return "";
  const nlohmann::json lease = nlohmann::json::parse(*reply, nullptr, false);
  return lease.is_object() ? lease["spec"].value("holderIdentity", "") : "";
}

inline void PutClaim(sim::KubeApiSim& api, const nlohmann::json& claim) {
  ASSERT_TRUE(api.Control("claim " + claim.dump()).ok());
}

// The scheduler allocating (or, with an empty object, deallocating) a stored claim.
inline void SetStatus(sim::KubeApiSim& api, const std::string& name, const nlohmann::json& status) {
  ASSERT_TRUE(api.Control("claim-status " + std::string(kNamespace) + " " + name + " " + status.dump()).ok());
}

}  // namespace vfio_agent::router::testing
