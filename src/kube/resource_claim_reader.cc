#include "vfio_gpu_agent/kube/resource_claim_reader.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "api_client.h"
#include "claim_json.h"
#include "config.h"
#include "nlohmann/json.hpp"

namespace vfio_agent::kube {
namespace {

using Json = nlohmann::json;

std::string StringAt(const Json& object, const char* key) {
  return object.is_object() && object.contains(key) && object[key].is_string() ? object[key].get<std::string>() : "";
}

// Namespaces and names are DNS labels/subdomains; anything else would be a path injection into the URL.
bool IsObjectName(const std::string& name) {
  if (name.empty() || name.size() > 253) return false;
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.')) return false;
  }
  return true;
}

std::vector<std::string> Strings(const Json& object, const char* key) {
  std::vector<std::string> out;
  if (!object.is_object() || !object.contains(key) || !object[key].is_array()) return out;
  for (const Json& value : object[key]) {
    if (value.is_string()) out.push_back(value.get<std::string>());
  }
  return out;
}

}  // namespace

ResourceClaimReader::ResourceClaimReader(std::unique_ptr<ApiClient> client) : client_(std::move(client)) {}
ResourceClaimReader::~ResourceClaimReader() = default;
uint64_t ResourceClaimReader::requests() const { return client_->requests(); }

absl::StatusOr<ResourceClaim> ResourceClaimReader::Get(const std::string& namespace_name, const std::string& name,
                                                       std::chrono::milliseconds timeout) {
  if (!IsObjectName(namespace_name) || !IsObjectName(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ResourceClaim \"", namespace_name, "/", name, "\": not a valid namespace and name"));
  }
  const std::string path = absl::StrCat("/apis/resource.k8s.io/v1/namespaces/", namespace_name, "/resourceclaims/", name);
  absl::StatusOr<ApiResponse> response = GetOk(*client_, path, timeout);
  if (!response.ok()) return response.status();
  const std::string where = absl::StrCat("GET ", client_->Url(path), ": ", response->code, " ");
  const Json object = Json::parse(response->body, nullptr, /*allow_exceptions=*/false);
  absl::StatusOr<ResourceClaim> claim = ParseResourceClaim(object);
  if (!claim.ok()) return absl::DataLossError(absl::StrCat(where, claim.status().message()));
  return claim;
}

absl::StatusOr<ResourceClaim> ParseResourceClaim(const nlohmann::json& object) {
  if (!object.is_object() || StringAt(object, "kind") != "ResourceClaim" || !object.contains("metadata")) {
    return absl::DataLossError("the answer is not a ResourceClaim");
  }
  const Json& metadata = object["metadata"];
  ResourceClaim claim;
  claim.namespace_name = StringAt(metadata, "namespace");
  claim.name = StringAt(metadata, "name");
  claim.uid = StringAt(metadata, "uid");
  claim.resource_version = StringAt(metadata, "resourceVersion");
  claim.deleting = metadata.contains("deletionTimestamp") && !metadata["deletionTimestamp"].is_null();
  if (metadata.contains("generation") && metadata["generation"].is_number_integer()) {
    claim.generation = metadata["generation"].get<int64_t>();
  }
  if (metadata.contains("annotations") && metadata["annotations"].is_object()) {
    for (const auto& [key, value] : metadata["annotations"].items()) {
      if (value.is_string()) claim.annotations[key] = value.get<std::string>();
    }
  }
  // Request name ("req", or "req/sub" for a firstAvailable choice) -> its DeviceClass, to name each result's.
  std::map<std::string, std::string> classes;
  if (object.contains("spec") && object["spec"].is_object() && object["spec"].contains("devices") &&
      object["spec"]["devices"].is_object() && object["spec"]["devices"].contains("requests") &&
      object["spec"]["devices"]["requests"].is_array()) {
    for (const Json& request : object["spec"]["devices"]["requests"]) {
      const std::string request_name = StringAt(request, "name");
      if (request.contains("exactly")) classes[request_name] = StringAt(request["exactly"], "deviceClassName");
      if (request.contains("firstAvailable") && request["firstAvailable"].is_array()) {
        for (const Json& sub : request["firstAvailable"]) {
          classes[absl::StrCat(request_name, "/", StringAt(sub, "name"))] = StringAt(sub, "deviceClassName");
        }
      }
    }
  }
  const Json* allocation = nullptr;
  if (object.contains("status") && object["status"].is_object() && object["status"].contains("allocation") &&
      object["status"]["allocation"].is_object()) {
    allocation = &object["status"]["allocation"];
  }
  claim.allocated = allocation != nullptr;
  if (allocation != nullptr && allocation->contains("devices") && (*allocation)["devices"].contains("results") &&
      (*allocation)["devices"]["results"].is_array()) {
    for (const Json& result : (*allocation)["devices"]["results"]) {
      claim.results.push_back({.request = StringAt(result, "request"),
                               .driver = StringAt(result, "driver"),
                               .pool = StringAt(result, "pool"),
                               .device = StringAt(result, "device"),
                               .binding_conditions = Strings(result, "bindingConditions"),
                               .binding_failure_conditions = Strings(result, "bindingFailureConditions")});
      if (auto it = classes.find(claim.results.back().request); it != classes.end()) {
        claim.results.back().device_class = it->second;
      }
    }
  }
  if (object.contains("status") && object["status"].is_object() && object["status"].contains("reservedFor") &&
      object["status"]["reservedFor"].is_array()) {
    for (const Json& consumer : object["status"]["reservedFor"]) {
      if (const std::string uid = StringAt(consumer, "uid"); !uid.empty()) claim.reserved_for.push_back(uid);
    }
  }
  if (object.contains("status") && object["status"].is_object() && object["status"].contains("devices") &&
      object["status"]["devices"].is_array()) {
    for (const Json& entry : object["status"]["devices"]) {
      DeviceStatus status{.driver = StringAt(entry, "driver"), .pool = StringAt(entry, "pool"),
                          .device = StringAt(entry, "device")};
      if (entry.contains("conditions") && entry["conditions"].is_array()) {
        for (const Json& condition : entry["conditions"]) {
          status.conditions.push_back({.type = StringAt(condition, "type"),
                                       .status = StringAt(condition, "status"),
                                       .reason = StringAt(condition, "reason"),
                                       .message = StringAt(condition, "message"),
                                       .last_transition_time = StringAt(condition, "lastTransitionTime"),
                                       .observed_generation = condition.value("observedGeneration", int64_t{0})});
        }
      }
      claim.device_statuses.push_back(std::move(status));
    }
  }
  return claim;
}


absl::StatusOr<std::unique_ptr<ResourceClaimReader>> ConnectResourceClaimReader(const ClaimReaderOptions& options) {
  absl::StatusOr<ClusterConfig> config = LoadClusterConfig(options.kubeconfig, options.service_account_dir);
  if (!config.ok()) return config.status();
  return std::make_unique<ResourceClaimReader>(std::make_unique<ApiClient>(*std::move(config)));
}

}  // namespace vfio_agent::kube
