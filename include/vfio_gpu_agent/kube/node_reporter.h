// What the agent tells (and asks) the Kubernetes API about its own node: the GPUPassthroughReady condition,
// events on the Node, the node's labels and the KubeVirt CR. The API is never on the data path: every write
// is queued and sent by a background worker (rate limited, retried with backoff), so binding and serving go
// on while the API is slow or down.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace vfio_agent::kube {

inline constexpr char kConditionType[] = "GPUPassthroughReady";
inline constexpr char kReportingController[] = "vfio-gpu-agent";

struct NodeCondition {
  bool ready = false;
  std::string reason;   // CamelCase: "AllDevicesReady", "DeviceNotBound", "OperatorStillManagesNode", ...
  std::string message;  // names the failing check id and the devices
  bool operator==(const NodeCondition&) const = default;
};

enum class EventType { kNormal, kWarning };

struct ReporterStats {
  uint64_t requests = 0;         // HTTP requests sent to the API server
  uint64_t failures = 0;         // of which failed (transport, 4xx, 5xx)
  uint64_t condition_patches = 0;
  uint64_t events_created = 0;   // new Event objects
  uint64_t events_updated = 0;   // series updates of an existing Event
  uint64_t events_dropped = 0;   // over the rate limit queue bound
  // Not counters: the writes the API has not accepted yet, in flight included (the node condition when it
  // differs from the stored one, and each distinct event in the queue). 0 = the API holds what the agent said.
  uint64_t pending_writes = 0;
};

class NodeReporter {
 public:
  virtual ~NodeReporter() = default;
  // Non-blocking. The condition is patched into nodes/<node>/status only when it differs from the last one
  // the API accepted; while the API is unreachable the latest wanted state is kept and sent when it returns.
  virtual void SetCondition(const NodeCondition& condition) = 0;
  // Non-blocking. Repeats of the same (type, reason, note) are folded into an event series; at most one API
  // write per second per node with a burst of 10.
  // `reason` says what happened (GPUsBound, BindBlocked), `action` what the agent was doing (Binding).
  virtual void RecordEvent(EventType type, const std::string& reason, const std::string& action,
                           const std::string& note) = 0;
  // Blocking reads with a deadline.
  virtual absl::StatusOr<std::map<std::string, std::string>> NodeLabels(std::chrono::milliseconds timeout) = 0;
  virtual ReporterStats Stats() const = 0;
};

struct ConnectOptions {
  std::filesystem::path kubeconfig;  // "" = in-cluster (service account under service_account_dir)
  std::filesystem::path service_account_dir = "/var/run/secrets/kubernetes.io/serviceaccount";
  std::string node_name;             // required
};

// NotFound when there is no cluster to talk to (no --kubeconfig and not in a cluster: no
// KUBERNETES_SERVICE_HOST or no token): the caller runs without the API. Other errors (unreadable or invalid
// kubeconfig, no node name) are configuration errors. Never contacts the API server itself.
absl::StatusOr<std::unique_ptr<NodeReporter>> ConnectNodeReporter(const ConnectOptions& options);

}  // namespace vfio_agent::kube
