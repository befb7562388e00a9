// What the node is ready for after a pass: the host checks (validation's platform and devices layers, the status
// files), the binds, Fabric Manager, then the frontend's side (advertised or published, healthy, registered,
// allocatable or written to slices). The first failing check is the reason.
#include "daemon_impl.h"

namespace vfio_agent::daemon {

Readiness Daemon::Impl::Evaluate(const pci::Inventory& inventory, const pci::Selection& selection,
                                 const plugin::DeviceSnapshot& expected) {
  std::vector<std::string> managed = selection.gpus;
  managed.insert(managed.end(), selection.companions.begin(), selection.companions.end());
  std::vector<std::string> gpus;
  for (const std::string& bdf : selection.gpus) {
    if (selection.RoleOf(bdf) == pci::Role::kGpu) gpus.push_back(bdf);
  }

  validation::NodeView view{.paths = options_.serve.paths, .inventory = &inventory, .selection = &selection,
                            .expected = &expected};
  std::string fingerprint;
  for (const std::string& bdf : managed) {
    const pci::Function* fn = inventory.Find(bdf);
    absl::StrAppend(&fingerprint, bdf, "=", fn ? fn->driver : "?", ";");
  }
  RunHostChecks(view, fingerprint);

  if (managed.empty()) {
    metrics_.SetValidation(host_checks_);
    return {.ready = true, .check_id = "", .reason = "NoSelectedDevices",
            .message = "no selected device on this node; nothing to pass through"};
  }
  std::vector<std::string> unbound;
  for (const std::string& bdf : managed) {
    const pci::Function* fn = inventory.Find(bdf);
    if (BindOnPrepare() || (fn != nullptr && pci::IsVfioDriver(fn->driver))) continue;
    auto failure = bind_failures_.find(bdf);
    unbound.push_back(failure != bind_failures_.end() ? failure->second
                                                      : absl::StrCat(bdf, " on ", DriverText(fn ? fn->driver : "")));
  }
  if (!unbound.empty()) {
    metrics_.SetValidation(host_checks_);
    return {.ready = false, .check_id = "devices.bound", .reason = "DeviceNotBound",
            .message = absl::StrCat("devices.bound: not on a vfio driver: ", absl::StrJoin(unbound, "; "))};
  }
  if (const std::optional<fabric::FabricStatus> fabric = Fabric()) {
    metrics_.SetFabric(*fabric);
    // Every GPU of the board waits on FM: one reason for all of them, FM's own.
    if ((!fabric->connected || !fabric->error.empty()) && !options_.serve.fabric.fail_open) {
      metrics_.SetValidation(host_checks_);
      return {.ready = false, .check_id = "fabric.reachable", .reason = "FabricManagerNotReady",
              .message = absl::StrCat("fabric.reachable: Fabric Manager at ", options_.serve.fabric.address,
                                      " does not vouch for the GPUs (they are advertised Unhealthy): ",
                                      fabric->error)};
    }
  }
  if (dra_) {
    if (std::optional<Readiness> failing = DraReadiness(gpus, expected)) return *failing;
  } else if (std::optional<Readiness> failing = ServedReadiness(view, gpus, agent_->Snapshot())) {
    return *failing;
  }
  return {.ready = true, .check_id = "", .reason = "AllDevicesReady",
          .message = absl::StrCat(gpus.size(), " GPUs bound, healthy, registered and allocatable: ",
                                  absl::StrJoin(gpus, ","))};
}

std::optional<Readiness> Daemon::Impl::DraReadiness(const std::vector<std::string>& required,
                                                    const plugin::DeviceSnapshot& expected) {
  metrics_.SetValidation(host_checks_);
  std::map<std::string, const dra::GpuDevice*> published;
  const std::vector<dra::GpuDevice> devices = dra_->Devices();
  for (const dra::GpuDevice& device : devices) published[device.bdf] = &device;
  std::vector<std::string> behind, unhealthy;
  for (const std::string& bdf : required) {
    auto it = published.find(bdf);
    const bool healthy_here = std::any_of(expected.resources.begin(), expected.resources.end(), [&](const auto& r) {
      const plugin::PluginDevice* device = r.second.Find(bdf);
      return device != nullptr && device->healthy;
    });
    if (it == published.end() || (!it->second->healthy() && healthy_here)) {
      behind.push_back(bdf);
    } else if (!it->second->healthy()) {
      unhealthy.push_back(absl::StrCat(bdf, " (", it->second->unhealthy_reason, ")"));
    }
  }
  if (!unhealthy.empty()) {
    return Readiness{.ready = false, .check_id = "dra.healthy", .reason = "DeviceUnhealthy",
                     .message = absl::StrCat("dra.healthy: ", absl::StrJoin(unhealthy, "; "))};
  }
  if (!behind.empty()) {
    return Readiness{.ready = false, .check_id = "dra.published", .reason = "DeviceNotAdvertised",
                     .message = absl::StrCat("dra.published: bound but not published healthy yet: ",
                                             absl::StrJoin(behind, ","))};
  }
  return DraServing();
}

std::optional<Readiness> Daemon::Impl::DraServing() {
  if (const dra::RegistrationStatus registration = dra_->Registration(); !registration.registered) {
    return Readiness{.ready = false, .check_id = "dra.registered", .reason = "NotRegistered",
                     .message = absl::StrCat("dra.registered: the kubelet has not accepted DRA driver ",
                                             options_.dra->driver_name,
                                             registration.error.empty() ? "" : ": " + registration.error)};
  }
  if (const std::string error = dra_->SliceError(); !error.empty()) {
    return Readiness{.ready = false, .check_id = "dra.slices", .reason = "SlicesNotPublished",
                     .message = absl::StrCat("dra.slices: ", error)};
  }
  return std::nullopt;
}

Readiness Daemon::Impl::EvaluateVgpuDra() {
  metrics_.SetValidation(host_checks_);
  const std::vector<dra::GpuDevice> devices = dra_->Devices();
  const auto healthy = std::count_if(devices.begin(), devices.end(), [](const auto& d) { return d.healthy(); });
  if (devices.empty()) {
    return {.ready = true, .check_id = "", .reason = "NoSelectedDevices",
            .message = "no vGPU on this node (none created yet); nothing to publish"};
  }
  if (std::optional<Readiness> failing = DraServing()) return *failing;
  const auto unhealthy = static_cast<std::ptrdiff_t>(devices.size()) - healthy;
  return {.ready = true, .check_id = "", .reason = "AllDevicesReady",
          .message = absl::StrCat(healthy, " vGPUs healthy and published as DRA devices",
                                  unhealthy == 0 ? "" : absl::StrCat("; ", unhealthy, " unhealthy"))};
}

// A vGPU's health is not the node's readiness: vGPUs come and go with the profile config (a removed one stays
// listed Unhealthy for a while), and each change is an event of its own (PublishDevices).
Readiness Daemon::Impl::EvaluateVgpu() {
  if (dra_) return EvaluateVgpuDra();
  const plugin::DeviceSnapshot served = agent_->Snapshot();
  int healthy = 0, unhealthy = 0;
  for (const auto& [name, resource] : served.resources) {
    for (const plugin::PluginDevice& device : resource.devices) ++(device.healthy ? healthy : unhealthy);
  }
  if (healthy + unhealthy == 0) {
    metrics_.SetValidation(host_checks_);
    return {.ready = true, .check_id = "", .reason = "NoSelectedDevices",
            .message = "no vGPU on this node (none created yet); nothing to advertise"};
  }
  const validation::NodeView view{.paths = options_.serve.paths, .inventory = nullptr, .selection = nullptr,
                                  .expected = &served};
  if (std::optional<Readiness> failing = ServedReadiness(view, {}, served)) return *failing;
  return {.ready = true, .check_id = "", .reason = "AllDevicesReady",
          .message = absl::StrCat(healthy, " vGPUs healthy, registered and allocatable in ", served.resources.size(),
                                  " resources", unhealthy == 0 ? "" : absl::StrCat("; ", unhealthy, " unhealthy"))};
}

std::optional<Readiness> Daemon::Impl::ServedReadiness(const validation::NodeView& view,
                                                       const std::vector<std::string>& required,
                                                       const plugin::DeviceSnapshot& served) {
  std::vector<std::string> missing, unhealthy;
  for (const std::string& bdf : required) {
    const plugin::PluginDevice* device = nullptr;
    for (const auto& [name, resource] : served.resources) {
      if ((device = resource.Find(bdf)) != nullptr) break;
    }
    if (device == nullptr) {
      missing.push_back(bdf);
    } else if (!device->healthy) {
      unhealthy.push_back(absl::StrCat(bdf, " (", device->unhealthy_reason, ")"));
    }
  }
  if (!missing.empty()) {
    metrics_.SetValidation(host_checks_);
    return Readiness{.ready = false, .check_id = "plugin.advertised", .reason = "DeviceNotAdvertised",
            .message = absl::StrCat("plugin.advertised: bound but not advertised yet: ", absl::StrJoin(missing, ","))};
  }
  if (!unhealthy.empty()) {
    metrics_.SetValidation(host_checks_);
    return Readiness{.ready = false, .check_id = "plugin.healthy", .reason = "DeviceUnhealthy",
            .message = absl::StrCat("plugin.healthy: ", absl::StrJoin(unhealthy, "; "))};
  }
  std::vector<std::string> unregistered;
  std::string served_key = absl::StrCat("restarts=", kubelet_restarts_.load(), ";");
  for (const plugin::ResourceStatus& resource : agent_->Resources()) {
    absl::StrAppend(&served_key, resource.resource_name, ":", resource.registrations, ";");
    metrics_.SetRegistrations(resource.resource_name, resource.registrations);
    auto it = served.resources.find(resource.resource_name);
    if (it != served.resources.end() && !it->second.devices.empty() && !resource.registered) {
      unregistered.push_back(resource.resource_name);
    }
  }
  if (!unregistered.empty()) {
    metrics_.SetValidation(host_checks_);
    return Readiness{.ready = false, .check_id = "plugin.registered", .reason = "NotRegistered",
            .message = absl::StrCat("plugin.registered: not registered with the kubelet: ",
                                    absl::StrJoin(unregistered, ","))};
  }
  for (const auto& [name, resource] : served.resources) {
    for (const plugin::PluginDevice& device : resource.devices) absl::StrAppend(&served_key, device.id, device.healthy);
  }
  // The kubelet's allocatable set changes only with what we send it (or a kubelet restart, which we see):
  // asked again when that changed, after a failure, and at least every kKubeletRecheck.
  const Clock::time_point now = Clock::now();
  const bool kubelet_passed = std::none_of(kubelet_checks_.begin(), kubelet_checks_.end(), [](const auto& check) {
    return check.result == validation::Result::kFail;
  });
  if (served_key != kubelet_key_ || !kubelet_passed || now >= kubelet_checked_ + kKubeletRecheck) {
    kubelet_checks_ = validation::KubeletChecks(view, options_.serve.paths.pod_resources_socket, options_.kubelet_wait);
    kubelet_key_ = served_key;
    kubelet_checked_ = now;
  }
  const std::vector<validation::Check>& kubelet = kubelet_checks_;
  std::vector<validation::Check> checks = host_checks_;
  checks.insert(checks.end(), kubelet.begin(), kubelet.end());
  metrics_.SetValidation(checks);
  for (const validation::Check& check : kubelet) {
    if (check.result != validation::Result::kFail) continue;
    return Readiness{.ready = false, .check_id = check.id, .reason = "NotAllocatable",
                     .message = absl::StrCat(check.id, ": ", check.subject, ": ", check.message)};
  }
  return std::nullopt;
}

// Layers 1-2 of the validator, run again only when a managed function changed driver (they read sysfs and
// the dev tree, never a device's config space in D3cold); they decide the GPU Operator's status files.
void Daemon::Impl::RunHostChecks(const validation::NodeView& view, const std::string& fingerprint) {
  if (fingerprint == host_fingerprint_ && host_ready_written_) return;
  host_fingerprint_ = fingerprint;
  host_checks_ = validation::PlatformChecks(view);
  std::vector<validation::Check> devices = validation::DeviceChecks(view);
  host_checks_.insert(host_checks_.end(), devices.begin(), devices.end());
  const bool host_ready = std::none_of(host_checks_.begin(), host_checks_.end(), [](const validation::Check& check) {
    return check.result == validation::Result::kFail;
  });
  if (options_.status_dir.empty() || host_ready_written_ == host_ready) return;
  if (absl::Status status = validation::WriteStatusFiles(options_.status_dir, host_ready); !status.ok()) {
    spdlog::error("status files: {}", status.ToString());
    return;
  }
  host_ready_written_ = host_ready;
  spdlog::info("status files in {}: host {}", options_.status_dir.string(), host_ready ? "ready" : "not ready");
}

void Daemon::Impl::Settle(Readiness* readiness) {
  if (readiness->ready || !ClearsByItself(readiness->check_id)) {
    settling_since_.reset();
    return;
  }
  const Clock::time_point now = Clock::now();
  if (!settling_since_) settling_since_ = now;
  readiness->settling = now - *settling_since_ < options_.registration_grace;
}

}  // namespace vfio_agent::daemon
