// The outcome of a pass, published: readiness (gRPC health; the condition and events once past the registration
// grace), the device metrics and health events, and when the next pass is due.
#include "daemon_impl.h"

namespace vfio_agent::daemon {

void Daemon::Impl::Conclude(Readiness readiness, Clock::time_point start) {
  Settle(&readiness);
  Publish(readiness);
  const int restarts = kubelet_restarts_.load();
  if (restarts != restarts_reported_) {
    restarts_reported_ = restarts;
    Event(kube::EventType::kNormal, "KubeletRestarted", "Registering", "the kubelet restarted; the device plugin re-registered");
  }
  metrics_.SetReconciled(std::chrono::system_clock::now(), Clock::now() - start);
  if (readiness.ready) {
    next_pass_ = Clock::now() + options_.resync_interval;
  } else if (readiness.settling) {
    // Soon, but never past the end of the grace, when the state is published if it is still there.
    next_pass_ = std::min(Clock::now() + kLagRecheck, *settling_since_ + options_.registration_grace);
  } else {
    next_pass_ = Clock::now() + options_.not_ready_interval;
  }
}

void Daemon::Impl::Publish(const Readiness& readiness) {
  bool changed;
  {
    std::lock_guard lock(state_mu_);
    changed = !published_ || !(readiness == readiness_);
    readiness_ = readiness;
    published_ = true;
  }
  ready_ = readiness.ready;
  metrics_.SetReady(readiness.ready, readiness.check_id);
  if (!changed) return;
  if (readiness.settling) {
    spdlog::info("not ready yet: {} ({}); published as a failure if it lasts {} s", readiness.check_id,
                 readiness.message, std::chrono::duration_cast<std::chrono::seconds>(options_.registration_grace).count());
    return;
  }
  if (readiness.ready) {
    spdlog::info("ready: {}: {}", readiness.reason, readiness.message);
    Event(kube::EventType::kNormal, "ValidationPassed", "Validating", readiness.message);
  } else {
    spdlog::warn("not ready: {} ({}): {}", readiness.check_id, readiness.reason, readiness.message);
    Event(kube::EventType::kWarning, readiness.reason == kOperatorReason ? kOperatorReason : "ValidationFailed",
          "Validating", readiness.message);
  }
  if (reporter_) {
    reporter_->SetCondition({.status = readiness.ready ? kube::ConditionStatus::kTrue : kube::ConditionStatus::kFalse,
                             .reason = readiness.reason,
                             .message = readiness.message});
  }
}

void Daemon::Impl::PublishDevices(const node::ServedDevices& expected) {
  const node::ServedDevices served = frontend_->Served(expected);
  std::map<std::pair<std::string, std::string>, int> counts;
  std::set<std::string> advertised;
  for (const node::ServedDevice& device : served) {
    const std::string& name = device.resource_name;
    advertised.insert(device.id);
    ++counts[{name, device.healthy ? "healthy" : "unhealthy"}];
    auto [it, inserted] = health_seen_.try_emplace(device.id, device.healthy);
    if (!inserted && it->second != device.healthy) {
      if (device.healthy) {
        Event(kube::EventType::kNormal, "DeviceRecovered", "HealthChecking", absl::StrCat(device.id, " ", name, " is healthy again"));
      } else {
        Event(kube::EventType::kWarning, "DeviceLost", "HealthChecking",
              absl::StrCat(device.id, " ", name, " unhealthy: ", device.unhealthy_reason));
      }
    }
    it->second = device.healthy;
  }
  for (const node::ServedDevice& device : expected) {
    if (!advertised.contains(device.id)) ++counts[{device.resource_name, "unbound"}];
  }
  metrics_.SetDevices(counts);
}

}  // namespace vfio_agent::daemon
