// The DRA driver's one read of the API: a ResourceClaim (resource.k8s.io/v1) by namespace and name, to learn what
// the scheduler allocated (the kubelet's Prepare carries only namespace, name and UID). One blocking GET with a
// deadline per call; no background worker.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace vfio_agent::kube {

class ApiClient;

// status.allocation.devices.results[]
struct AllocationResult {
  std::string request;  // may be "request/subrequest"
  std::string driver;
  std::string pool;
  std::string device;
  // The DeviceClass its request named (spec.devices.requests[].exactly.deviceClassName, or the firstAvailable
  // subrequest's); status.allocation does not say it. "" when the spec names none (an admin-access or unknown shape).
  std::string device_class;
  // Copied by the scheduler from the device's ResourceSlice entry at allocation (KEP-5007): it waits in PreBind
  // for these in the claim's status.devices[] entry of the device.
  std::vector<std::string> binding_conditions;
  std::vector<std::string> binding_failure_conditions;
};

// status.devices[].conditions[] (a metav1.Condition).
struct DeviceCondition {
  std::string type;
  std::string status;  // "True", "False", "Unknown"
  std::string reason;
  std::string message;
  std::string last_transition_time;  // RFC 3339
  int64_t observed_generation = 0;
};

// status.devices[]: what drivers report about an allocated device.
struct DeviceStatus {
  std::string driver;
  std::string pool;
  std::string device;
  std::vector<DeviceCondition> conditions;
};

struct ResourceClaim {
  std::string namespace_name;
  std::string name;
  std::string uid;
  int64_t generation = 0;
  std::map<std::string, std::string> annotations;
  bool allocated = false;  // status.allocation is set
  std::vector<AllocationResult> results;
  std::vector<std::string> reserved_for;  // status.reservedFor[].uid: the pods (consumers) the claim is reserved for
  std::string resource_version;
  bool deleting = false;  // metadata.deletionTimestamp is set
  std::vector<DeviceStatus> device_statuses;  // status.devices
};

struct ClaimReaderOptions {
  std::filesystem::path kubeconfig;  // "" = in-cluster (service account under service_account_dir)
  std::filesystem::path service_account_dir = "/var/run/secrets/kubernetes.io/serviceaccount";
};

class ResourceClaimReader {
 public:
  explicit ResourceClaimReader(std::unique_ptr<ApiClient> client);
  ~ResourceClaimReader();
  ResourceClaimReader(const ResourceClaimReader&) = delete;
  ResourceClaimReader& operator=(const ResourceClaimReader&) = delete;

  // GET /apis/resource.k8s.io/v1/namespaces/<ns>/resourceclaims/<name>. Errors name the URL and what the server
  // said: NotFound (404: the claim is gone), PermissionDenied (403), Unauthenticated (401 or an unreadable token),
  // DeadlineExceeded, DataLoss for a 2xx that is not a ResourceClaim, Unavailable for everything else.
  absl::StatusOr<ResourceClaim> Get(const std::string& namespace_name, const std::string& name,
                                    std::chrono::milliseconds timeout);
  uint64_t requests() const;

 private:
  std::unique_ptr<ApiClient> client_;
};

// `kubeconfig` when given, else in-cluster; NotFound when there is neither. Reads local files only.
absl::StatusOr<std::unique_ptr<ResourceClaimReader>> ConnectResourceClaimReader(const ClaimReaderOptions& options);

}  // namespace vfio_agent::kube
