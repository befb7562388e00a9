// The claim router: a small cluster-level controller that labels every allocated ResourceClaim of the driver with
// the node of its pool (kube::kClaimNodeLabel = kube::ClaimNodeLabelValue(pool)), so that each node's agent
// watches only its own node's claims by label selector instead of every claim of the cluster. ResourceClaims have
// no node field a field selector could use; without the label, 1,000 agents each watching every claim would
// multiply every claim event by the node count (tests/bench/README.md has the measured figures).
//
// One replica acts: the one holding a coordination.k8s.io/v1 Lease (client-go's leader election rules: acquire
// when the lease is free or its holder has not renewed it for leaseDurationSeconds as this replica observed it,
// renew every retry period, stop acting when no renewal succeeded for the renew deadline, release on stop).
// While it leads it lists and watches ResourceClaims cluster-wide and PATCHes metadata.labels. When no router
// runs, nothing breaks: claims stay unlabeled, the agents do not see them, and the scheduler's PreBind waits
// (up to its binding timeout) until a router labels them and the agent answers.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace vfio_agent::router {

inline constexpr char kDefaultLeaseName[] = "vfio-gpu-agent-claim-router";

// What one claim should carry, from its JSON (a ResourceClaim as the API serves it).
struct ClaimRoute {
  std::string namespace_name;
  std::string name;
  std::string uid;
  std::optional<std::string> current;  // kClaimNodeLabel as stored
  // ClaimNodeLabelValue(pool) of the first status.allocation.devices.results[] entry of the driver; nullopt when
  // the claim is not allocated or none of its results is the driver's (the label, if any, is then removed).
  std::optional<std::string> wanted;
  // Another of the driver's results names a different pool (a claim spanning nodes, which a node-local driver
  // never allocates): labeled by the first, and said in the log.
  bool several_pools = false;
  // Nothing to do: a claim of another driver without our label is left alone.
  bool settled() const { return current == wanted; }
};

// DataLoss when the text is not a ResourceClaim with metadata.namespace and name.
absl::StatusOr<ClaimRoute> RouteOf(std::string_view claim_json, std::string_view driver);

struct RouterOptions {
  std::filesystem::path kubeconfig;  // "" = in-cluster
  std::filesystem::path service_account_dir = "/var/run/secrets/kubernetes.io/serviceaccount";
  std::string driver = "gpu.vfio-agent.cozystack.io";
  std::string lease_namespace;  // required
  std::string lease_name = kDefaultLeaseName;
  std::string identity;  // unique per replica (the pod name); required
  // client-go's defaults for its own controllers.
  std::chrono::milliseconds lease_duration{15000};
  std::chrono::milliseconds renew_deadline{10000};
  std::chrono::milliseconds retry_period{2000};
  std::chrono::milliseconds request_timeout{5000};
};

// Counters, read from any thread (tests, logs).
struct RouterCounters {
  std::atomic<uint64_t> terms{0};          // times this replica became the leader
  std::atomic<uint64_t> lists{0};          // cluster-wide lists of claims (the first and after every 410)
  std::atomic<uint64_t> events{0};         // claim watch events read
  std::atomic<uint64_t> labeled{0};        // PATCHes that set the label
  std::atomic<uint64_t> unlabeled{0};      // PATCHes that removed it
  std::atomic<uint64_t> patch_errors{0};   // PATCHes that failed (retried)
};

class ClaimRouter {
 public:
  // Reads the kubeconfig or the service account (local files only). InvalidArgument for a missing identity or
  // namespace, durations that do not satisfy lease_duration > renew_deadline > retry_period > 0.
  static absl::StatusOr<std::unique_ptr<ClaimRouter>> Connect(RouterOptions options);
  ~ClaimRouter();
  ClaimRouter(const ClaimRouter&) = delete;
  ClaimRouter& operator=(const ClaimRouter&) = delete;

  // Elects and, while leading, routes; on the calling thread until Stop(), then stops routing and releases the
  // lease (a standby takes over at once instead of after the lease expires). Returns the release's error.
  absl::Status Run();
  // From any thread (the signal thread).
  void Stop();

  bool leading() const { return leading_.load(); }
  const RouterCounters& counters() const { return *counters_; }

 private:
  struct Impl;
  explicit ClaimRouter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::atomic<bool> leading_{false};
  std::shared_ptr<RouterCounters> counters_;
};

}  // namespace vfio_agent::router
