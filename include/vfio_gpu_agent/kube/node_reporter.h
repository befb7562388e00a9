// What the agent tells (and asks) the Kubernetes API about its own node: the GPUPassthroughReady condition,
// events on the Node, the node's labels and the KubeVirt CR. The API is never on the data path: every write
// is queued and sent by a background worker (rate limited, retried with backoff), so binding and serving go
// on while the API is slow or down.
#pragma once

#include <chrono>
#include <functional>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "vfio_gpu_agent/kube/kubevirt_release.h"

namespace vfio_agent::kube {

inline constexpr char kConditionType[] = "GPUPassthroughReady";
inline constexpr char kReportingController[] = "vfio-gpu-agent";

enum class ConditionStatus { kFalse, kTrue, kUnknown };
const char* ConditionStatusName(ConditionStatus status);  // "False", "True", "Unknown"

struct NodeCondition {
  ConditionStatus status = ConditionStatus::kFalse;
  std::string reason;   // CamelCase: "AllDevicesReady", "DeviceNotBound", "OperatorStillManagesNode", ...
  std::string message;  // names the failing check id and the devices
  bool operator==(const NodeCondition&) const = default;
};

enum class EventType { kNormal, kWarning };

struct ReporterStats {
  uint64_t requests = 0;         // HTTP requests sent to the API server
  uint64_t failures = 0;         // of which failed (transport, 4xx, 5xx)
  uint64_t condition_patches = 0;
  uint64_t label_patches = 0;
  uint64_t events_created = 0;   // new Event objects
  uint64_t events_updated = 0;   // series updates of an existing Event
  uint64_t events_dropped = 0;   // over the rate limit queue bound
  // Not counters: the writes the API has not accepted yet, in flight included (the node condition when it
  // differs from the stored one, the labels when they do, and each distinct event in the queue). 0 = the API holds what the agent said.
  uint64_t pending_writes = 0;
  bool operator==(const ReporterStats&) const = default;
};

class NodeReporter {
 public:
  virtual ~NodeReporter() = default;
  // Non-blocking. The condition is patched into nodes/<node>/status only when it differs from the last one
  // the API accepted; while the API is unreachable the latest wanted state is kept and sent when it returns.
  // While the stored condition is the wanted one, it is patched again every heartbeat interval (5 minutes)
  // with a new lastHeartbeatTime, so that a condition left by an agent that is no longer running can be told
  // from a live one.
  virtual void SetCondition(const NodeCondition& condition) = 0;
  // Non-blocking. Repeats of the same (type, reason, note) are folded into an event series; at most one API
  // write per second per node with a burst of 10.
  // `reason` says what happened (GPUsBound, BindBlocked), `action` what the agent was doing (Binding).
  virtual void RecordEvent(EventType type, const std::string& reason, const std::string& action,
                           const std::string& note) = 0;
  // Non-blocking. Sets a label of the node (a merge patch of metadata.labels), sent when it differs from what
  // the node carries; while the API is unreachable the latest value is kept and sent when it returns. A value the
  // API refuses is not retried (a new value is). An empty value removes the label.
  virtual void SetLabel(const std::string& key, const std::string& value) = 0;
  // Blocks until the condition last set is stored on the node (or refused), at most `timeout`: for the
  // last word before the agent stops. DeadlineExceeded when it is still pending.
  virtual absl::Status FlushCondition(std::chrono::milliseconds timeout) = 0;
  // Called on the API worker after every request it completes and whenever its pending writes change, so
  // that gauges read from these stats are current rather than as of the caller's last poll. Set once, before
  // the first SetCondition or RecordEvent.
  virtual void OnStats(std::function<void(const ReporterStats&)> listener) = 0;
  // Blocking reads with a deadline.
  virtual absl::StatusOr<std::map<std::string, std::string>> NodeLabels(std::chrono::milliseconds timeout) = 0;
  // Watches the node's labels from now on, on a thread of the reporter's own (va-kube-watch): one list, then one
  // watch request (fieldSelector metadata.name=<node>) held open and reopened from the last resourceVersion when
  // the server ends it, a new list after 410 Gone, retries with backoff (1 s doubling to 30 s) while the API fails.
  // `on_labels` runs on that thread with the labels after the first list and whenever they change (other changes
  // of the node, its status, the kubelet's heartbeats, call nothing). At most once; false when this reporter cannot
  // watch (the default), and the caller polls NodeLabels instead.
  virtual bool WatchLabels(std::function<void(const std::map<std::string, std::string>&)> on_labels) {
    (void)on_labels;
    return false;
  }
  // Tells `on_release` the KubeVirt release the cluster runs (the first KubeVirt CR's status.observedKubeVirtVersion;
  // nullopt = unknown: KubeVirt not installed (404), no CR, no version reported yet, or the read is forbidden). On the
  // API worker (va-kube-api), which sends one GET /apis/kubevirt.io/v1/kubevirts soon after this call and one an hour
  // after it (ReporterOptions::kubevirt_interval); a read that fails for a passing reason is retried with the
  // worker's backoff and tells nothing. Called after the first read that answers and then only on a change. At most
  // once; false when this reporter cannot (the default): the release stays unknown.
  virtual bool WatchKubevirtRelease(std::function<void(const std::optional<KubevirtRelease>&)> on_release) {
    (void)on_release;
    return false;
  }
  virtual ReporterStats Stats() const = 0;
};

struct ConnectOptions {
  std::filesystem::path kubeconfig;  // "" = in-cluster (service account under service_account_dir)
  std::filesystem::path service_account_dir = "/var/run/secrets/kubernetes.io/serviceaccount";
  std::string node_name;             // required
  // WatchKubevirtRelease's re-read (ReporterOptions::kubevirt_interval).
  std::chrono::milliseconds kubevirt_interval = std::chrono::hours(1);
};

// NotFound when there is no cluster to talk to (no --kubeconfig and not in a cluster: no
// KUBERNETES_SERVICE_HOST or no token): the caller runs without the API. Other errors (unreadable or invalid
// kubeconfig, no node name) are configuration errors. Never contacts the API server itself.
absl::StatusOr<std::unique_ptr<NodeReporter>> ConnectNodeReporter(const ConnectOptions& options);

}  // namespace vfio_agent::kube
