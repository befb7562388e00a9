// The daemon's Prometheus metrics, in the text exposition format (0.0.4), served on /metrics by one thread of our
// own. Also the plugin's observer, so the plugin concern itself never depends on Prometheus.
// Not prometheus-cpp: Debian ships it (and civetweb) only as shared C++ libraries, which every process start
// of every command mapped (`serve` never serves metrics) and which kept the agent on the shared libstdc++
// (tests/bench/README.md, "Start time").
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "vfio_gpu_agent/fabric/partition_manager.h"
#include "vfio_gpu_agent/kube/node_reporter.h"
#include "vfio_gpu_agent/plugin/agent.h"
#include "vfio_gpu_agent/validation/check.h"

namespace vfio_agent::daemon::internal {

class Metrics final : public plugin::AgentObserver {
 public:
  Metrics();
  ~Metrics() override;

  // Serves /metrics on host:port. Errors (port taken) as values.
  absl::Status Listen(const std::string& host, int port);

  // Device counts by resource and state ("healthy", "unhealthy", "unbound"); replaces the previous set.
  void SetDevices(const std::map<std::pair<std::string, std::string>, int>& counts);
  void CountBind(const std::string& outcome);
  void CountBindFailure(const std::string& reason);
  void SetRegistrations(const std::string& resource, int registrations);
  void SetReconciled(std::chrono::system_clock::time_point when, std::chrono::nanoseconds cost);
  void SetReady(bool ready, const std::string& check_id);
  void SetValidation(const std::vector<validation::Check>& checks);
  void SetApiStats(const kube::ReporterStats& stats);
  // Shared-NVSwitch mode: FM connection, active partitions, and FM's answers.
  void SetFabric(const fabric::FabricStatus& status);
  void CountPartitionActivation(bool ok, const std::string& fm_status);
  void CountPartitionRelease();
  // The vGPU profile config's outcome on the node (success, pending, failed; "" when none is chosen): 1 for it.
  void SetVgpuConfigState(const std::string& state);
  // One NodePrepareResources call of the DRA driver.
  void OnPrepare(bool ok, std::chrono::nanoseconds duration);
  // --binding-conditions: from a claim's allocation seen by the agent to its condition written.
  void OnBinding(bool ok, std::chrono::nanoseconds waited);

  // plugin::AgentObserver
  void OnAllocate(const std::string& resource_name, bool ok, std::chrono::nanoseconds latency) override;
  void OnKubeletRestart() override;

 private:
  struct Family;
  class Server;
  using Labels = std::map<std::string, std::string>;  // sorted by name, as the exposition writes them

  Family& Declare(const char* name, const char* help, const char* type);
  void Set(Family& family, const Labels& labels, double value);
  void Increment(Family& family, const Labels& labels);
  void Observe(Family& family, const Labels& labels, const std::vector<double>& buckets, double value);
  void Clear(Family& family);
  // The scrape: every family in declaration order; one with no sample by its HELP and TYPE lines alone (a dashboard
  // or alert naming it can then be told from a typo), which Prometheus accepts and stores nothing for.
  std::string Render() const;

  mutable std::mutex mu_;  // every family's samples
  std::vector<std::unique_ptr<Family>> families_;
  Family& devices_;
  Family& binds_;
  Family& bind_failures_;
  Family& registrations_;
  Family& kubelet_restarts_;
  Family& last_reconcile_;
  Family& reconcile_seconds_;
  Family& ready_;
  Family& not_ready_;
  Family& allocations_;
  Family& allocate_seconds_;
  Family& validation_;
  Family& api_;
  Family& api_pending_writes_;
  Family& fabric_;
  Family& partition_activations_;
  Family& partition_releases_;
  Family& start_time_;
  Family& vgpu_config_;
  Family& prepare_seconds_;
  Family& binding_wait_seconds_;
  std::unique_ptr<Server> server_;  // last: stopped before the families go
};

}  // namespace vfio_agent::daemon::internal
