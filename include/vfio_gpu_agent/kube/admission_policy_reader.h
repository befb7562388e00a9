// `validate`'s api layer in a cluster: the ValidatingAdmissionPolicy that holds each agent to its own Node
// (daemonset/base/agent/admission-policy.yaml) and its binding, read by name with the credentials `run` uses.
// The agent's ClusterRole grants `get` on these two objects by name and nothing else of
// admissionregistration.k8s.io: reading one named object tells whether it is installed without listing the
// cluster's other policies. One blocking GET with a deadline per call; no background worker.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace vfio_agent::kube {

class ApiClient;

// The name of both objects in every overlay (the ClusterRole's resourceNames say the same).
inline constexpr char kAgentAdmissionPolicy[] = "vfio-gpu-agent-own-node";
inline constexpr char kAdmissionPoliciesPath[] = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies";
inline constexpr char kAdmissionPolicyBindingsPath[] =
    "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings";

struct AdmissionPolicyReaderOptions {
  std::filesystem::path kubeconfig;  // "" = in-cluster (service account under service_account_dir)
  std::filesystem::path service_account_dir = "/var/run/secrets/kubernetes.io/serviceaccount";
};

class AdmissionPolicyReader {
 public:
  explicit AdmissionPolicyReader(std::unique_ptr<ApiClient> client);
  ~AdmissionPolicyReader();
  AdmissionPolicyReader(const AdmissionPolicyReader&) = delete;
  AdmissionPolicyReader& operator=(const AdmissionPolicyReader&) = delete;

  // GET <collection>/<name> (collection: kAdmissionPoliciesPath or kAdmissionPolicyBindingsPath): the object's
  // JSON as the server sent it. Errors name the URL and what the server said: NotFound for a 404 naming the
  // object (not installed), Unimplemented for a 404 that names none (admissionregistration.k8s.io/v1 policies
  // are not served: Kubernetes < 1.30), Unauthenticated for a 401 (or an unreadable token file),
  // PermissionDenied for a 403 (RBAC), DeadlineExceeded when `timeout` passed (connecting included), DataLoss
  // for a 2xx that is not a JSON object, Unavailable for everything else (unreachable, TLS, 429, 5xx).
  absl::StatusOr<std::string> Get(absl::string_view collection, absl::string_view name,
                                  std::chrono::milliseconds timeout);

  // "GET https://10.96.0.1:443/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/NAME": evidence.
  std::string Request(absl::string_view collection, absl::string_view name) const;
  // Where the server and credentials came from: "in-cluster /var/run/...", "kubeconfig /path".
  const std::string& ConfigSource() const;
  uint64_t requests() const;

 private:
  std::unique_ptr<ApiClient> client_;
};

// As ConnectKubevirtReader: `kubeconfig` when given, else in-cluster. NotFound when there is no cluster; other
// errors are configuration errors. Reads local files only; never contacts the server.
absl::StatusOr<std::unique_ptr<AdmissionPolicyReader>> ConnectAdmissionPolicyReader(
    const AdmissionPolicyReaderOptions& options);

}  // namespace vfio_agent::kube
