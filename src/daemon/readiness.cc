// What the node is ready for after a pass: the host checks (validation's platform and devices layers, the status
// files), the binds, Fabric Manager, then the frontend's side (advertised or published, healthy, registered,
// allocatable or written to slices). The first failing check is the reason.
#include "daemon_impl.h"

namespace vfio_agent::daemon {

Readiness Daemon::Impl::Evaluate(const pci::Inventory& inventory, const pci::Selection& selection,
                                 const node::Snapshot& model, const node::ServedDevices& expected) {
  std::vector<std::string> managed = selection.gpus;
  managed.insert(managed.end(), selection.companions.begin(), selection.companions.end());
  std::vector<std::string> gpus;
  for (const std::string& bdf : selection.gpus) {
    if (selection.RoleOf(bdf) == pci::Role::kGpu) gpus.push_back(bdf);
  }

  validation::NodeView view{.paths = options_.serve.paths, .inventory = &inventory, .selection = &selection,
                            .model = &model, .served = &expected};
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
  const node::FrontendReadiness answer =
      frontend_->Readiness({.required = gpus, .expected = expected, .vgpus = false});
  if (std::optional<Readiness> failing = FrontendReadiness(answer, view)) return *failing;
  return {.ready = true, .check_id = "", .reason = "AllDevicesReady",
          .message = absl::StrCat(gpus.size(), " GPUs bound, healthy, registered and allocatable: ",
                                  absl::StrJoin(gpus, ","))};
}

// A vGPU's health is not the node's readiness: vGPUs come and go with the profile config (a removed one stays
// listed Unhealthy for a while), and each change is an event of its own (PublishDevices).
Readiness Daemon::Impl::EvaluateVgpu() {
  const node::FrontendReadiness answer = frontend_->Readiness({.required = {}, .expected = {}, .vgpus = true});
  if (answer.nothing_served) {
    metrics_.SetValidation(host_checks_);
    return {.ready = true, .check_id = "", .reason = "NoSelectedDevices", .message = answer.summary};
  }
  // The kubelet should hold what the frontend serves (its vGPUs gone from the scan are kept a while, Unhealthy, which
  // no model of one scan has).
  const validation::NodeView view{.paths = options_.serve.paths, .inventory = nullptr, .selection = nullptr,
                                  .served = &answer.served};
  if (std::optional<Readiness> failing = FrontendReadiness(answer, view)) return *failing;
  return {.ready = true, .check_id = "", .reason = "AllDevicesReady", .message = answer.summary};
}

std::optional<Readiness> Daemon::Impl::FrontendReadiness(const node::FrontendReadiness& answer,
                                                         const validation::NodeView& view) {
  for (const auto& [resource_name, registrations] : answer.registrations) {
    metrics_.SetRegistrations(resource_name, registrations);
  }
  if (answer.failing) {
    metrics_.SetValidation(host_checks_);
    return Readiness{.ready = false, .check_id = answer.failing->id, .reason = answer.failing->reason,
                     .message = answer.failing->message};
  }
  if (!answer.allocatable_key) {
    metrics_.SetValidation(host_checks_);
    return std::nullopt;
  }
  // The kubelet's allocatable set changes only with what the frontend sends it (or a kubelet restart, which we see):
  // asked again when that changed, after a failure, and at least every kKubeletRecheck.
  const std::string served_key = absl::StrCat("restarts=", kubelet_restarts_.load(), ";", *answer.allocatable_key);
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
