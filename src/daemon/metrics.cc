#include "metrics.h"

#include <exception>
#include <set>

#include "absl/strings/str_cat.h"

namespace vfio_agent::daemon::internal {
namespace {

double Seconds(std::chrono::nanoseconds duration) { return std::chrono::duration<double>(duration).count(); }

}  // namespace

// prometheus-cpp leaves a family out of the scrape until it has a sample (no Allocate yet, no Fabric Manager on
// this node), so a dashboard or alert naming it could not be told from one with a typo. Each family without a
// sample is listed by its HELP and TYPE lines alone, which Prometheus accepts and stores nothing for.
class Metrics::AllFamilies final : public prometheus::Collectable {
 public:
  AllFamilies(std::shared_ptr<prometheus::Registry> registry, const std::vector<prometheus::MetricFamily>* declared)
      : registry_(std::move(registry)), declared_(declared) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> families = registry_->Collect();
    std::set<std::string> sampled;
    for (const prometheus::MetricFamily& family : families) sampled.insert(family.name);
    for (const prometheus::MetricFamily& family : *declared_) {
      if (!sampled.contains(family.name)) families.push_back(family);
    }
    return families;
  }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  const std::vector<prometheus::MetricFamily>* declared_;  // filled by Metrics' constructor, read-only after
};

template <typename T>
prometheus::Family<T>& Metrics::Declare(const std::string& name, const std::string& help) {
  declared_.push_back({.name = name, .help = help, .type = T::metric_type, .metric = {}});
  return prometheus::detail::Builder<T>().Name(name).Help(help).Register(*registry_);
}

Metrics::Metrics()
    : devices_(Declare<prometheus::Gauge>("vfio_gpu_agent_devices",
                                          "Selected GPUs by resource and state (healthy, unhealthy, unbound)")),
      binds_(Declare<prometheus::Counter>("vfio_gpu_agent_binds_total", "Bind attempts of one function by outcome")),
      bind_failures_(Declare<prometheus::Counter>("vfio_gpu_agent_bind_failures_total",
                                                  "Failed or blocked binds by reason")),
      registrations_(Declare<prometheus::Gauge>("vfio_gpu_agent_registrations",
                                                "Successful Register calls with the kubelet, by resource")),
      kubelet_restarts_(Declare<prometheus::Counter>("vfio_gpu_agent_kubelet_restarts_total",
                                                     "Kubelet restarts seen (kubelet.sock re-created after a "
                                                     "registration)")
                            .Add({})),
      last_reconcile_(Declare<prometheus::Gauge>("vfio_gpu_agent_last_reconcile_timestamp_seconds",
                                                 "Unix time of the last finished reconcile pass")
                          .Add({})),
      reconcile_seconds_(Declare<prometheus::Gauge>("vfio_gpu_agent_reconcile_duration_seconds",
                                                    "Duration of the last reconcile pass")
                             .Add({})),
      ready_(Declare<prometheus::Gauge>("vfio_gpu_agent_ready",
                                        "1 when every selected GPU is bound, healthy, registered and allocatable")
                 .Add({})),
      not_ready_(Declare<prometheus::Gauge>("vfio_gpu_agent_not_ready",
                                            "1 for the check that makes the node not ready")),
      allocations_(Declare<prometheus::Counter>("vfio_gpu_agent_allocations_total",
                                                "Allocate calls from the kubelet by resource and result")),
      allocate_seconds_(Declare<prometheus::Histogram>("vfio_gpu_agent_allocate_duration_seconds",
                                                       "Time the plugin spent in Allocate")),
      validation_(Declare<prometheus::Gauge>("vfio_gpu_agent_validation_result",
                                             "1 for each check's current result (pass, warn, fail, skip) by check id "
                                             "and subject")),
      api_(Declare<prometheus::Gauge>("vfio_gpu_agent_kube_api",
                                      "Kubernetes API client counters since start (requests, failures, condition "
                                      "patches, events)")),
      api_pending_writes_(Declare<prometheus::Gauge>("vfio_gpu_agent_kube_api_pending_writes",
                                                     "Writes the API server has not accepted yet, in flight included "
                                                     "(the node condition, distinct events)")
                              .Add({})),
      fabric_(Declare<prometheus::Gauge>("vfio_gpu_agent_fabric",
                                         "Shared-NVSwitch mode: connected (1 while Fabric Manager answers), "
                                         "partitions_supported, partitions_active, reconnects")),
      partition_activations_(Declare<prometheus::Counter>("vfio_gpu_agent_fabric_partition_activations_total",
                                                          "Partition activations for an Allocate or a DRA claim's "
                                                          "Prepare, by result and FM status")),
      partition_releases_(Declare<prometheus::Counter>("vfio_gpu_agent_fabric_partition_releases_total",
                                                       "Partitions deactivated (no pod held them, their DRA claim "
                                                       "ended, or an overlapping one was wanted)")
                              .Add({})),
      // Set once: a restart of the agent's container shows as a new value (changes() over a window).
      start_time_(Declare<prometheus::Gauge>("vfio_gpu_agent_start_time_seconds",
                                             "Unix time this agent process started")
                      .Add({})),
      vgpu_config_(Declare<prometheus::Gauge>("vfio_gpu_agent_vgpu_config_state",
                                              "1 for the vGPU profile config's current outcome on the node (success, "
                                              "pending, failed)")),
      prepare_seconds_(Declare<prometheus::Histogram>("vfio_gpu_agent_dra_prepare_duration_seconds",
                                                      "DRA NodePrepareResources calls, from the kubelet's call to the "
                                                      "answer, by result")),
      binding_wait_seconds_(Declare<prometheus::Histogram>(
          "vfio_gpu_agent_dra_binding_wait_seconds",
          "DRA binding conditions: from a claim's allocation seen by the agent to its binding (or failure) condition "
          "written, by result; the scheduler holds the pod in PreBind meanwhile")) {
  start_time_.Set(std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
}

Metrics::~Metrics() = default;

absl::Status Metrics::Listen(const std::string& host, int port) {
  const std::string address = absl::StrCat(host, ":", port);
  try {
    auto exposer = std::make_unique<prometheus::Exposer>(address, /*num_threads=*/1);
    all_families_ = std::make_shared<AllFamilies>(registry_, &declared_);
    exposer->RegisterCollectable(all_families_);
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

void Metrics::SetVgpuConfigState(const std::string& state) {
  std::lock_guard lock(mu_);
  for (prometheus::Gauge* gauge : vgpu_config_gauges_) vgpu_config_.Remove(gauge);
  vgpu_config_gauges_.clear();
  if (state.empty()) return;
  prometheus::Gauge& gauge = vgpu_config_.Add({{"state", state}});
  gauge.Set(1);
  vgpu_config_gauges_.push_back(&gauge);
}

void Metrics::OnPrepare(bool ok, std::chrono::nanoseconds duration) {
  // A Prepare that binds (--bind-on-prepare) takes seconds; one of a GPU already on vfio-pci, milliseconds.
  static const prometheus::Histogram::BucketBoundaries kBuckets = {1e-3, 1e-2, 0.1, 0.5, 1, 2, 5, 10, 30};
  prepare_seconds_.Add({{"result", ok ? "ok" : "failed"}}, kBuckets).Observe(Seconds(duration));
}

void Metrics::OnBinding(bool ok, std::chrono::nanoseconds waited) {
  // A bind takes a second or a few; a holder that does not let go, the write timeout (5 s) per function.
  static const prometheus::Histogram::BucketBoundaries kBuckets = {0.01, 0.1, 0.5, 1, 2, 5, 10, 30, 60};
  binding_wait_seconds_.Add({{"result", ok ? "ok" : "failed"}}, kBuckets).Observe(Seconds(waited));
}

}  // namespace vfio_agent::daemon::internal
