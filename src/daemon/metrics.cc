#include "metrics.h"

#include <exception>

#include "absl/strings/str_cat.h"

namespace vfio_agent::daemon::internal {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

double Seconds(std::chrono::nanoseconds duration) { return std::chrono::duration<double>(duration).count(); }

}  // namespace

Metrics::Metrics()
    : devices_(BuildGauge()
                   .Name("vfio_gpu_agent_devices")
                   .Help("Selected GPUs by resource and state (healthy, unhealthy, unbound)")
                   .Register(*registry_)),
      binds_(BuildCounter()
                 .Name("vfio_gpu_agent_binds_total")
                 .Help("Bind attempts of one function by outcome")
                 .Register(*registry_)),
      bind_failures_(BuildCounter()
                         .Name("vfio_gpu_agent_bind_failures_total")
                         .Help("Failed or blocked binds by reason")
                         .Register(*registry_)),
      registrations_(BuildGauge()
                         .Name("vfio_gpu_agent_registrations")
                         .Help("Successful Register calls with the kubelet, by resource")
                         .Register(*registry_)),
      kubelet_restarts_(BuildCounter()
                            .Name("vfio_gpu_agent_kubelet_restarts_total")
                            .Help("Kubelet restarts seen (kubelet.sock re-created after a registration)")
                            .Register(*registry_)
                            .Add({})),
      last_reconcile_(BuildGauge()
                          .Name("vfio_gpu_agent_last_reconcile_timestamp_seconds")
                          .Help("Unix time of the last finished reconcile pass")
                          .Register(*registry_)
                          .Add({})),
      reconcile_seconds_(BuildGauge()
                             .Name("vfio_gpu_agent_reconcile_duration_seconds")
                             .Help("Duration of the last reconcile pass")
                             .Register(*registry_)
                             .Add({})),
      ready_(BuildGauge()
                 .Name("vfio_gpu_agent_ready")
                 .Help("1 when every selected GPU is bound, healthy, registered and allocatable")
                 .Register(*registry_)
                 .Add({})),
      not_ready_(BuildGauge()
                     .Name("vfio_gpu_agent_not_ready")
                     .Help("1 for the check that makes the node not ready")
                     .Register(*registry_)),
      allocations_(BuildCounter()
                       .Name("vfio_gpu_agent_allocations_total")
                       .Help("Allocate calls from the kubelet by resource and result")
                       .Register(*registry_)),
      allocate_seconds_(BuildHistogram()
                            .Name("vfio_gpu_agent_allocate_duration_seconds")
                            .Help("Time the plugin spent in Allocate")
                            .Register(*registry_)),
      validation_(BuildGauge()
                      .Name("vfio_gpu_agent_validation_result")
                      .Help("1 for each check's current result (pass, warn, fail, skip) by check id and subject")
                      .Register(*registry_)),
      api_(BuildGauge()
               .Name("vfio_gpu_agent_kube_api")
               .Help("Kubernetes API client counters since start (requests, failures, condition patches, events)")
               .Register(*registry_)),
      api_pending_writes_(BuildGauge()
                              .Name("vfio_gpu_agent_kube_api_pending_writes")
                              .Help("Writes the API server has not accepted yet, in flight included (the node "
                                    "condition, distinct events)")
                              .Register(*registry_)
                              .Add({})),
      fabric_(BuildGauge()
                  .Name("vfio_gpu_agent_fabric")
                  .Help("Shared-NVSwitch mode: connected (1 while Fabric Manager answers), partitions_supported, "
                        "partitions_active, reconnects")
                  .Register(*registry_)),
      partition_activations_(BuildCounter()
                                 .Name("vfio_gpu_agent_fabric_partition_activations_total")
                                 .Help("Partition activations for an Allocate or a DRA claim's Prepare, by result "
                                       "and FM status")
                                 .Register(*registry_)),
      partition_releases_(BuildCounter()
                              .Name("vfio_gpu_agent_fabric_partition_releases_total")
                              .Help("Partitions deactivated (no pod held them, their DRA claim ended, or an "
                                    "overlapping one was wanted)")
                              .Register(*registry_)
                              .Add({})) {}

Metrics::~Metrics() = default;

absl::Status Metrics::Listen(const std::string& host, int port) {
  const std::string address = absl::StrCat(host, ":", port);
  try {
    auto exposer = std::make_unique<prometheus::Exposer>(address, /*num_threads=*/1);
    exposer->RegisterCollectable(registry_);
    exposer_ = std::move(exposer);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("metrics on ", address, ": ", e.what()));
  }
  return absl::OkStatus();
}

void Metrics::SetDevices(const std::map<std::pair<std::string, std::string>, int>& counts) {
  std::lock_guard lock(mu_);
  for (prometheus::Gauge* gauge : device_gauges_) devices_.Remove(gauge);
  device_gauges_.clear();
  for (const auto& [key, count] : counts) {
    prometheus::Gauge& gauge = devices_.Add({{"resource", key.first}, {"state", key.second}});
    gauge.Set(count);
    device_gauges_.push_back(&gauge);
  }
}

void Metrics::CountBind(const std::string& outcome) { binds_.Add({{"outcome", outcome}}).Increment(); }

void Metrics::CountBindFailure(const std::string& reason) { bind_failures_.Add({{"reason", reason}}).Increment(); }

void Metrics::SetRegistrations(const std::string& resource, int registrations) {
  registrations_.Add({{"resource", resource}}).Set(registrations);
}

void Metrics::SetReconciled(std::chrono::system_clock::time_point when, std::chrono::nanoseconds cost) {
  last_reconcile_.Set(std::chrono::duration<double>(when.time_since_epoch()).count());
  reconcile_seconds_.Set(Seconds(cost));
}

void Metrics::SetReady(bool ready, const std::string& check_id) {
  ready_.Set(ready ? 1 : 0);
  std::lock_guard lock(mu_);
  for (prometheus::Gauge* gauge : not_ready_gauges_) not_ready_.Remove(gauge);
  not_ready_gauges_.clear();
  if (!ready) {
    prometheus::Gauge& gauge = not_ready_.Add({{"check", check_id}});
    gauge.Set(1);
    not_ready_gauges_.push_back(&gauge);
  }
}

void Metrics::SetValidation(const std::vector<validation::Check>& checks) {
  std::lock_guard lock(mu_);
  for (prometheus::Gauge* gauge : validation_gauges_) validation_.Remove(gauge);
  validation_gauges_.clear();
  for (const validation::Check& check : checks) {
    prometheus::Gauge& gauge = validation_.Add(
        {{"check", check.id}, {"subject", check.subject}, {"result", validation::ResultName(check.result)}});
    gauge.Set(1);
    validation_gauges_.push_back(&gauge);
  }
}

void Metrics::SetApiStats(const kube::ReporterStats& stats) {
  api_.Add({{"counter", "requests"}}).Set(static_cast<double>(stats.requests));
  api_.Add({{"counter", "failures"}}).Set(static_cast<double>(stats.failures));
  api_.Add({{"counter", "condition_patches"}}).Set(static_cast<double>(stats.condition_patches));
  api_.Add({{"counter", "events_created"}}).Set(static_cast<double>(stats.events_created));
  api_.Add({{"counter", "events_updated"}}).Set(static_cast<double>(stats.events_updated));
  api_.Add({{"counter", "events_dropped"}}).Set(static_cast<double>(stats.events_dropped));
  api_pending_writes_.Set(static_cast<double>(stats.pending_writes));
}

void Metrics::OnAllocate(const std::string& resource_name, bool ok, std::chrono::nanoseconds latency) {
  allocations_.Add({{"resource", resource_name}, {"result", ok ? "ok" : "rejected"}}).Increment();
  static const prometheus::Histogram::BucketBoundaries kBuckets = {1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 1e-1};
  allocate_seconds_.Add({{"resource", resource_name}}, kBuckets).Observe(Seconds(latency));
}

void Metrics::OnKubeletRestart() { kubelet_restarts_.Increment(); }

void Metrics::SetFabric(const fabric::FabricStatus& status) {
  int active = 0;
  for (const fabric::Partition& partition : status.table.partitions()) active += partition.active ? 1 : 0;
  fabric_.Add({{"value", "connected"}}).Set(status.connected && status.error.empty() ? 1 : 0);
  fabric_.Add({{"value", "partitions_supported"}}).Set(static_cast<double>(status.table.partitions().size()));
  fabric_.Add({{"value", "partitions_active"}}).Set(active);
  fabric_.Add({{"value", "reconnects"}}).Set(status.reconnects);
}

void Metrics::CountPartitionActivation(bool ok, const std::string& fm_status) {
  partition_activations_.Add({{"result", ok ? "ok" : "failed"}, {"fm_status", ok ? "FM_ST_SUCCESS" : fm_status}})
      .Increment();
}

void Metrics::CountPartitionRelease() { partition_releases_.Increment(); }

}  // namespace vfio_agent::daemon::internal
