#include <poll.h>

#include "daemon_impl.h"

namespace vfio_agent::daemon {
namespace {

class UdevUevents final : public UeventSource {
 public:
  absl::Status Open() { return monitor_.Open(); }
  int fd() const override { return monitor_.fd(); }
  bool Drain(std::vector<std::string>* bdfs) override { return monitor_.Drain(bdfs); }

 private:
  node::UdevMonitor monitor_;
};

}  // namespace

absl::Status Daemon::Impl::Start() {
  Beat();
  if (options_.metrics_port != 0) {
    if (absl::Status status = metrics_.Listen(options_.listen_host, options_.metrics_port); !status.ok()) {
      return status;
    }
  }
  if (options_.health_port != 0) {
    if (absl::Status status = health_.Start(options_.listen_host, options_.health_port); !status.ok()) return status;
  }
  if (absl::Status status = dirs_.Open(); !status.ok()) return status;
  dirs_.Refresh(options_.serve.paths.kubelet_dir, options_.serve.paths.dev_root);
  if (!uevents_ && options_.serve.udev) {
    auto udev = std::make_unique<UdevUevents>();
    if (absl::Status status = udev->Open(); !status.ok()) {
      spdlog::warn("reconcile: no udev monitor ({}); relying on inotify and the periodic pass", status.ToString());
    } else {
      uevents_ = std::move(udev);
    }
  }
  if (reporter_) {
    // The watch's thread only stores the labels and wakes the loop; the pass reads them.
    reporter_->WatchLabels([this](const Labels& labels) {
      {
        std::lock_guard lock(watch_mu_);
        watched_labels_ = labels;
      }
      label_wakeup_.Notify();
    });
  }
  if (reporter_ && frontend_->FollowsKubevirtRelease()) {
    // --vfio-backend auto follows the KubeVirt release. Called on the API worker (va-kube-api), which only stores it
    // and wakes the loop: frontend_ is the loop's (a mode switch replaces it), so the pass hands it over.
    reporter_->WatchKubevirtRelease([this](const std::optional<kube::KubevirtRelease>& release) {
      {
        std::lock_guard lock(watch_mu_);
        told_release_ = release;
      }
      wakeup_.Notify();
    });
  }
  if (absl::Status status = Pass(); !status.ok()) {
    health_.Shutdown();
    return status;
  }
  started_ = true;
  loop_ = std::thread([this] {
    NameThisThread("va-reconcile");
    Loop();
  });
  return absl::OkStatus();
}

void Daemon::Impl::Stop() {
  if (stopping_.exchange(true)) return;
  wakeup_.Notify();
  if (loop_.joinable()) loop_.join();
  {
    std::lock_guard lock(state_mu_);  // a ReconcileNow between its check and its wait sees this notify
  }
  pass_cv_.notify_all();
  ready_ = false;
  if (started_ && reporter_) {
    // Before deregistering: the kubelet's capacity drops to 0 next, and a True condition must not outlive that.
    reporter_->SetCondition({.status = kube::ConditionStatus::kUnknown,
                             .reason = "AgentStopped",
                             .message = absl::StrCat(
                                 "vfio-gpu-agent stopped; the ",
                                 options_.serve.workload == Workload::kVmVgpu ? "vGPUs stay as they are"
                                                                              : "GPUs stay bound to vfio-pci",
                                 " and the kubelet advertises none until the agent runs again, which sets this "
                                 "condition anew")});
    if (absl::Status status = reporter_->FlushCondition(options_.stop_report_timeout); !status.ok()) {
      spdlog::warn("run: AgentStopped condition not stored: {}", status.ToString());
    }
  }
  frontend_->Stop();
  health_.Shutdown();
  if (started_) spdlog::info("run: stopped; every device stays on its driver");
}

void Daemon::Impl::Loop() {
  // The loop turns at least four times per `live_limit`, so that liveness has a heartbeat to see; everything
  // else wakes it through its file descriptors or the next deadline.
  const milliseconds max_wait = std::chrono::duration_cast<milliseconds>(options_.live_limit) / 4;
  while (!stopping_) {
    Clock::time_point next = std::min(next_pass_, Clock::now() + max_wait);
    if (refused_) next = std::min(next, next_coexistence_);
    const bool watched = WatchedLabels().has_value();  // then the watch says when a label changed: no poll
    if (reporter_ && !watched) next = std::min(next, next_label_check_);
    for (const auto& [bdf, backoff] : backoff_) next = std::min(next, backoff.next);
    next = std::min({next, settle_rescan_, next_safety_scan_});
    const auto wait = std::chrono::ceil<milliseconds>(next - Clock::now());
    const int timeout_ms = static_cast<int>(std::clamp<int64_t>(wait.count(), 0, max_wait.count()));
    const int uevent_fd = uevents_ ? uevents_->fd() : -1;  // poll(2) skips a negative fd
    pollfd fds[4] = {{wakeup_.fd(), POLLIN, 0}, {dirs_.fd(), POLLIN, 0}, {label_wakeup_.fd(), POLLIN, 0},
                     {uevent_fd, POLLIN, 0}};
    ::poll(fds, 4, timeout_ms);
    Beat();
    if (stopping_) return;
    bool pass = Clock::now() >= next_pass_;
    if (fds[0].revents & POLLIN) {
      wakeup_.Drain();
      pass = true;
    }
    bool device_event = (fds[1].revents & POLLIN) && dirs_.Drain().devices;
    if (fds[2].revents & POLLIN) {
      label_wakeup_.Drain();
      std::optional<Labels> labels = WatchedLabels();
      if (labels && RelevantLabels(*labels) != acted_labels_) pass = true;
    }
    if (uevent_fd >= 0 && (fds[3].revents & POLLIN)) {
      std::vector<std::string> bdfs;
      if (uevents_->Drain(&bdfs)) device_event = true;
      // A uevent for a device is news about it (a holder let go, a reset finished): retry it now.
      for (const std::string& bdf : bdfs) backoff_.erase(bdf);
    }
    dirs_.Refresh(options_.serve.paths.kubelet_dir, options_.serve.paths.dev_root);
    const Clock::time_point now = Clock::now();
    if (device_event) {
      pass = true;
      // sysfs may lag /dev (a group node appears during the probe, the driver link after it): the frontend is
      // handed one more scan shortly.
      settle_rescan_ = now + kSettleRescan;
    } else if (now >= settle_rescan_) {
      settle_rescan_ = Clock::time_point::max();
      if (!pass) {
        if (absl::StatusOr<std::shared_ptr<const node::State>> state = Scan(); !state.ok()) {
          spdlog::warn("reconcile: rescan: {}", state.status().ToString());
        }
      }
    }
    if (refused_ && now >= next_coexistence_) pass = true;
    if (reporter_ && !WatchedLabels() && now >= next_label_check_ && WorkloadLabelChanged()) pass = true;
    for (const auto& [bdf, backoff] : backoff_) pass = pass || now >= backoff.next;
    if (!pass && now >= next_safety_scan_) {
      // --rescan-interval: what no event reports (a config space that stopped answering) is found by a scan, and
      // the frontend hears it from the source without a whole pass, as when it rescanned on its own.
      if (absl::StatusOr<std::shared_ptr<const node::State>> state = Scan(); !state.ok()) {
        spdlog::warn("reconcile: rescan: {}", state.status().ToString());
      }
    }
    if (!pass) continue;
    if (absl::Status status = Pass(); !status.ok()) spdlog::error("reconcile: {}", status.ToString());
  }
}

void Daemon::Impl::TakeOwnEvents() {
  dirs_.Drain();
  if (!uevents_) return;
  std::vector<std::string> bdfs;
  uevents_->Drain(&bdfs);
  for (const std::string& bdf : bdfs) {
    if (backoff_.erase(bdf) > 0) next_pass_ = Clock::now();
  }
}

absl::Status Daemon::Impl::Pass() {
  {
    std::lock_guard lock(state_mu_);
    ++passes_started_;
  }
  absl::Status status = PassOnce();
  {
    std::lock_guard lock(state_mu_);
    ++passes_done_;
  }
  pass_cv_.notify_all();
  return status;
}

absl::Status Daemon::Impl::PassOnce() {
  const Clock::time_point start = Clock::now();
  {
    std::lock_guard lock(watch_mu_);
    if (told_release_ != agent_release_) {
      agent_release_ = told_release_;
      frontend_->SetKubevirtRelease(agent_release_);
    }
  }
  // The label is read once per workload_label_interval, not every pass: a node at rest sends the API nothing else.
  pass_labels_ = std::exchange(polled_labels_, std::nullopt);
  if (std::optional<Labels> watched = WatchedLabels(); watched && !pass_labels_) pass_labels_ = *std::move(watched);
  if (reporter_ && (pass_labels_ || Clock::now() >= next_label_check_)) FollowWorkloadLabel();
  // A passthrough node has no vGPU config: a state label left from vm-vgpu (ours or vgpu-device-manager's) would
  // say that profiles are applied which are gone. Looked at whenever this pass read the labels.
  if (options_.serve.workload == Workload::kVmPassthrough && pass_labels_ && pass_labels_->ok() &&
      (*pass_labels_)->contains(kVgpuConfigStateLabel)) {
    reporter_->SetLabel(kVgpuConfigStateLabel, "");
  }
  if (options_.serve.workload == Workload::kVmVgpu) return PassVgpu(start);
  const HostPaths& paths = options_.serve.paths;
  // The pass's one scan; the frontend is handed the same state.
  absl::StatusOr<std::shared_ptr<const node::State>> state = Scan();
  if (!state.ok()) {
    next_pass_ = Clock::now() + options_.not_ready_interval;
    return state.status();
  }
  const pci::Inventory* inventory = &(*state)->inventory;
  const pci::Selection* selection = &(*state)->selection;

  if (refused_) {
    const node::Snapshot model = node::Build(paths, *inventory, *selection, source_.names(), nullptr);
    std::vector<std::string> resource_names;
    for (const auto& [name, devices] : node::ByResource(node::ServedOf(model, node::WholeDevices::kEverySelected))) {
      resource_names.push_back(name);
    }
    if (StillRefused(resource_names)) return absl::OkStatus();
  }

  KeepHeldVgpuParents(*inventory, *selection);
  // --bind-on-prepare: the GPUs stay on their host drivers; each claim's Prepare binds its own.
  const bool attempted = !BindOnPrepare() && BindDue(*inventory, *selection);
  ReportModeChange("whole-GPU resources advertised; GPUsBound and BindFailed name the GPUs as they move to vfio-pci");
  // Readiness from the host as it is after this pass's binds, and the frontend advertises them now rather than at
  // a later event: the scan hands it this state.
  if (attempted) {
    TakeOwnEvents();
    if (absl::StatusOr<std::shared_ptr<const node::State>> after = Scan(); after.ok()) {
      state = std::move(after);
      inventory = &(*state)->inventory;
      selection = &(*state)->selection;
    }
  }
  if (!serving_) {
    // After the first binds and their scan, so that the frontend's first list already holds the GPUs bound now.
    if (absl::Status status = frontend_->Start(); !status.ok()) return status;
    serving_ = true;
  }
  // The node's model of this state, as the frontend builds it from the same scan, and what should be served of it:
  // every selected GPU, since this pass binds each (one off vfio is served Unhealthy).
  const node::Snapshot model = node::Build(paths, *inventory, *selection, source_.names(), nullptr);
  const node::ServedDevices expected = node::ServedOf(model, node::WholeDevices::kEverySelected);
  PublishDevices(expected);
  Conclude(Evaluate(*inventory, *selection, model, expected), start);
  if (mode_retry_at_) next_pass_ = std::min(next_pass_, *mode_retry_at_);
  return absl::OkStatus();
}

std::unique_ptr<node::Frontend> Daemon::Impl::MakeFrontend() {
  if (options_.make_frontend) return options_.make_frontend(options_.serve.workload);
  if (options_.dra) {
    options_.dra->workload = options_.serve.workload;
    return dra::MakeFrontend(*options_.dra);
  }
  return plugin::MakeFrontend(options_.serve);
}

Daemon::Daemon(DaemonOptions options, std::unique_ptr<kube::NodeReporter> reporter,
               std::unique_ptr<UeventSource> uevents)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(reporter), std::move(uevents))) {}
Daemon::~Daemon() = default;
absl::Status Daemon::Start() { return impl_->Start(); }
void Daemon::Stop() { impl_->Stop(); }
void Daemon::ReconcileNow() { impl_->ReconcileNow(); }
Readiness Daemon::State() const { return impl_->State(); }

}  // namespace vfio_agent::daemon
