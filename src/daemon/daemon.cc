#include "vfio_gpu_agent/daemon/daemon.h"

#include <poll.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "health_server.h"
#include "metrics.h"
#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/common/thread_name.h"
#include "vfio_gpu_agent/dra/checkpoint.h"
#include "vfio_gpu_agent/pci/inventory.h"
#include "vfio_gpu_agent/pci/selection.h"
#include "vfio_gpu_agent/node/watch.h"
#include "vfio_gpu_agent/plugin/devices.h"
#include "vfio_gpu_agent/plugin/held_devices.h"
#include "vfio_gpu_agent/plugin/vgpu_devices.h"
#include "vfio_gpu_agent/validation/check.h"
#include "vfio_gpu_agent/vgpu/apply.h"
#include "vfio_gpu_agent/vgpu/discovery.h"

namespace vfio_agent::daemon {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// The states that clear by themselves within moments (the kubelet dialling back, ListAndWatch reaching
// its allocatable set): looked at again soon rather than at the next not-ready interval, and published as a
// failure only when they outlast the registration grace.
constexpr milliseconds kLagRecheck{100};
bool ClearsByItself(const std::string& check_id) {
  // fabric.reachable: Fabric Manager initialising at boot, or reconnecting after its restart. kubelet.in_use: a
  // restarted kubelet's pod-resources List may answer a moment after its registration and allocatable do.
  return check_id == "plugin.registered" || check_id == "kubelet.allocatable" || check_id == "kubelet.in_use" ||
         check_id == "plugin.advertised" || check_id == "fabric.reachable" || check_id == "dra.registered" ||
         check_id == "dra.published";
}
constexpr milliseconds kLabelsTimeout{2000};
constexpr milliseconds kKubeletRecheck{60000};

struct Backoff {
  milliseconds delay{0};
  Clock::time_point next{};
};

// The metric label of a failed bind; every failed result carries its kind.
const char* FailureLabel(const binding::DeviceResult& result) {
  return result.failure == binding::Failure::kNone ? "bind_failed" : binding::FailureName(result.failure);
}

std::string DriverText(const std::string& driver) { return driver.empty() ? "no driver" : driver; }

using Labels = std::map<std::string, std::string>;

std::string WorkloadLabelOf(const Labels& labels) {
  auto it = labels.find(kWorkloadLabel);
  return it == labels.end() ? "" : it->second;
}

// The labels a pass acts on (mode, vGPU config, the operator's coexistence labels), as one string to compare; the
// state label the agent writes itself is not one of them.
std::string RelevantLabels(const Labels& labels) {
  std::string out;
  auto add = [&](const char* key) {
    auto it = labels.find(key);
    absl::StrAppend(&out, key, "=", it == labels.end() ? "<none>" : it->second, "\n");
  };
  add(kWorkloadLabel);
  add(kVgpuConfigLabel);
  for (const char* key : kOperatorLabels) add(key);
  return out;
}

// A GPU in use, or one of its vGPUs: what may keep it from moving to the other mode's driver.
struct InUse {
  std::string gpu;                // the GPU's BDF
  std::optional<int> group;       // its (or its vGPU's) IOMMU group: open = a VM runs on it
  std::string id;                 // its device id in pod-resources
};

class UdevUevents final : public UeventSource {
 public:
  absl::Status Open() { return monitor_.Open(); }
  int fd() const override { return monitor_.fd(); }
  bool Drain(std::vector<std::string>* bdfs) override { return monitor_.Drain(bdfs); }

 private:
  node::UdevMonitor monitor_;
};

}  // namespace

// The DRA driver's Fabric Manager news is the device plugin's (dra::FabricObserver is a fabric::FabricObserver):
// one set of events and metrics for both frontends.
class Daemon::Impl final : public plugin::AgentObserver, public dra::FabricObserver {
 public:
  Impl(DaemonOptions options, std::unique_ptr<kube::NodeReporter> reporter, std::unique_ptr<UeventSource> uevents)
      : options_(std::move(options)),
        reporter_(std::move(reporter)),
        uevents_(std::move(uevents)),
        names_(options_.serve.pci_ids, options_.serve.domain, options_.serve.overrides),
        vgpu_catalog_(options_.serve.vgpu_catalog_file),
        health_([this] { return ready_.load(); }, [this] { return Live(); }) {
    options_.serve.observer = this;
    options_.serve.fabric_observer = this;
    if (options_.dra) {
      options_.dra->fabric_observer = this;
      options_.dra->on_prepare = [this](bool ok, std::chrono::nanoseconds took) { metrics_.OnPrepare(ok, took); };
    }
    agent_ = std::make_unique<plugin::Agent>(options_.serve);
    if (options_.dra) dra_ = std::make_unique<dra::Driver>(*options_.dra);
    if (reporter_) reporter_->OnStats([this](const kube::ReporterStats& stats) { metrics_.SetApiStats(stats); });
  }
  ~Impl() override {
    Stop();
    // Its worker calls into metrics_ (OnStats), which is destroyed before reporter_ would be.
    reporter_.reset();
  }

  absl::Status Start();
  void Stop();
  Readiness State() const {
    std::lock_guard lock(state_mu_);
    return readiness_;
  }
  void ReconcileNow() {
    std::unique_lock lock(state_mu_);
    const uint64_t wanted = passes_started_ + 1;
    wakeup_.Notify();
    pass_cv_.wait(lock, [&] { return passes_done_ >= wanted || stopping_; });
  }

  // plugin::AgentObserver: metrics, and a pass soon after the kubelet restarted.
  void OnAllocate(const std::string& resource_name, bool ok, std::chrono::nanoseconds latency) override {
    metrics_.OnAllocate(resource_name, ok, latency);
  }
  void OnKubeletRestart() override {
    metrics_.OnKubeletRestart();
    kubelet_restarts_.fetch_add(1);
    wakeup_.Notify();
  }
  void OnVgpuProblem(const std::string& problem) override {
    Event(kube::EventType::kWarning, "VgpuNotAdvertised", "Discovering", problem);
  }

  // fabric::FabricObserver: one event per partition change, on the node the VM runs on.
  void OnPartitionActivated(const fabric::Partition& partition, const std::vector<std::string>& for_gpus) override {
    PartitionActivated(partition, for_gpus, "");
  }
  void OnClaimPartitionActivated(const fabric::Partition& partition, const std::vector<std::string>& for_gpus,
                                 const std::string& claim) override {
    PartitionActivated(partition, for_gpus, absl::StrCat(" of ", claim));
  }
  void OnPartitionDeactivated(const fabric::Partition& partition, const std::string& why) override {
    metrics_.CountPartitionRelease();
    if (auto fabric = Fabric()) metrics_.SetFabric(*fabric);
    Event(kube::EventType::kNormal, "PartitionReleased", "Releasing",
          absl::StrCat("Fabric Manager partition ", fabric::Describe(partition), " deactivated: ", why));
  }
  void OnActivationFailed(const std::vector<std::string>& gpus, const std::string& fm_status,
                          const std::string& message) override {
    metrics_.CountPartitionActivation(false, fm_status);
    Event(kube::EventType::kWarning, "PartitionActivationFailed", "Allocating",
          absl::StrCat("GPUs [", absl::StrJoin(gpus, ","), "]: ", message));
  }
  void OnFabricWarning(const std::string& reason, const std::string& message) override {
    Event(kube::EventType::kWarning, reason, "Allocating", message);
  }
  void OnFabricStateChanged() override { wakeup_.Notify(); }

 private:
  bool Live() const {
    const auto beat = Clock::time_point(Clock::duration(heartbeat_.load()));
    return Clock::now() - beat < options_.live_limit;
  }
  void Beat() { heartbeat_.store(Clock::now().time_since_epoch().count()); }

  // `holder`: who the partition is for, after the GPUs (a DRA claim); "" when the frontend does not know (Allocate).
  void PartitionActivated(const fabric::Partition& partition, const std::vector<std::string>& for_gpus,
                          const std::string& holder) {
    metrics_.CountPartitionActivation(true, "");
    if (auto fabric = Fabric()) metrics_.SetFabric(*fabric);
    Event(kube::EventType::kNormal, "PartitionActivated", "Allocating",
          absl::StrCat("Fabric Manager partition ", fabric::Describe(partition), " active for the GPUs [",
                       absl::StrJoin(for_gpus, ","), "]", holder));
  }
  // With --fabric-manager: the serving frontend's view of Fabric Manager (the DRA driver's, else the device plugin's).
  std::optional<fabric::FabricStatus> Fabric() const { return dra_ ? dra_->Fabric() : agent_->Fabric(); }

  void Loop();
  // --device narrows the node to those functions' IOMMU groups; empty = every group.
  std::set<int> AllowedGroups(const pci::Inventory& inventory) const;
  // Whether the device's last bind (or unbind, in vm-vgpu) failed and its backoff has not expired yet.
  bool BackingOff(const std::string& bdf, Clock::time_point now) const;
  // After a failed bind or unbind: the device's next attempt, 1 s doubling to max_backoff. The delay.
  milliseconds BackOff(const std::string& bdf);
  const absl::StatusOr<Labels>& PassLabels();
  // The labels the watch delivered last; nullopt until it has listed the node (or without a watch).
  std::optional<Labels> WatchedLabels();
  // Between passes, every workload_label_interval: whether kWorkloadLabel differs from the value last acted on.
  bool WorkloadLabelChanged();
  // At the start of a pass: the mode kWorkloadLabel (else --workload) asks for, switched to when it differs.
  void FollowWorkloadLabel();
  void SwitchMode(Workload wanted, const std::string& why);
  // vm-vgpu: selected GPUs still on a vfio driver move back to `nvidia`, except those a VM holds.
  void ReleaseToHostDriver();
  // vm-passthrough: a GPU on nvidia whose vGPU a VM holds is not bound (binding would pull the vGPU from under the VM).
  void KeepHeldVgpuParents(const pci::Inventory& inventory, const pci::Selection& selection);
  // GPU BDF -> who holds it: the pods pod-resources lists with an id of `in_use` under `resource_names`, and the
  // processes with a group of it open. With pod-resources unreadable, every GPU of `in_use` counts as held.
  std::map<std::string, std::string> WhoHolds(const std::vector<InUse>& in_use,
                                              const std::set<std::string>& resource_names);
  // Records the GPUs that wait for their VM (a Warning for each new one) and when to look at them again.
  void NoteHeld(std::map<std::string, std::string> held, const std::string& driver);
  // The first pass of a new mode: the WorkloadModeChanged event.
  void ReportModeChange(const std::string& what);
  // vm-vgpu: a ready node with GPUs still waiting for their VM is not ready yet, and the condition names who holds them.
  Readiness WithHeld(Readiness readiness) const;
  // One pass: coexistence (while refused), bind what is due, then readiness and everything it feeds.
  absl::Status Pass();
  absl::Status PassOnce();
  // vm-vgpu: nothing is bound; the plugin serves the vGPUs and readiness is the kubelet's side of them.
  absl::Status PassVgpu(Clock::time_point start);
  // vm-vgpu with a profile config: one reconcile pass of the config, then its state label and events.
  void ApplyVgpuProfiles();
  // The event and log line go out when the state or `message` differs from the last, or the host changed; the
  // outcome is compared without `what_changed`, so a converged pass after a change repeats nothing.
  void PublishVgpuConfig(const std::string& state, kube::EventType type, const std::string& reason,
                         const std::string& message, bool changed, const std::string& what_changed = "");
  std::optional<Readiness> RefusalNow(const std::vector<std::string>& resource_names);
  // While the node is refused: publishes the refusal and schedules the next check (true); else clears it.
  bool StillRefused(const std::vector<std::string>& resource_names);
  // The end of every pass: settle and publish `readiness`, the kubelet-restart event, the next pass's time.
  void Conclude(Readiness readiness, Clock::time_point start);
  // True when a bind was attempted (the host changed).
  bool BindDue(const pci::Inventory& inventory, const pci::Selection& selection);
  // run --kubelet-api dra --bind-on-prepare: GPUs are bound by the claims that need them, never at start.
  bool BindOnPrepare() const { return options_.dra && options_.dra->bind_on_prepare; }
  // What the kubelet must see: every id of `required` advertised and healthy, every resource with devices
  // registered, the kubelet's allocatable set equal to the healthy one. nullopt when all holds.
  std::optional<Readiness> ServedReadiness(const validation::NodeView& view, const std::vector<std::string>& required,
                                           const plugin::DeviceSnapshot& served);
  // run --kubelet-api dra: the driver registered, every GPU of `required` published healthy, the node's slices
  // written. nullopt when all holds.
  // A GPU `expected` (the daemon's own scan) has healthy that the driver does not yet is dra.published, which
  // clears by itself (the driver is one rescan behind a bind).
  std::optional<Readiness> DraReadiness(const std::vector<std::string>& required,
                                        const plugin::DeviceSnapshot& expected);
  Readiness EvaluateVgpu();
  // vm-vgpu with --kubelet-api dra: the vGPUs the driver publishes, the driver registered, its slices written.
  Readiness EvaluateVgpuDra();
  // The driver registered with the kubelet and its slices written; nullopt when both hold.
  std::optional<Readiness> DraServing();
  Readiness Evaluate(const pci::Inventory& inventory, const pci::Selection& selection,
                     const plugin::DeviceSnapshot& expected);
  void Settle(Readiness* readiness);
  void Publish(const Readiness& readiness);
  void PublishDevices(const pci::Selection& selection, const plugin::DeviceSnapshot& expected);
  void RunHostChecks(const validation::NodeView& view, const std::string& fingerprint);
  void Event(kube::EventType type, const std::string& reason, const std::string& action, const std::string& note) {
    if (reporter_) reporter_->RecordEvent(type, reason, action, note);
  }

  DaemonOptions options_;
  const Workload flag_workload_ = options_.serve.workload;  // --workload: the mode while the node has no label
  std::unique_ptr<kube::NodeReporter> reporter_;
  std::unique_ptr<UeventSource> uevents_;  // null: none
  const names::NameResolver names_;
  // The profile applier's view of the SR-IOV catalogs; shared with the plugin's through their file.
  vgpu::CatalogStore vgpu_catalog_;
  internal::Metrics metrics_;
  internal::HealthServer health_;
  std::unique_ptr<plugin::Agent> agent_;
  std::unique_ptr<dra::Driver> dra_;  // run --kubelet-api dra: serves instead of agent_, which is never started
  node::DirWatcher dirs_;
  node::Wakeup wakeup_;
  std::thread loop_;
  std::atomic<bool> ready_{false};
  std::atomic<Clock::rep> heartbeat_{0};
  std::atomic<int> kubelet_restarts_{0};
  std::atomic<bool> stopping_{false};
  bool started_ = false;

  // Loop state (the loop thread's, and Start's before the loop exists).
  bool serving_ = false;
  bool refused_ = true;  // until the first coexistence check clears the node
  Clock::time_point next_coexistence_{}, next_pass_{};
  bool labels_error_logged_ = false;
  std::map<std::string, Backoff> backoff_;
  std::map<std::string, std::string> bind_failures_;  // BDF -> last failure, for the not-ready message
  std::map<std::string, bool> health_seen_;           // BDF -> healthy, for lost/recovered events
  int restarts_reported_ = 0;
  std::string host_fingerprint_;
  std::vector<validation::Check> host_checks_;
  std::optional<bool> host_ready_written_;
  std::vector<validation::Check> kubelet_checks_;
  std::string kubelet_key_;
  Clock::time_point kubelet_checked_{};
  std::optional<Clock::time_point> settling_since_;
  std::string vgpu_outcome_;                        // state and message last published, for events on change
  std::optional<Clock::time_point> vgpu_retry_at_;  // a pending or failed config is tried again then
  // The node's labels, read at most once a pass (coexistence, workload mode, vGPU config); reset by each pass.
  std::optional<absl::StatusOr<Labels>> pass_labels_;
  std::optional<absl::StatusOr<Labels>> polled_labels_;  // read between passes, with a changed workload label
  Clock::time_point next_label_check_{};
  std::optional<std::string> workload_label_;  // kWorkloadLabel's value last acted on ("" = none)
  // The node's labels as the reporter's watch delivered them last (written on its thread, read by the loop), and
  // the loop's wakeup for them. Once the watch has listed the node, passes take the labels from here and nothing
  // polls; a change of a label the agent acts on starts a pass at once.
  std::mutex watch_mu_;
  std::optional<Labels> watched_labels_;
  // The KubeVirt release as the reporter told it (its thread, under watch_mu_), and as the loop last handed it to
  // agent_ (the loop's; under watch_mu_ too, as it is compared there).
  std::optional<kube::KubevirtRelease> told_release_;
  std::optional<kube::KubevirtRelease> agent_release_;
  node::Wakeup label_wakeup_;
  std::string acted_labels_;  // RelevantLabels of the labels the last pass read (the loop's)
  bool workload_labels_error_logged_ = false;
  std::string mode_change_;  // "vm-passthrough -> vm-vgpu (why)" until the first pass of the new mode reported it
  // GPUs that stay on the other mode's driver while a VM holds them: BDF -> who (the pod, else the pid).
  std::map<std::string, std::string> mode_held_;
  std::optional<Clock::time_point> mode_retry_at_;  // a held or failed move is looked at again then

  mutable std::mutex state_mu_;
  std::condition_variable pass_cv_;
  uint64_t passes_started_ = 0, passes_done_ = 0;
  Readiness readiness_;
  bool published_ = false;
};

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
  if (reporter_ && !options_.dra && options_.serve.vfio_backend == plugin::VfioBackendChoice::kAuto) {
    // --vfio-backend auto follows the KubeVirt release. Called on the API worker (va-kube-api), which only stores it
    // and wakes the loop: agent_ is the loop's (a mode switch replaces it), so the pass hands it over.
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
  agent_->Stop();
  if (dra_) dra_->Stop();
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
    if ((fds[1].revents & POLLIN) && dirs_.Drain().devices) pass = true;
    if (fds[2].revents & POLLIN) {
      label_wakeup_.Drain();
      std::optional<Labels> labels = WatchedLabels();
      if (labels && RelevantLabels(*labels) != acted_labels_) pass = true;
    }
    if (uevent_fd >= 0 && (fds[3].revents & POLLIN)) {
      std::vector<std::string> bdfs;
      if (uevents_->Drain(&bdfs)) pass = true;
      // A uevent for a device is news about it (a holder let go, a reset finished): retry it now.
      for (const std::string& bdf : bdfs) backoff_.erase(bdf);
    }
    dirs_.Refresh(options_.serve.paths.kubelet_dir, options_.serve.paths.dev_root);
    const Clock::time_point now = Clock::now();
    if (refused_ && now >= next_coexistence_) pass = true;
    if (reporter_ && !WatchedLabels() && now >= next_label_check_ && WorkloadLabelChanged()) pass = true;
    for (const auto& [bdf, backoff] : backoff_) pass = pass || now >= backoff.next;
    if (!pass) continue;
    if (absl::Status status = Pass(); !status.ok()) spdlog::error("reconcile: {}", status.ToString());
  }
}

std::optional<Readiness> Daemon::Impl::RefusalNow(const std::vector<std::string>& resource_names) {
  std::vector<std::string> why;
  for (const std::string& socket : ForeignPluginSockets(options_.serve.paths.kubelet_dir, resource_names)) {
    why.push_back(absl::StrCat("another device plugin answers on ", socket,
                               " (remove the GPU Operator's sandbox device plugin from this node)"));
  }
  if (reporter_) {
    const absl::StatusOr<Labels>& labels = PassLabels();
    if (!labels.ok()) {
      if (!labels_error_logged_) {
        spdlog::warn("coexistence: node labels unreadable ({}); deciding from the kubelet directory alone",
                     labels.status().ToString());
        labels_error_logged_ = true;
      }
    } else {
      labels_error_logged_ = false;
      for (const char* label : kOperatorLabels) {
        auto it = labels->find(label);
        if (it != labels->end() && it->second == "true") {
          why.push_back(absl::StrCat("node label ", label, "=true (set it to false: kubectl label node <node> ", label,
                                     "=false --overwrite)"));
        }
      }
    }
  }
  if (why.empty()) return std::nullopt;
  return Readiness{.ready = false,
                   .check_id = "coexistence.operator",
                   .reason = kOperatorReason,
                   .message = absl::StrCat("coexistence.operator: the GPU Operator still manages this node: ",
                                           absl::StrJoin(why, "; "), "; not binding or registering")};
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
      agent_->SetKubevirtRelease(agent_release_);
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
  const pci::ScanOptions scan_options{.detail_vendor = options_.serve.policy.vendor_id, .driver_override = false};
  absl::StatusOr<pci::Inventory> inventory = pci::Scan(paths.sysfs_root, scan_options);
  if (!inventory.ok()) {
    next_pass_ = Clock::now() + options_.not_ready_interval;
    return inventory.status();
  }
  pci::Selection selection = pci::Select(*inventory, options_.serve.policy);

  if (refused_) {
    const plugin::DeviceSnapshot named = plugin::BuildSnapshot(
        paths, *inventory, selection, names_, std::set<std::string>(selection.gpus.begin(), selection.gpus.end()));
    std::vector<std::string> resource_names;
    for (const auto& [name, devices] : named.resources) resource_names.push_back(name);
    if (StillRefused(resource_names)) return absl::OkStatus();
  }

  KeepHeldVgpuParents(*inventory, selection);
  // --bind-on-prepare: the GPUs stay on their host drivers; each claim's Prepare binds its own.
  const bool attempted = !BindOnPrepare() && BindDue(*inventory, selection);
  ReportModeChange("whole-GPU resources advertised; GPUsBound and BindFailed name the GPUs as they move to vfio-pci");
  if (!serving_) {
    // After the first binds, so that the plugin's first snapshot already holds the GPUs bound now.
    if (absl::Status status = dra_ ? dra_->Start() : agent_->Start(); !status.ok()) return status;
    serving_ = true;
  }
  // Readiness from the host as it is after this pass's binds.
  if (attempted) {
    absl::StatusOr<pci::Inventory> after = pci::Scan(paths.sysfs_root, scan_options);
    if (after.ok()) {
      inventory = std::move(after);
      selection = pci::Select(*inventory, options_.serve.policy);
    }
  }
  plugin::DeviceSnapshot expected = plugin::BuildSnapshot(
      paths, *inventory, selection, names_, std::set<std::string>(selection.gpus.begin(), selection.gpus.end()));
  // The DRA driver applies the device plugin's Fabric Manager rule to what it publishes: a GPU FM does not vouch for
  // is expected Unhealthy (DeviceLost, dra.healthy), not a driver lagging behind (dra.published).
  if (dra_) plugin::MarkUnusable(expected, [this](const std::string& id) { return dra_->FabricUnusable(id); });
  PublishDevices(selection, expected);
  Conclude(Evaluate(*inventory, selection, expected), start);
  if (mode_retry_at_) next_pass_ = std::min(next_pass_, *mode_retry_at_);
  return absl::OkStatus();
}

absl::Status Daemon::Impl::PassVgpu(Clock::time_point start) {
  // vGPU names come from the agent's discovery (its catalogs): before it serves, the operator's labels and
  // NVIDIA's own plugin sockets are what tells another manager apart.
  if (refused_ && StillRefused({})) return absl::OkStatus();
  ReleaseToHostDriver();
  // Before the plugin's first snapshot, so that it already advertises the vGPUs made now.
  ApplyVgpuProfiles();
  if (!serving_) {
    if (absl::Status status = dra_ ? dra_->Start() : agent_->Start(); !status.ok()) return status;
    serving_ = true;
  }
  const plugin::DeviceSnapshot served = agent_->Snapshot();  // empty with the DRA driver, which is not the agent
  PublishDevices(pci::Selection{}, served);
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
  vgpu::ApplyOptions apply{.paths = options_.serve.paths, .catalog = &vgpu_catalog_, .new_uuid = {}, .claimed = {}};
  if (options_.dra) {
    // A prepared claim's vGPU is the VM's from Prepare on, though virt-launcher opens its group only once its image
    // is pulled: the checkpoint says which (vgpu is below dra, so the daemon hands them over).
    absl::StatusOr<dra::CheckpointRead> checkpoint = dra::ReadCheckpoint(*options_.dra);
    if (!checkpoint.ok()) {
      // Without it no vGPU can be known free of a claim: nothing is changed this pass.
      vgpu_retry_at_ = Clock::now() + options_.vgpu_retry;
      PublishVgpuConfig("pending", kube::EventType::kWarning, "VgpuConfigPending",
                        absl::StrCat("vGPU config '", name, "': the DRA checkpoint cannot be read (",
                                     checkpoint.status().message(), "); no vGPU is changed until it can"),
                        false);
      return;
    }
    for (const dra::CheckpointedClaim& claim : checkpoint->claims) {
      for (const std::string& uuid : claim.mdev_uuids) apply.claimed[uuid] = "DRA claim " + claim.ref;
      for (const std::string& vf : claim.vgpu_vfs) apply.claimed[vf] = "DRA claim " + claim.ref;
    }
    for (const std::string& unreadable : checkpoint->unreadable) {
      spdlog::warn("vGPU config: DRA checkpoint file {} unreadable: its claim's vGPUs are not known held", unreadable);
    }
  }
  const absl::StatusOr<vgpu::ApplyReport> report =
      file.ok() ? vgpu::ApplyVgpuConfig(apply, *file, name) : absl::StatusOr<vgpu::ApplyReport>(file.status());
  const std::string what = absl::StrCat("vGPU config '", name, "'");
  if (!report.ok()) {
    vgpu_retry_at_ = Clock::now() + options_.vgpu_retry;
    PublishVgpuConfig("failed", kube::EventType::kWarning, "VgpuConfigFailed",
                      absl::StrCat(what, ": ", report.status().message()), false);
    return;
  }
  // Advertised now rather than at the plugin's next rescan.
  if (report->changed() && serving_) agent_->RescanNow();
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
  if (dra_) {
    if (!serving_) {
      dra::DriverOptions asked = *options_.dra;
      asked.workload = wanted;
      if (absl::Status modes = dra::ValidateModes(asked); !modes.ok()) {
        if (news) {
          const std::string note = absl::StrCat(why, " asks for ", WorkloadName(wanted), ", which this agent refuses: ",
                                                modes.message(), "; staying in ", WorkloadName(current));
          spdlog::warn("workload mode: {}", note);
          Event(kube::EventType::kWarning, "WorkloadModeUnsupported", "SwitchingMode", note);
        }
        return;
      }
      // Not serving yet: the driver starts in the label's mode.
      spdlog::info("workload mode: {} ({})", WorkloadName(wanted), why);
      options_.serve.workload = wanted;
      options_.dra->workload = wanted;
      dra_ = std::make_unique<dra::Driver>(*options_.dra);
      return;
    }
    // The driver's published devices and prepared claims are of one mode; a live switch is the device plugin's.
    if (news) {
      const std::string note =
          absl::StrCat(why, " asks for ", WorkloadName(wanted), "; the DRA driver serves the mode it started in (",
                       WorkloadName(current), ") until the agent restarts");
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
    agent_->Stop();
    serving_ = false;
  }
  options_.serve.workload = wanted;
  agent_ = std::make_unique<plugin::Agent>(options_.serve);
  agent_->SetKubevirtRelease(agent_release_);
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

void Daemon::Impl::ReleaseToHostDriver() {
  const HostPaths& paths = options_.serve.paths;
  absl::StatusOr<pci::Inventory> inventory =
      pci::Scan(paths.sysfs_root, {.detail_vendor = options_.serve.policy.vendor_id, .driver_override = false});
  if (!inventory.ok()) {
    spdlog::warn("workload mode: {}", inventory.status().ToString());
    return;
  }
  const pci::Selection selection = pci::Select(*inventory, options_.serve.policy);
  const std::set<int> allowed_groups = AllowedGroups(*inventory);
  const Clock::time_point now = Clock::now();
  // A device off vfio has nothing left to retry (an expired backoff would keep waking the loop).
  std::erase_if(backoff_, [&](const auto& entry) {
    const pci::Function* fn = inventory->Find(entry.first);
    return fn == nullptr || !pci::IsVfioDriver(fn->driver);
  });
  std::vector<InUse> on_vfio;
  std::set<std::string> gpus;
  for (const std::string& bdf : selection.gpus) {
    const pci::Function* fn = inventory->Find(bdf);
    if (selection.RoleOf(bdf) != pci::Role::kGpu || fn == nullptr || !fn->iommu_group ||
        !pci::IsVfioDriver(fn->driver) || BackingOff(bdf, now) ||
        (!options_.bind.targets.every_selected() && !allowed_groups.contains(*fn->iommu_group))) {
      continue;
    }
    on_vfio.push_back({.gpu = bdf, .group = fn->iommu_group, .id = bdf});
    gpus.insert(bdf);
  }
  if (on_vfio.empty()) {
    NoteHeld({}, "");
    ReportModeChange("no GPU was on vfio-pci; vGPUs advertised");
    return;
  }
  std::set<std::string> passthrough_names;
  for (const auto& [name, resource] : plugin::BuildSnapshot(paths, *inventory, selection, names_, gpus).resources) {
    passthrough_names.insert(name);
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
  if (!moved.empty() && serving_) agent_->RescanNow();
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
    absl::StatusOr<vgpu::Discovery> discovery = vgpu::Discover(options_.serve.paths.sysfs_root, inventory, vgpu_catalog_);
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
      const plugin::VgpuSnapshot advertised =
          plugin::BuildVgpuSnapshot(options_.serve.paths, inventory, *discovery, options_.serve.domain, {});
      for (const auto& [name, resource] : advertised.snapshot.resources) vgpu_names.insert(name);
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

bool Daemon::Impl::StillRefused(const std::vector<std::string>& resource_names) {
  if (std::optional<Readiness> refusal = RefusalNow(resource_names)) {
    next_coexistence_ = Clock::now() + options_.coexistence_recheck;
    next_pass_ = next_coexistence_;
    Publish(*refusal);
    return true;
  }
  refused_ = false;
  return false;
}

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

std::set<int> Daemon::Impl::AllowedGroups(const pci::Inventory& inventory) const {
  std::set<int> groups;
  for (const std::string& bdf : options_.bind.targets.bdfs()) {
    const pci::Function* fn = inventory.Find(bdf);
    if (fn != nullptr && fn->iommu_group) groups.insert(*fn->iommu_group);
  }
  return groups;
}

bool Daemon::Impl::BackingOff(const std::string& bdf, Clock::time_point now) const {
  auto it = backoff_.find(bdf);
  return it != backoff_.end() && now < it->second.next;
}

milliseconds Daemon::Impl::BackOff(const std::string& bdf) {
  Backoff& backoff = backoff_[bdf];
  backoff.delay = backoff.delay.count() == 0 ? options_.first_backoff : std::min(backoff.delay * 2, options_.max_backoff);
  backoff.next = Clock::now() + backoff.delay;
  return backoff.delay;
}

bool Daemon::Impl::BindDue(const pci::Inventory& inventory, const pci::Selection& selection) {
  const Clock::time_point now = Clock::now();
  std::vector<std::string> managed = selection.gpus;
  managed.insert(managed.end(), selection.companions.begin(), selection.companions.end());
  const std::set<int> allowed_groups = AllowedGroups(inventory);
  std::set<int> due_groups;
  for (const std::string& bdf : managed) {
    const pci::Function* fn = inventory.Find(bdf);
    if (fn == nullptr || pci::IsVfioDriver(fn->driver) || !fn->iommu_group || mode_held_.contains(bdf)) continue;
    if (!options_.bind.targets.every_selected() && !allowed_groups.contains(*fn->iommu_group)) continue;
    if (!BackingOff(bdf, now)) due_groups.insert(*fn->iommu_group);
  }
  if (due_groups.empty()) return false;
  std::vector<std::string> due;
  for (const std::string& bdf : selection.gpus) {
    const pci::Function* fn = inventory.Find(bdf);
    if (fn != nullptr && fn->iommu_group && due_groups.contains(*fn->iommu_group) && !mode_held_.contains(bdf)) {
      due.push_back(bdf);
    }
  }
  if (due.empty()) return false;
  binding::BinderOptions options = options_.bind;
  options.targets = binding::Targets::Devices(due);
  absl::StatusOr<binding::BindReport> report = binding::Bind(options);
  if (!report.ok()) {
    // The host changed between the scan and the bind (a device removed): the next pass sees it.
    spdlog::warn("reconcile: bind of {}: {}", absl::StrJoin(due, ","), report.status().ToString());
    return true;
  }
  std::vector<std::string> bound;
  for (const binding::DeviceResult& result : report->devices) {
    metrics_.CountBind(binding::OutcomeName(result.outcome));
    switch (result.outcome) {
      case binding::Outcome::kBound:
        bound.push_back(result.bdf);
        [[fallthrough]];
      case binding::Outcome::kAlreadyBound:
        backoff_.erase(result.bdf);
        bind_failures_.erase(result.bdf);
        break;
      case binding::Outcome::kFailed:
      case binding::Outcome::kBlocked: {
        const milliseconds delay = BackOff(result.bdf);
        metrics_.CountBindFailure(FailureLabel(result));
        const std::string note = absl::StrCat(result.bdf, " ", binding::OutcomeName(result.outcome), ": ", result.reason);
        bind_failures_[result.bdf] = note;
        spdlog::warn("reconcile: {}; retrying in {} ms", note, delay.count());
        // BindBlocked names who holds the GPU; anything else is a failure of the bind itself.
        Event(kube::EventType::kWarning, result.holders.empty() ? "BindFailed" : "BindBlocked", "Binding", note);
        break;
      }
      default:
        break;
    }
  }
  if (!bound.empty()) {
    // Advertised now rather than at the plugin's next tick.
    if (serving_) agent_->RescanNow();
    spdlog::info("reconcile: bound {} to vfio: {}", bound.size(), absl::StrJoin(bound, ","));
    Event(kube::EventType::kNormal, "GPUsBound", "Binding",
          absl::StrCat("bound ", bound.size(), " functions to vfio: ", absl::StrJoin(bound, ",")));
  }
  return true;
}

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

void Daemon::Impl::PublishDevices(const pci::Selection& selection, const plugin::DeviceSnapshot& expected) {
  // The DRA driver applies the same health rules (pci/vfio_health.h, Fabric Manager's) to the same sysfs: its devices
  // are `expected`.
  plugin::DeviceSnapshot served = dra_ ? expected : agent_->Snapshot();
  if (BindOnPrepare()) {
    // A GPU on its host driver is healthy under this policy (a claim binds it): the driver's own health, or every
    // claim's bind and return would read as DeviceRecovered and DeviceLost.
    std::map<std::string, dra::GpuDevice> published;
    for (dra::GpuDevice& device : dra_->Devices()) published[device.bdf] = std::move(device);
    for (auto& [name, resource] : served.resources) {
      for (plugin::PluginDevice& device : resource.devices) {
        if (auto it = published.find(device.id); it != published.end()) {
          device.healthy = it->second.healthy();
          device.unhealthy_reason = it->second.unhealthy_reason;
        }
      }
    }
  }
  std::map<std::pair<std::string, std::string>, int> counts;
  std::set<std::string> advertised;
  for (const auto& [name, resource] : served.resources) {
    for (const plugin::PluginDevice& device : resource.devices) {
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
  }
  for (const auto& [name, resource] : expected.resources) {
    for (const plugin::PluginDevice& device : resource.devices) {
      if (!advertised.contains(device.id)) ++counts[{name, "unbound"}];
    }
  }
  metrics_.SetDevices(counts);
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
