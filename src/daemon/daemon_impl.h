// `run`'s engine (daemon::Daemon::Impl) and what its files share; private to src/daemon. One object, split by concern:
// daemon.cc (start, stop, the loop, a pass), reconcile.cc (binds and their backoff), workload.cc (the workload mode
// from the node label, vGPU profiles, GPUs a VM holds), readiness.cc (what the node is ready for, the host checks)
// and publish.cc (the outcome of a pass: readiness, the condition and events, the device metrics). Every member is
// the reconcile thread's (va-reconcile, and Start's before it exists) unless its comment says otherwise.
#pragma once

#include "vfio_gpu_agent/daemon/daemon.h"


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
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "health_server.h"
#include "metrics.h"
#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/common/thread_name.h"
#include "vfio_gpu_agent/dra/frontend.h"
#include "vfio_gpu_agent/pci/inventory.h"
#include "vfio_gpu_agent/pci/selection.h"
#include "vfio_gpu_agent/node/frontend.h"
#include "vfio_gpu_agent/node/snapshot.h"
#include "vfio_gpu_agent/node/source.h"
#include "vfio_gpu_agent/node/watch.h"
#include "vfio_gpu_agent/plugin/frontend.h"
#include "vfio_gpu_agent/plugin/held_devices.h"
#include "vfio_gpu_agent/validation/check.h"
#include "vfio_gpu_agent/vgpu/apply.h"
#include "vfio_gpu_agent/vgpu/discovery.h"

namespace vfio_agent::daemon {
namespace internal {
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// The states that clear by themselves within moments (the kubelet dialling back, ListAndWatch reaching
// its allocatable set): looked at again soon rather than at the next not-ready interval, and published as a
// failure only when they outlast the registration grace.
inline constexpr milliseconds kLagRecheck{100};
inline bool ClearsByItself(const std::string& check_id) {
  // fabric.reachable: Fabric Manager initialising at boot, or reconnecting after its restart. kubelet.in_use: a
  // restarted kubelet's pod-resources List may answer a moment after its registration and allocatable do.
  return check_id == "plugin.registered" || check_id == "kubelet.allocatable" || check_id == "kubelet.in_use" ||
         check_id == "plugin.advertised" || check_id == "fabric.reachable" || check_id == "dra.registered" ||
         check_id == "dra.published";
}
inline constexpr milliseconds kLabelsTimeout{2000};
inline constexpr milliseconds kSettleRescan{25};
inline constexpr milliseconds kKubeletRecheck{60000};

struct Backoff {
  milliseconds delay{0};
  Clock::time_point next{};
};

// The metric label of a failed bind; every failed result carries its kind.
inline const char* FailureLabel(const binding::DeviceResult& result) {
  return result.failure == binding::Failure::kNone ? "bind_failed" : binding::FailureName(result.failure);
}

inline std::string DriverText(const std::string& driver) { return driver.empty() ? "no driver" : driver; }

using Labels = std::map<std::string, std::string>;

inline std::string WorkloadLabelOf(const Labels& labels) {
  auto it = labels.find(kWorkloadLabel);
  return it == labels.end() ? "" : it->second;
}

// The labels a pass acts on (mode, vGPU config, the operator's coexistence labels), as one string to compare; the
// state label the agent writes itself is not one of them.
inline std::string RelevantLabels(const Labels& labels) {
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

}  // namespace internal

using internal::Backoff;
using internal::ClearsByItself;
using internal::Clock;
using internal::DriverText;
using internal::FailureLabel;
using internal::InUse;
using internal::kKubeletRecheck;
using internal::kLabelsTimeout;
using internal::kLagRecheck;
using internal::kSettleRescan;
using internal::Labels;
using internal::milliseconds;
using internal::RelevantLabels;
using internal::WorkloadLabelOf;

// The DRA driver's Fabric Manager news is the device plugin's (dra::FabricObserver is a fabric::FabricObserver):
// one set of events and metrics for both frontends.
class Daemon::Impl final : public plugin::AgentObserver, public dra::FabricObserver {
 public:
  Impl(DaemonOptions options, std::unique_ptr<kube::NodeReporter> reporter, std::unique_ptr<UeventSource> uevents)
      : options_(std::move(options)),
        reporter_(std::move(reporter)),
        uevents_(std::move(uevents)),
        source_(node::SourceOptionsOf(options_.serve,
                                      {.bind_on_prepare = options_.dra && options_.dra->bind_on_prepare})),
        health_([this] { return ready_.load(); }, [this] { return Live(); }) {
    // A frontend that moved a GPU itself (DRA's --bind-on-prepare) asks for a scan that starts after the move: a
    // pass, which also publishes what the frontend makes of it.
    source_.SetScanWaker([this] { wakeup_.Notify(); });
    options_.serve.observer = this;
    options_.serve.fabric_observer = this;
    options_.serve.source = &source_;
    if (options_.dra) {
      options_.dra->source = &source_;
      options_.dra->fabric_observer = this;
      options_.dra->on_prepare = [this](bool ok, std::chrono::nanoseconds took) { metrics_.OnPrepare(ok, took); };
      options_.dra->on_binding = [this](const dra::BindingOutcome& outcome) { OnBinding(outcome); };
    }
    frontend_ = MakeFrontend();
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
  // With --fabric-manager: the frontend's view of Fabric Manager.
  std::optional<fabric::FabricStatus> Fabric() const { return frontend_->Fabric(); }
  // The one place a frontend is made, for options_.serve.workload: the test's, else the DRA driver with
  // --kubelet-api dra, else the device plugin. Not started.
  std::unique_ptr<node::Frontend> MakeFrontend();

  void Loop();
  // Rescans the shared source. A scan that starts kSettleRescan after a device event is that event's second look.
  absl::StatusOr<std::shared_ptr<const node::State>> Scan() {
    if (Clock::now() >= settle_rescan_) settle_rescan_ = Clock::time_point::max();
    next_safety_scan_ = Clock::now() + options_.serve.rescan_interval;
    return source_.Rescan();
  }
  // After this pass's binds, before their scan: the inotify events and uevents the binds caused are news that scan
  // already holds, so they start no other pass. A uevent for a device that backs off still retries it.
  void TakeOwnEvents();
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
  void ReleaseToHostDriver(const node::State& state);
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
  // The frontend binds the GPUs its claims need (--bind-on-prepare): they stay on their host drivers, never bound here.
  bool BindOnPrepare() const { return frontend_->BindsOnDemand(); }
  // The frontend's side: what it answers (advertised or published, healthy, registered, slices written), then, for
  // a frontend whose devices the kubelet lists as allocatable, the kubelet's set equal to the healthy one
  // (`view.served` is what it should hold). nullopt when all holds; the metrics' validation checks are set either
  // way.
  std::optional<Readiness> FrontendReadiness(const node::FrontendReadiness& answer, const validation::NodeView& view);
  Readiness EvaluateVgpu();
  // `model`: node::Build over the pass's state; `expected`: what should be served of it (node::ServedOf).
  Readiness Evaluate(const pci::Inventory& inventory, const pci::Selection& selection, const node::Snapshot& model,
                     const node::ServedDevices& expected);
  void Settle(Readiness* readiness);
  void Publish(const Readiness& readiness);
  // `expected`: what the pass's scan says should be served (what the frontend serves, in vm-vgpu).
  void PublishDevices(const node::ServedDevices& expected);
  void RunHostChecks(const validation::NodeView& view, const std::string& fingerprint);
  // One Node Event per claim that waited for its binding conditions: which claim, how long, and why it failed.
  void OnBinding(const dra::BindingOutcome& outcome) {
    metrics_.OnBinding(outcome.ok, outcome.waited);
    const std::string claim = absl::StrCat(outcome.namespace_name, "/", outcome.name, " (", outcome.uid, ")");
    const double seconds = std::chrono::duration<double>(outcome.waited).count();
    if (outcome.ok) {
      Event(kube::EventType::kNormal, "ClaimDevicesReady", "Binding",
            absl::StrFormat("claim %s ready for its pod after %.1f s: %s", claim, seconds, outcome.message));
    } else {
      Event(kube::EventType::kWarning, "ClaimBindingFailed", "Binding",
            absl::StrFormat("claim %s failed after %.1f s, the scheduler places its pod again: %s", claim, seconds,
                            outcome.message));
    }
  }

  void Event(kube::EventType type, const std::string& reason, const std::string& action, const std::string& note) {
    if (reporter_) reporter_->RecordEvent(type, reason, action, note);
  }

  DaemonOptions options_;
  const Workload flag_workload_ = options_.serve.workload;  // --workload: the mode while the node has no label
  std::unique_ptr<kube::NodeReporter> reporter_;
  std::unique_ptr<UeventSource> uevents_;  // null: none
  // The process's one scan, NameResolver and SR-IOV vGPU catalog store, shared with the frontend. This thread
  // (va-reconcile, and Start's before it) is the one that rescans it: once a pass, once more after a bind or a vGPU
  // change, and kSettleRescan after a device event; the frontend hears each state through its subscription.
  node::Source source_;
  internal::Metrics metrics_;
  internal::HealthServer health_;
  // The device plugin, or with --kubelet-api dra the DRA driver; a mode switch replaces it (the loop's).
  std::unique_ptr<node::Frontend> frontend_;
  node::DirWatcher dirs_;
  node::Wakeup wakeup_;
  Clock::time_point settle_rescan_ = Clock::time_point::max();  // a second look after a device event
  // --rescan-interval: the next scan that no event asked for (the loop's; every scan moves it).
  Clock::time_point next_safety_scan_ = Clock::time_point::max();
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
  bool vgpu_changed_ = false;  // this pass moved a GPU or changed a vGPU: it scans again
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
  // frontend_ (the loop's; under watch_mu_ too, as it is compared there).
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

}  // namespace vfio_agent::daemon
