#include "vfio_gpu_agent/kube/resource_claims.h"

#include "absl/strings/str_cat.h"
#include "api_client.h"
#include "claim_json.h"
#include "config.h"
#include "list_watch.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/kube/claim_routing.h"

namespace vfio_agent::kube {
namespace {

using Json = nlohmann::json;

std::string PercentEscape(std::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
        c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out += {'%', kHex[c >> 4], kHex[c & 15]};
    }
  }
  return out;
}

}  // namespace

ResourceClaimWatch::ResourceClaimWatch(std::shared_ptr<ApiClient> client, std::string path, Handlers handlers) {
  ListWatcher::Handlers watch{
      .listed = [listed = handlers.listed](const Json& list, bool) {
        std::vector<ResourceClaim> claims;
        if (list.contains("items") && list["items"].is_array()) {
          for (const Json& item : list["items"]) {
            absl::StatusOr<ResourceClaim> claim = ParseResourceClaim(item);
            if (claim.ok()) claims.push_back(*std::move(claim));
          }
        }
        if (listed) listed(std::move(claims));
      },
      .event = [changed = handlers.changed](const std::string& type, const Json& object) {
        absl::StatusOr<ResourceClaim> claim = ParseResourceClaim(object);
        if (!claim.ok()) {
          spdlog::warn("watch of ResourceClaims: {} event: {}", type, std::string(claim.status().message()));
          return;
        }
        if (changed) changed(*claim, type == "DELETED");
      }};
  watcher_ = std::make_unique<ListWatcher>(std::move(client), std::move(path), "ResourceClaims", "claim-watch",
                                           std::move(watch));
}

ResourceClaimWatch::~ResourceClaimWatch() = default;
uint64_t ResourceClaimWatch::watches() const { return watcher_->watches(); }
uint64_t ResourceClaimWatch::lists() const { return watcher_->lists(); }

ResourceClaimClient::ResourceClaimClient(std::unique_ptr<ApiClient> client, ClaimWatchOptions options)
    : client_(std::move(client)), options_(std::move(options)) {}
ResourceClaimClient::~ResourceClaimClient() = default;
uint64_t ResourceClaimClient::requests() const { return client_->requests(); }

std::unique_ptr<ResourceClaimWatch> ResourceClaimClient::Watch(ResourceClaimWatch::Handlers handlers) {
  const std::string selector =
      absl::StrCat(std::string(kClaimNodeLabel), "=", ClaimNodeLabelValue(options_.node_name));
  return std::make_unique<ResourceClaimWatch>(
      client_, absl::StrCat(kResourceClaimsPath, "?labelSelector=", PercentEscape(selector)), std::move(handlers));
}

absl::Status ResourceClaimClient::ApplyDeviceStatus(const ResourceClaim& claim,
                                                    const std::vector<DeviceStatus>& devices) {
  Json entries = Json::array();
  for (const DeviceStatus& device : devices) {
    Json conditions = Json::array();
    for (const DeviceCondition& condition : device.conditions) {
      conditions.push_back({{"type", condition.type},
                            {"status", condition.status},
                            {"reason", condition.reason},
                            {"message", condition.message},
                            {"lastTransitionTime", condition.last_transition_time},
                            {"observedGeneration", condition.observed_generation}});
    }
    entries.push_back(
        {{"driver", device.driver}, {"pool", device.pool}, {"device", device.device}, {"conditions", conditions}});
  }
  const Json body = {{"apiVersion", "resource.k8s.io/v1"},
                     {"kind", "ResourceClaim"},
                     {"metadata", {{"name", claim.name}, {"namespace", claim.namespace_name}, {"uid", claim.uid}}},
                     {"status", {{"devices", std::move(entries)}}}};
  const std::string path =
      absl::StrCat("/apis/resource.k8s.io/v1/namespaces/", claim.namespace_name, "/resourceclaims/", claim.name,
                   "/status?fieldManager=", PercentEscape(options_.driver), "&force=true");
  return AnswerStatus(client_->Send("PATCH", path, "application/apply-patch+yaml", body.dump(), options_.timeout),
                     absl::StrCat("PATCH ", client_->Url(path)));
}

absl::StatusOr<std::unique_ptr<ResourceClaimClient>> ConnectResourceClaimClient(
    const std::filesystem::path& kubeconfig, const std::filesystem::path& service_account_dir,
    ClaimWatchOptions options) {
  absl::StatusOr<ClusterConfig> config = LoadClusterConfig(kubeconfig, service_account_dir);
  if (!config.ok()) return config.status();
  return std::make_unique<ResourceClaimClient>(std::make_unique<ApiClient>(*std::move(config)), std::move(options));
}

}  // namespace vfio_agent::kube
