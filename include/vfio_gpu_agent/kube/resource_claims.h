// The DRA driver's claims for binding conditions (KEP-5007): the allocated ResourceClaims of this node's pool,
// listed and watched by the claim router's label (claim_routing.h) so that an agent receives only its own node's
// claims, and the server-side apply of the driver's status.devices[] entries.
//
// API calls (what RBAC must allow): list and watch resourceclaims (cluster scope, with a labelSelector), patch
// resourceclaims/status (server-side apply, field manager = the driver name).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "vfio_gpu_agent/kube/resource_claim_reader.h"

namespace vfio_agent::kube {

class ApiClient;
class ListWatcher;

inline constexpr char kResourceClaimsPath[] = "/apis/resource.k8s.io/v1/resourceclaims";

struct ClaimWatchOptions {
  std::string node_name;  // selects kClaimNodeLabel=ClaimNodeLabelValue(node_name)
  std::string driver;     // the field manager of our status.devices entries
  std::chrono::milliseconds timeout{10000};  // per status write
};

// The node's labelled claims on a thread of its own ("claim-watch", the ListWatcher's rules: re-watch from the last
// resourceVersion, list again after 410, backoff on errors). Handlers are called from that thread.
class ResourceClaimWatch {
 public:
  struct Handlers {
    // Every list's claims: the whole selection as the server has it now (the first one, and after each 410 or
    // error, when events may have been missed): the caller replaces its view with it.
    std::function<void(std::vector<ResourceClaim> claims)> listed;
    // A claim added or changed, or (`gone`) deleted or no longer labelled for this node.
    std::function<void(const ResourceClaim& claim, bool gone)> changed;
  };
  ResourceClaimWatch(std::shared_ptr<ApiClient> client, std::string path, Handlers handlers);
  ~ResourceClaimWatch();  // stops the thread
  ResourceClaimWatch(const ResourceClaimWatch&) = delete;
  ResourceClaimWatch& operator=(const ResourceClaimWatch&) = delete;

  uint64_t watches() const;
  uint64_t lists() const;

 private:
  std::unique_ptr<ListWatcher> watcher_;
};

class ResourceClaimClient {
 public:
  ResourceClaimClient(std::unique_ptr<ApiClient> client, ClaimWatchOptions options);
  ~ResourceClaimClient();
  ResourceClaimClient(const ResourceClaimClient&) = delete;
  ResourceClaimClient& operator=(const ResourceClaimClient&) = delete;

  // GET /apis/resource.k8s.io/v1/resourceclaims?labelSelector=<kClaimNodeLabel>%3D<value>, then watch.
  std::unique_ptr<ResourceClaimWatch> Watch(ResourceClaimWatch::Handlers handlers);

  // PATCH .../namespaces/<ns>/resourceclaims/<name>/status?fieldManager=<driver>&force=true, server-side apply:
  // status.devices is a list-map keyed by driver/pool/device/shareID, so applying our entries sets exactly them and
  // leaves other drivers' entries alone (a merge patch would replace the whole list and race with them). The
  // claim's UID is a precondition: a claim deleted and created again under the name is not written. Errors name
  // the request: Aborted (409), NotFound (404), InvalidArgument (422: not an allocated device), others as GetOk.
  absl::Status ApplyDeviceStatus(const ResourceClaim& claim, const std::vector<DeviceStatus>& devices);

  uint64_t requests() const;

 private:
  const std::shared_ptr<ApiClient> client_;
  const ClaimWatchOptions options_;
};

absl::StatusOr<std::unique_ptr<ResourceClaimClient>> ConnectResourceClaimClient(
    const std::filesystem::path& kubeconfig, const std::filesystem::path& service_account_dir,
    ClaimWatchOptions options);

}  // namespace vfio_agent::kube
