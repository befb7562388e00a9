// The workload mode and the vGPUs: the node label that chooses vm-passthrough or vm-vgpu (watched, else polled), a
// switch carried out by the running agent, the GPUs that wait for their VM to end, and vm-vgpu's profile config.
#include "daemon_impl.h"

namespace vfio_agent::daemon {

absl::Status Daemon::Impl::PassVgpu(Clock::time_point start) {
  // vGPU names come from the agent's discovery (its catalogs): before it serves, the operator's labels and
  // NVIDIA's own plugin sockets are what tells another manager apart.
  if (refused_ && StillRefused({})) return absl::OkStatus();
  // The pass's scan (with the vGPU discovery); a move or a profile change scans again, which hands the frontend
  // the vGPUs as they are now.
  vgpu_changed_ = false;
  absl::StatusOr<std::shared_ptr<const node::State>> state = Scan();
  if (state.ok()) {
    ReleaseToHostDriver(**state);
  } else {
    spdlog::warn("workload mode: {}", state.status().ToString());
  }
  // Before the plugin's first snapshot, so that it already advertises the vGPUs made now.
  ApplyVgpuProfiles();
  if (vgpu_changed_ || !state.ok()) {
    if (vgpu_changed_) TakeOwnEvents();
    if (absl::StatusOr<std::shared_ptr<const node::State>> after = Scan(); !after.ok()) {
      spdlog::warn("vGPU: rescan: {}", after.status().ToString());
    }
  }
  if (!serving_) {
    if (absl::Status status = frontend_->Start(); !status.ok()) return status;
    serving_ = true;
  }
  PublishDevices(frontend_->Served({}));
  Conclude(WithHeld(EvaluateVgpu()), start);
  // A freed vGPU raises nothing the loop waits on (the VM closing its group node is no directory change).
  if (vgpu_retry_at_) next_pass_ = std::min(next_pass_, *vgpu_retry_at_);
  if (mode_retry_at_) next_pass_ = std::min(next_pass_, *mode_retry_at_);
  return absl::OkStatus();
}

void Daemon::Impl::ApplyVgpuProfiles() {
  vgpu_retry_at_.reset();
  if (options_.vgpu_config_file.empty()) return;
  std::string name = options_.vgpu_config;
  if (reporter_) {
    const absl::StatusOr<Labels>& labels = PassLabels();
    if (labels.ok()) {
      auto it = labels->find(kVgpuConfigLabel);
      if (it != labels->end() && !it->second.empty()) name = it->second;
    } else {
      spdlog::warn("vGPU config: node labels unreadable ({}); using {}", labels.status().ToString(),
                   name.empty() ? std::string("none") : absl::StrCat("--vgpu-config ", name));
    }
  }
  if (name.empty()) {
    PublishVgpuConfig("", kube::EventType::kNormal, "", "", false);
    return;
  }
  absl::StatusOr<vgpu::VgpuConfigFile> file = vgpu::LoadVgpuConfig(options_.vgpu_config_file);
  vgpu::ApplyOptions apply{.paths = options_.serve.paths, .catalog = nullptr, .new_uuid = {}, .claimed = {}};
  // The vGPUs the frontend's clients hold before their VM opens them (a prepared DRA claim's): vgpu is below the
  // frontends, so the daemon hands them over.
  absl::StatusOr<std::map<std::string, std::string>> held = frontend_->HeldVgpus();
  if (!held.ok()) {
    // Without it no vGPU can be known free of a claim: nothing is changed this pass.
    vgpu_retry_at_ = Clock::now() + options_.vgpu_retry;
    PublishVgpuConfig("pending", kube::EventType::kWarning, "VgpuConfigPending",
                      absl::StrCat("vGPU config '", name, "': ", held.status().message(),
                                   "; no vGPU is changed until it can"),
                      false);
    return;
  }
  apply.claimed = *std::move(held);
  absl::StatusOr<vgpu::ApplyReport> report = absl::UnknownError("not applied");
  if (!file.ok()) {
    report = file.status();
  } else {
    // The catalog is the source's: a scan and the applier never read or write it at the same time.
    source_.WithCatalog([&](vgpu::CatalogStore& catalog) {
      apply.catalog = &catalog;
      report = vgpu::ApplyVgpuConfig(apply, *file, name);
    });
  }
  const std::string what = absl::StrCat("vGPU config '", name, "'");
  if (!report.ok()) {
    vgpu_retry_at_ = Clock::now() + options_.vgpu_retry;
    PublishVgpuConfig("failed", kube::EventType::kWarning, "VgpuConfigFailed",
                      absl::StrCat(what, ": ", report.status().message()), false);
    return;
  }
  // Advertised now rather than at the plugin's next rescan: the pass scans again.
  if (report->changed()) vgpu_changed_ = true;
  std::vector<std::string> failed, pending;
  int created = 0, removed = 0;
  for (const vgpu::GpuApplyResult& gpu : report->gpus) {
    created += static_cast<int>(gpu.created.size());
    removed += static_cast<int>(gpu.removed.size());
    if (gpu.outcome == vgpu::GpuOutcome::kFailed || gpu.outcome == vgpu::GpuOutcome::kDoesNotFit) {
      failed.emplace_back(gpu.error.message());
    }
    if (gpu.outcome == vgpu::GpuOutcome::kPendingHeld) {
      pending.push_back(absl::StrCat("GPU ", gpu.bdf, " waits for a VM to free ", absl::StrJoin(gpu.held, "; ")));
    }
  }
  const std::string state = report->State();
  // A config that does not fit is not tried again on a timer: the next pass the config or the cards cause is.
  if (report->RetryLater()) vgpu_retry_at_ = Clock::now() + options_.vgpu_retry;
  if (state == "failed") {
    PublishVgpuConfig(state, kube::EventType::kWarning, "VgpuConfigFailed",
                      absl::StrCat(what, ": ", absl::StrJoin(failed, "; ")), report->changed());
  } else if (state == "pending") {
    PublishVgpuConfig(state, kube::EventType::kNormal, "VgpuConfigPending",
                      absl::StrCat(what, ": ", absl::StrJoin(pending, "; ")), report->changed());
  } else {
    PublishVgpuConfig(state, kube::EventType::kNormal, "VgpuConfigApplied",
                      absl::StrCat(what, " applied: ", report->gpus.size(), " GPUs as configured"), report->changed(),
                      report->changed() ? absl::StrCat(" (", created, " vGPUs created, ", removed, " removed)") : "");
  }
}

// The label on every pass (the reporter writes it only when the node lacks it); the event and the log line when
// the outcome changed, or when the host did.
void Daemon::Impl::PublishVgpuConfig(const std::string& state, kube::EventType type, const std::string& reason,
                                     const std::string& message, bool changed, const std::string& what_changed) {
  if (state.empty()) {
    if (vgpu_outcome_ != "none") spdlog::info("vGPU config: none chosen (no {} label, no --vgpu-config)", kVgpuConfigLabel);
    metrics_.SetVgpuConfigState("");
    vgpu_outcome_ = "none";
    return;
  }
  if (reporter_) reporter_->SetLabel(kVgpuConfigStateLabel, state);
  metrics_.SetVgpuConfigState(state);
  const std::string outcome = absl::StrCat(state, ":", message);
  if (outcome == vgpu_outcome_ && !changed) return;
  vgpu_outcome_ = outcome;
  const std::string note = message + what_changed;
  if (type == kube::EventType::kWarning) {
    spdlog::warn("{}", note);
  } else {
    spdlog::info("{}", note);
  }
  Event(type, reason, "ApplyingVgpuConfig", note);
}

const absl::StatusOr<Labels>& Daemon::Impl::PassLabels() {
  if (!pass_labels_) pass_labels_ = reporter_->NodeLabels(kLabelsTimeout);
  if (pass_labels_->ok()) acted_labels_ = RelevantLabels(**pass_labels_);
  return *pass_labels_;
}

std::optional<Labels> Daemon::Impl::WatchedLabels() {
  std::lock_guard lock(watch_mu_);
  return watched_labels_;
}

bool Daemon::Impl::WorkloadLabelChanged() {
  next_label_check_ = Clock::now() + options_.workload_label_interval;
  absl::StatusOr<Labels> labels = reporter_->NodeLabels(kLabelsTimeout);
  if (!labels.ok() || WorkloadLabelOf(*labels) == workload_label_) return false;
  polled_labels_ = std::move(labels);  // the pass this starts reads them from here
  return true;
}

void Daemon::Impl::FollowWorkloadLabel() {
  if (!reporter_) return;
  next_label_check_ = Clock::now() + options_.workload_label_interval;
  const Workload current = options_.serve.workload;
  const absl::StatusOr<Labels>& labels = PassLabels();
  if (!labels.ok()) {
    if (!workload_labels_error_logged_) {
      spdlog::warn("workload mode: node labels unreadable ({}); staying in {}", labels.status().ToString(),
                   WorkloadName(current));
    }
    workload_labels_error_logged_ = true;
    return;
  }
  workload_labels_error_logged_ = false;
  const std::string value = WorkloadLabelOf(*labels);
  const bool news = value != workload_label_;
  workload_label_ = value;
  Workload wanted = flag_workload_;
  std::string why = absl::StrCat("no node label ", kWorkloadLabel, "; --workload ", WorkloadName(flag_workload_));
  if (!value.empty()) {
    absl::StatusOr<Workload> parsed = ParseWorkload(value);
    if (!parsed.ok()) {
      if (news) {
        const std::string note = absl::StrCat("node label ", kWorkloadLabel, "=", value,
                                              " is not a mode this agent serves (vm-passthrough or vm-vgpu); staying in ",
                                              WorkloadName(current));
        spdlog::warn("workload mode: {}", note);
        Event(kube::EventType::kWarning, "WorkloadModeUnknown", "SwitchingMode", note);
      }
      return;
    }
    wanted = *parsed;
    why = absl::StrCat("node label ", kWorkloadLabel, "=", value);
  }
  if (wanted == current) return;
  // A frontend that cannot change mode while it serves (the DRA driver) is made anew in the wanted mode before it
  // serves, and keeps its mode after; the device plugin switches live.
  if (std::optional<std::string> refusal = frontend_->LiveSwitchRefusal(current)) {
    if (!serving_) {
      if (absl::Status modes = frontend_->Supports(wanted); !modes.ok()) {
        if (news) {
          const std::string note = absl::StrCat(why, " asks for ", WorkloadName(wanted), ", which this agent refuses: ",
                                                modes.message(), "; staying in ", WorkloadName(current));
          spdlog::warn("workload mode: {}", note);
          Event(kube::EventType::kWarning, "WorkloadModeUnsupported", "SwitchingMode", note);
        }
        return;
      }
      // Not serving yet: the frontend starts in the label's mode.
      spdlog::info("workload mode: {} ({})", WorkloadName(wanted), why);
      options_.serve.workload = wanted;
      source_.SetWorkload(wanted);
      frontend_ = MakeFrontend();
      return;
    }
    if (news) {
      const std::string note = absl::StrCat(why, " asks for ", WorkloadName(wanted), "; ", *refusal);
      spdlog::warn("workload mode: {}", note);
      Event(kube::EventType::kWarning, "WorkloadModeUnsupported", "SwitchingMode", note);
    }
    return;
  }
  SwitchMode(wanted, why);
}

// The old mode's plugin deregisters first (an empty list on every stream, its sockets removed: the kubelet's
// count of its resources drops to 0), then the new mode's agent is served by this pass, after the GPUs moved.
void Daemon::Impl::SwitchMode(Workload wanted, const std::string& why) {
  if (started_) {
    mode_change_ = absl::StrCat(WorkloadName(options_.serve.workload), " -> ", WorkloadName(wanted), " (", why, ")");
    spdlog::info("workload mode: {}", mode_change_);
  } else {
    spdlog::info("workload mode: {} ({})", WorkloadName(wanted), why);  // the start's mode, nothing changed
  }
  if (serving_) {
    frontend_->Stop();
    serving_ = false;
  }
  options_.serve.workload = wanted;
  source_.SetWorkload(wanted);  // this pass's scan is of the new mode
  frontend_ = MakeFrontend();
  frontend_->SetKubevirtRelease(agent_release_);
  // What the passes of the old mode kept about its devices.
  backoff_.clear();
  bind_failures_.clear();
  health_seen_.clear();
  kubelet_key_.clear();
  host_fingerprint_.clear();
  settling_since_.reset();
  vgpu_outcome_.clear();
  vgpu_retry_at_.reset();
  mode_held_.clear();
  mode_retry_at_.reset();
}

void Daemon::Impl::ReportModeChange(const std::string& what) {
  if (mode_change_.empty()) return;
  std::string note = absl::StrCat("workload mode ", mode_change_, ": ", what);
  if (!mode_held_.empty()) {
    absl::StrAppend(&note, "; ", mode_held_.size(), " GPUs move once their VM ends: ",
                    absl::StrJoin(mode_held_, "; ", absl::PairFormatter(" held by ")));
  }
  spdlog::info("{}", note);
  Event(kube::EventType::kNormal, "WorkloadModeChanged", "SwitchingMode", note);
  mode_change_.clear();
}

std::map<std::string, std::string> Daemon::Impl::WhoHolds(const std::vector<InUse>& in_use,
                                                          const std::set<std::string>& resource_names) {
  std::map<std::string, std::vector<std::string>> who;  // GPU -> pods, then pids
  absl::StatusOr<std::vector<plugin::HeldByContainer>> pods =
      plugin::HeldDevicesByPod(options_.serve.paths.pod_resources_socket, resource_names, options_.kubelet_wait);
  if (!pods.ok()) {
    // Whether a pod was given the GPU is unknown: it stays where it is until the kubelet answers.
    for (const InUse& use : in_use) who[use.gpu] = {absl::StrCat("unknown pods (", pods.status().message(), ")")};
  } else {
    for (const plugin::HeldByContainer& container : *pods) {
      for (const InUse& use : in_use) {
        const std::string pod = absl::StrCat("pod ", container.pod_namespace, "/", container.pod_name);
        std::vector<std::string>& names = who[use.gpu];
        if (container.ids.contains(use.id) && std::find(names.begin(), names.end(), pod) == names.end()) {
          names.push_back(pod);
        }
      }
    }
  }
  const std::map<int, std::vector<binding::Holder>> openers = binding::VfioGroupOpenersByGroup(options_.serve.paths);
  for (const InUse& use : in_use) {
    auto it = use.group ? openers.find(*use.group) : openers.end();
    if (it == openers.end()) continue;
    for (const binding::Holder& holder : it->second) who[use.gpu].push_back(holder.ToString());
  }
  std::map<std::string, std::string> held;
  for (const auto& [gpu, names] : who) {
    if (!names.empty()) held[gpu] = absl::StrJoin(names, ", ");
  }
  return held;
}

void Daemon::Impl::NoteHeld(std::map<std::string, std::string> held, const std::string& driver) {
  for (const auto& [bdf, who] : held) {
    auto it = mode_held_.find(bdf);
    if (it != mode_held_.end() && it->second == who) continue;
    const std::string note = absl::StrCat("GPU ", bdf, " stays on ", driver, " until its VM ends (", 
                                          WorkloadName(options_.serve.workload), " waits for it): held by ", who);
    spdlog::warn("workload mode: {}", note);
    Event(kube::EventType::kWarning, "GPUNotMoved", "SwitchingMode", note);
  }
  mode_held_ = std::move(held);
  mode_retry_at_.reset();
  if (!mode_held_.empty()) mode_retry_at_ = Clock::now() + options_.mode_retry;
}

void Daemon::Impl::ReleaseToHostDriver(const node::State& state) {
  const HostPaths& paths = options_.serve.paths;
  const pci::Inventory* inventory = &state.inventory;
  const pci::Selection& selection = state.selection;
  const std::set<int> allowed_groups = AllowedGroups(*inventory);
  const Clock::time_point now = Clock::now();
  // A device off vfio has nothing left to retry (an expired backoff would keep waking the loop).
  std::erase_if(backoff_, [&](const auto& entry) {
    const pci::Function* fn = inventory->Find(entry.first);
    return fn == nullptr || !pci::IsVfioDriver(fn->driver);
  });
  std::vector<InUse> on_vfio;
  for (const std::string& bdf : selection.gpus) {
    const pci::Function* fn = inventory->Find(bdf);
    if (selection.RoleOf(bdf) != pci::Role::kGpu || fn == nullptr || !fn->iommu_group ||
        !pci::IsVfioDriver(fn->driver) || BackingOff(bdf, now) ||
        (!options_.bind.targets.every_selected() && !allowed_groups.contains(*fn->iommu_group))) {
      continue;
    }
    on_vfio.push_back({.gpu = bdf, .group = fn->iommu_group, .id = bdf});
  }
  if (on_vfio.empty()) {
    NoteHeld({}, "");
    ReportModeChange("no GPU was on vfio-pci; vGPUs advertised");
    return;
  }
  // The names the device plugin serves them under: those of the whole devices on vfio.
  std::set<std::string> passthrough_names;
  for (const node::ServedDevice& device :
       node::ServedOf(node::Build(paths, *inventory, selection, source_.names(), nullptr), node::WholeDevices::kOnVfio)) {
    passthrough_names.insert(device.resource_name);
  }
  std::map<std::string, std::string> held = WhoHolds(on_vfio, passthrough_names);
  binding::UnbindOptions unbind;
  unbind.paths = paths;
  unbind.policy = options_.serve.policy;
  unbind.write_timeout = options_.bind.write_timeout;
  std::set<int> held_groups;
  for (const InUse& use : on_vfio) {
    if (held.contains(use.gpu)) held_groups.insert(*use.group);
  }
  for (const InUse& use : on_vfio) {
    if (!held_groups.contains(*use.group)) unbind.groups.push_back(*use.group);
  }
  std::sort(unbind.groups.begin(), unbind.groups.end());
  unbind.groups.erase(std::unique(unbind.groups.begin(), unbind.groups.end()), unbind.groups.end());
  std::vector<std::string> moved, failed;
  if (!unbind.groups.empty()) {
    absl::StatusOr<binding::BindReport> report = binding::Unbind(unbind);
    if (!report.ok()) {
      failed.emplace_back(report.status().message());
    } else {
      for (const binding::DeviceResult& result : report->devices) {
        if (result.role != pci::Role::kGpu) continue;
        if (result.outcome == binding::Outcome::kRefused) {
          std::vector<std::string> who;
          for (const binding::Holder& holder : result.holders) who.push_back(holder.ToString());
          held[result.bdf] = absl::StrJoin(who, ", ");
        } else if (result.outcome == binding::Outcome::kRestored && result.driver_after == vgpu::kNvidiaDriver) {
          moved.push_back(result.bdf);
          backoff_.erase(result.bdf);
        } else if (result.outcome == binding::Outcome::kRestored) {
          failed.push_back(absl::StrCat(result.bdf, " left vfio-pci but is on ", DriverText(result.driver_after),
                                        ", not nvidia: the vGPU manager does not drive it"));
        } else if (result.outcome != binding::Outcome::kNotBound) {
          failed.push_back(absl::StrCat(result.bdf, " ", binding::OutcomeName(result.outcome), ": ", result.reason,
                                        "; retrying in ", BackOff(result.bdf).count(), " ms"));
        }
      }
    }
  }
  NoteHeld(std::move(held), "vfio-pci");
  const std::string what = absl::StrCat(moved.size(), " GPUs moved from vfio-pci to nvidia",
                                        moved.empty() ? "" : absl::StrCat(" (", absl::StrJoin(moved, ","), ")"));
  if (!mode_change_.empty()) {
    ReportModeChange(absl::StrCat(what, "; vGPUs advertised"));
  } else if (!moved.empty()) {
    spdlog::info("workload mode vm-vgpu: {}", what);
    Event(kube::EventType::kNormal, "GPUMoved", "SwitchingMode", absl::StrCat(what, " now that no VM holds them"));
  }
  if (!failed.empty()) {
    const std::string note = absl::StrCat("not moved to nvidia for vm-vgpu: ", absl::StrJoin(failed, "; "));
    spdlog::warn("workload mode: {}", note);
    Event(kube::EventType::kWarning, "GPUNotMoved", "SwitchingMode", note);
  }
  if (!moved.empty()) vgpu_changed_ = true;  // the pass scans again
}

void Daemon::Impl::KeepHeldVgpuParents(const pci::Inventory& inventory, const pci::Selection& selection) {
  std::set<std::string> on_nvidia;
  for (const std::string& bdf : selection.gpus) {
    const pci::Function* fn = inventory.Find(bdf);
    if (selection.RoleOf(bdf) == pci::Role::kGpu && fn != nullptr && fn->driver == vgpu::kNvidiaDriver) {
      on_nvidia.insert(bdf);
    }
  }
  std::map<std::string, std::string> held;
  if (!on_nvidia.empty()) {
    absl::StatusOr<vgpu::Discovery> discovery = absl::UnknownError("not discovered");
    source_.WithCatalog([&](vgpu::CatalogStore& catalog) {
      discovery = vgpu::Discover(options_.serve.paths.sysfs_root, inventory, catalog);
    });
    if (!discovery.ok()) spdlog::warn("workload mode: vGPUs unreadable: {}", discovery.status().ToString());
    std::vector<InUse> vgpus;
    auto gpu_of = [&](const std::string& bdf) {  // an Ampere mdev's parent is a VF of the GPU
      const pci::Function* fn = inventory.Find(bdf);
      return fn != nullptr && fn->physfn ? *fn->physfn : bdf;
    };
    for (const vgpu::Mdev& mdev : discovery.ok() ? discovery->mdevs : std::vector<vgpu::Mdev>{}) {
      vgpus.push_back({.gpu = gpu_of(mdev.parent_bdf), .group = mdev.iommu_group, .id = mdev.uuid});
    }
    for (const vgpu::SriovVgpu& vgpu : discovery.ok() ? discovery->vgpus : std::vector<vgpu::SriovVgpu>{}) {
      const pci::Function* fn = inventory.Find(vgpu.bdf);
      vgpus.push_back({.gpu = vgpu.pf_bdf, .group = fn ? fn->iommu_group : std::nullopt, .id = vgpu.bdf});
    }
    std::erase_if(vgpus, [&](const InUse& use) { return !on_nvidia.contains(use.gpu); });
    if (!vgpus.empty()) {
      std::set<std::string> vgpu_names;
      const names::NameResolver vgpu_resolver(nullptr, options_.serve.domain, {});
      const node::Snapshot model =
          node::Build(options_.serve.paths, inventory, pci::Selection{}, vgpu_resolver, &*discovery);
      for (const node::ServedDevice& device : node::ServedOf(model, node::WholeDevices::kOnVfio)) {
        vgpu_names.insert(device.resource_name);
      }
      held = WhoHolds(vgpus, vgpu_names);
    }
  }
  for (const auto& [bdf, who] : held) {
    bind_failures_[bdf] = absl::StrCat(bdf, " stays on nvidia until its VM ends: a vGPU of it is held by ", who);
  }
  for (const auto& [bdf, who] : mode_held_) {
    if (!held.contains(bdf)) bind_failures_.erase(bdf);
  }
  NoteHeld(std::move(held), "nvidia");
}

Readiness Daemon::Impl::WithHeld(Readiness readiness) const {
  if (mode_held_.empty()) return readiness;
  const std::string note =
      absl::StrCat("mode.switched: GPUs wait for their VM to end before moving to nvidia for vm-vgpu: ",
                   absl::StrJoin(mode_held_, "; ", absl::PairFormatter(" held by ")));
  if (!readiness.ready) {
    absl::StrAppend(&readiness.message, "; ", note);
    return readiness;
  }
  return {.ready = false, .check_id = "mode.switched", .reason = "WorkloadModeSwitchPending", .message = note};
}

}  // namespace vfio_agent::daemon
