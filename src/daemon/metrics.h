// The daemon's Prometheus metrics (prometheus-cpp; its pull Exposer serves them through civetweb). Also the
// plugin's observer, so the plugin concern itself never depends on Prometheus.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
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
  class AllFamilies;
  template <typename T>
  prometheus::Family<T>& Declare(const std::string& name, const std::string& help);

  std::shared_ptr<prometheus::Registry> registry_ = std::make_shared<prometheus::Registry>();
  std::vector<prometheus::MetricFamily> declared_;  // every family, without samples (AllFamilies); before them
  std::shared_ptr<AllFamilies> all_families_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  prometheus::Family<prometheus::Gauge>& devices_;
  prometheus::Family<prometheus::Counter>& binds_;
  prometheus::Family<prometheus::Counter>& bind_failures_;
  prometheus::Family<prometheus::Gauge>& registrations_;
  prometheus::Counter& kubelet_restarts_;
  prometheus::Gauge& last_reconcile_;
  prometheus::Gauge& reconcile_seconds_;
  prometheus::Gauge& ready_;
  prometheus::Family<prometheus::Gauge>& not_ready_;
  prometheus::Family<prometheus::Counter>& allocations_;
  prometheus::Family<prometheus::Histogram>& allocate_seconds_;
  prometheus::Family<prometheus::Gauge>& validation_;
  prometheus::Family<prometheus::Gauge>& api_;
  prometheus::Gauge& api_pending_writes_;
  prometheus::Family<prometheus::Gauge>& fabric_;
  prometheus::Family<prometheus::Counter>& partition_activations_;
  prometheus::Counter& partition_releases_;
  prometheus::Gauge& start_time_;
  prometheus::Family<prometheus::Gauge>& vgpu_config_;
  prometheus::Family<prometheus::Histogram>& prepare_seconds_;
  prometheus::Family<prometheus::Histogram>& binding_wait_seconds_;

  std::mutex mu_;  // the label sets below are replaced as a whole
  std::vector<prometheus::Gauge*> device_gauges_, validation_gauges_, not_ready_gauges_, vgpu_config_gauges_;
};

}  // namespace vfio_agent::daemon::internal
