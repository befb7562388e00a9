// `validate`'s KubeVirt layer in a cluster: the KubeVirt CRs read from the API server with the credentials `run`
// uses (--kubeconfig, else the pod's service account). One blocking GET with a deadline per call; no
// background worker, no node name needed.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace vfio_agent::kube {

class ApiClient;

inline constexpr char kKubevirtsPath[] = "/apis/kubevirt.io/v1/kubevirts";

struct KubevirtReaderOptions {
  std::filesystem::path kubeconfig;  // "" = in-cluster (service account under service_account_dir)
  std::filesystem::path service_account_dir = "/var/run/secrets/kubernetes.io/serviceaccount";
};

struct KubevirtList {
  std::string json;  // the KubeVirtList as the server sent it, as `kubectl get kubevirt -A -o json` prints it
  size_t items = 0;  // 0: the API is served (KubeVirt's CRD is installed) but no KubeVirt CR exists
};

class KubevirtReader {
 public:
  explicit KubevirtReader(std::unique_ptr<ApiClient> client);
  ~KubevirtReader();
  KubevirtReader(const KubevirtReader&) = delete;
  KubevirtReader& operator=(const KubevirtReader&) = delete;

  // GET /apis/kubevirt.io/v1/kubevirts, every namespace. Errors name the URL and what the server said:
  // NotFound for a 404 (kubevirt.io/v1 is not served: KubeVirt is not installed), Unauthenticated for a 401
  // (or an unreadable token file), PermissionDenied for a 403 (RBAC), DeadlineExceeded when `timeout` passed
  // (connecting included), DataLoss for a 2xx that is not a list, Unavailable for everything else
  // (unreachable, TLS, 429, 5xx, other codes, a cut connection).
  absl::StatusOr<KubevirtList> List(std::chrono::milliseconds timeout);

  // "GET https://10.96.0.1:443/apis/kubevirt.io/v1/kubevirts": for evidence.
  std::string Request() const;
  // Where the server and credentials came from: "in-cluster /var/run/...", "kubeconfig /path".
  const std::string& ConfigSource() const;
  uint64_t requests() const;

 private:
  std::unique_ptr<ApiClient> client_;
};

// The cluster as `run` finds it: `kubeconfig` when given, else in-cluster (KUBERNETES_SERVICE_HOST/PORT and
// the service account's token). NotFound when there is none (no kubeconfig, not in a cluster or no token):
// the caller goes on without the API. Other errors are configuration errors (unreadable or invalid
// kubeconfig, unreadable CA). Reads local files only; never contacts the server.
absl::StatusOr<std::unique_ptr<KubevirtReader>> ConnectKubevirtReader(const KubevirtReaderOptions& options);

}  // namespace vfio_agent::kube
