#include "vfio_gpu_agent/dra/driver.h"

#include <poll.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <optional>
#include <set>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "grpcpp/server_builder.h"
#include "binding_worker.h"
#include "claims.h"
#include "fabric_claims.h"
#include "kubelet/health.h"
#include "kubelet/kubelet_services.h"
#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/common/grpc_idle.h"
#include "vfio_gpu_agent/common/thread_name.h"
#include "vfio_gpu_agent/common/unix_socket.h"
#include "vfio_gpu_agent/dra/taints.h"
#include "vfio_gpu_agent/dra/vgpu_devices.h"
#include "vfio_gpu_agent/node/source.h"
#include "vfio_gpu_agent/node/watch.h"

namespace vfio_agent::dra {
namespace {

constexpr size_t kMaxDriverNameLength = 63;  // ResourceSlice.spec.driver

bool IsLowerAlnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

absl::StatusOr<std::unique_ptr<grpc::Server>> ServeOn(const std::filesystem::path& socket,
                                                      std::initializer_list<grpc::Service*> services) {
  std::error_code ec;
  std::filesystem::create_directories(socket.parent_path(), ec);
  if (ec) return absl::UnavailableError(absl::StrCat("create ", socket.parent_path().string(), ": ", ec.message()));
  if (absl::Status free = ClaimSocketPath(socket); !free.ok()) return free;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + socket.string(), grpc::InsecureServerCredentials());
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::CQ_TIMEOUT_MSEC, kSyncPollerTimeoutMs);
  for (grpc::Service* service : services) builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) return absl::UnavailableError(absl::StrCat("cannot serve on ", socket.string()));
  return server;
}

// How often the loop lists the slices with nothing else happening (DriverOptions::slice_resync_interval).
std::chrono::milliseconds SliceResync(const DriverOptions& options) {
  if (!options.watch_slices) return options.slice_resync_interval;
  return std::max<std::chrono::milliseconds>(options.slice_resync_interval, kWatchedSliceResync);
}

}  // namespace

bool BindingConditionsWanted(const DriverOptions& options) {
  return options.binding_conditions && options.watch_claims && options.write_claim_status &&
         options.workload != Workload::kVmVgpu && (options.bind_on_prepare || !options.fabric.address.empty());
}

absl::Status ValidateDriverName(std::string_view name) {
  auto invalid = [&](std::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("DRA driver name \"", std::string(name), "\" ", std::string(why)));
  };
  if (name.empty()) return invalid("is empty");
  if (name.size() > kMaxDriverNameLength) return invalid("is longer than 63 characters");
  for (const std::string& label : std::vector<std::string>(absl::StrSplit(std::string(name), '.'))) {
    if (label.empty()) return invalid("has an empty label");
    if (!IsLowerAlnum(label.front()) || !IsLowerAlnum(label.back())) {
      return invalid("is not a DNS subdomain: each label starts and ends with a lower-case letter or digit");
    }
    for (char c : label) {
      if (!IsLowerAlnum(c) && c != '-') return invalid("is not a DNS subdomain: only a-z, 0-9, '-' and '.'");
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateModes(const DriverOptions& options) {
  if (options.bind_on_prepare && options.workload == Workload::kVmVgpu) {
    return absl::InvalidArgumentError(
        "--bind-on-prepare binds whole GPUs to vfio-pci and is for vm-passthrough nodes; on a vm-vgpu node the GPUs "
        "stay with the vGPU manager (drop --bind-on-prepare, or serve this node as vm-passthrough)");
  }
  return absl::OkStatus();
}

std::filesystem::path RegistrationSocket(const DriverOptions& options) {
  return options.registry_dir / (options.driver_name + "-reg.sock");
}

std::filesystem::path DraSocket(const DriverOptions& options) {
  return std::filesystem::absolute(options.plugins_dir / options.driver_name / "dra.sock").lexically_normal();
}

class Driver::Impl {
 public:
  explicit Impl(DriverOptions options)
      : options_(std::move(options)),
        own_source_(node::OwnSource(options_, {.bind_on_prepare = options_.bind_on_prepare})),
        source_(options_.source != nullptr ? *options_.source : *own_source_),
        slice_resync_(SliceResync(options_)),
        registration_(options_, [this](bool accepted) {
          if (accepted) WakeForRegistration();
        }),
        fabric_(options_),
        claims_(options_, &fabric_, &moves_),
        binding_wanted_(BindingConditionsWanted(options_)),
        v1_(claims_, serialize_),
        v1beta1_(claims_, serialize_) {}

  ~Impl() { Stop(); }

  absl::Status Start() {
    if (absl::Status name = ValidateDriverName(options_.driver_name); !name.ok()) return name;
    if (absl::Status modes = ValidateModes(options_); !modes.ok()) return modes;
    // After a GPU moved, a scan that started after the move judges it: the health kept through the move must not
    // outlive it (a failed move that left the GPU unhealthy is published now, not at the next periodic rescan).
    moves_.OnMoveEnded([this] {
      if (own_source_) {
        move_ended_ = true;
        wakeup_.Notify();
      } else {
        source_.RequestScan();
      }
    });
    claims_.OnHoldsChanged([this](const std::vector<GroupHold>& holds) {
      {
        std::lock_guard lock(holds_mu_);
        holds_ = holds;
      }
      holds_changed_ = true;
      wakeup_.Notify();
    });
    if (absl::Status loaded = claims_.Load(); !loaded.ok()) return loaded;
    source_.Open();
    if (absl::Status watch = dirs_.Open(); !watch.ok()) return watch;
    dirs_.Refresh({}, options_.paths.dev_root);
    fabric_.Start([this] {
      fabric_changed_ = true;
      wakeup_.Notify();
    });
    // The health stream's first message is the real list, never an empty one. A shared source's owner scanned just
    // before starting the driver.
    if (std::shared_ptr<const node::State> current = own_source_ ? nullptr : source_.Current(); Fits(current)) {
      Take(current);
    } else {
      Rescan();
    }
    if (!own_source_) {
      subscription_ = source_.Subscribe([this](const std::shared_ptr<const node::State>& state) {
        {
          std::lock_guard lock(posted_mu_);
          posted_ = state;
        }
        wakeup_.Notify();
      });
    }
    auto dra = ServeOn(DraSocket(options_), {&v1_, &v1beta1_, &health_, health_.v1()});
    if (!dra.ok()) return dra.status();
    dra_server_ = *std::move(dra);
    auto registration = ServeOn(RegistrationSocket(options_), {&registration_});
    if (!registration.ok()) {
      StopDra();
      return registration.status();
    }
    registration_server_ = *std::move(registration);
    spdlog::info("DRA driver {}: serving {} and registration on {} ({} {}, pool {})", options_.driver_name,
                 DraSocket(options_).string(), RegistrationSocket(options_).string(), Devices().size(),
                 options_.workload == Workload::kVmVgpu ? "vGPUs" : "GPUs", options_.node_name);
    // Before the loop: its thread may end the worker (the server drops the fields).
    if (binding_wanted_) {
      binding_ = std::make_unique<internal::BindingWorker>(options_, claims_, serialize_);
      binding_->Start();
      spdlog::info("DRA driver {}: binding conditions on: {} and {} on every GPU, claims of node {} watched by label",
                   options_.driver_name, BindingConditionType(options_.driver_name),
                   BindingFailureConditionType(options_.driver_name), options_.node_name);
    } else if (options_.binding_conditions) {
      spdlog::warn("DRA driver {}: --binding-conditions has nothing to do here (it needs --bind-on-prepare or "
                   "--fabric-manager on a vm-passthrough node, and the Kubernetes API); GPUs are made ready in "
                   "Prepare as before", options_.driver_name);
    }
    loop_ = std::thread([this] { Loop(); });
    if (options_.publish_slices && options_.watch_slices) {
      slice_watch_ = options_.watch_slices([this] {
        slices_changed_ = true;
        wakeup_.Notify();
      });
    }
    if (options_.get_claim) sweeper_ = std::thread([this] { SweepLoop(); });
    return absl::OkStatus();
  }

  void Stop() {
    if (subscription_) source_.Unsubscribe(*std::exchange(subscription_, std::nullopt));
    fabric_.Stop();
    slice_watch_.reset();  // joins the watch's thread: no wake-up after this
    if (loop_.joinable()) {
      {
        std::lock_guard lock(sweep_mu_);
        stopping_ = true;
      }
      sweep_cv_.notify_all();
      wakeup_.Notify();
      loop_.join();
      if (sweeper_.joinable()) sweeper_.join();
    }
    binding_.reset();  // after the loop, the only other thread that may end it
    if (registration_server_) {
      std::error_code ec;
      std::filesystem::remove(RegistrationSocket(options_), ec);
      registration_server_->Shutdown();
      registration_server_.reset();
    }
    StopDra();
  }

  RegistrationStatus Registration() const { return registration_.Status(); }

  std::vector<GpuDevice> Devices() const {
    std::lock_guard lock(mu_);
    return devices_;
  }
  int HealthStreams() const { return health_.open_streams(); }
  int SliceWrites() const {
    std::lock_guard lock(mu_);
    return slice_writes_;
  }
  std::string SliceError() const {
    std::lock_guard lock(mu_);
    return slice_error_;
  }
  std::optional<fabric::FabricStatus> Fabric() const { return fabric_.Status(); }
  std::string FabricUnusable(const std::string& bdf) const { return fabric_.Unusable(bdf); }

 private:
  using Clock = std::chrono::steady_clock;

  void StopDra() {
    if (!dra_server_) return;
    std::error_code ec;
    std::filesystem::remove(DraSocket(options_), ec);
    health_.CloseAll();  // a server's Shutdown waits for open streams
    dra_server_->Shutdown();
    dra_server_.reset();
  }

  void WakeForRegistration() {
    registered_ = true;
    wakeup_.Notify();
  }

  // Scans sysfs; on a change, logs it, sends the health streams the new list and marks the slices stale.
  void Rescan() {
    absl::StatusOr<std::shared_ptr<const node::State>> state = source_.Rescan();
    if (!state.ok()) {
      spdlog::error("DRA rescan: {}; keeping the previous device list", state.status().ToString());
      return;
    }
    Take(*state);
  }

  // A state the driver's mode can be built from: vm-vgpu needs a scan that discovered the vGPUs.
  bool Fits(const std::shared_ptr<const node::State>& state) const {
    return state != nullptr && (options_.workload != Workload::kVmVgpu || state->discovery.has_value());
  }

  // With a shared source: the newest state it handed over (nullptr: none since the last), else, for Fabric
  // Manager's news, the newest state at all; without one, a scan of our own.
  void Refresh(bool fabric_changed) {
    if (own_source_) {
      Rescan();
      return;
    }
    std::shared_ptr<const node::State> state;
    {
      std::lock_guard lock(posted_mu_);
      state = std::exchange(posted_, nullptr);
    }
    if (!state && fabric_changed) state = source_.Current();
    if (Fits(state)) Take(state);
  }

  void Take(const std::shared_ptr<const node::State>& state) {
    std::vector<GpuDevice> previous = Devices();
    std::vector<GpuDevice> next;
    if (options_.workload == Workload::kVmVgpu) {
      next = Vgpus(*state, previous);
    } else {
      next = GpusOf(state->snapshot, state->inventory, options_.pci_ids, options_.driver_name, previous);
      KeepHealthThroughMoves(*state, &next);  // sysfs' health only: Fabric Manager's is applied after, as it is now
      fabric_.AddAttributes(&next);
      fabric_.MarkUnusable(&next);
    }
    ApplyHealthTaints(&next, options_.driver_name, options_.paths, options_.taints,
                      /*whole_gpus=*/options_.workload != Workload::kVmVgpu);
    if (binding_wanted_) {
      // Every GPU, not only those off vfio-pci now: which GPUs are on vfio-pci changes with every claim, and a
      // slice that followed it would be rewritten at each Prepare and Unprepare, racing with the scheduler's view.
      // A GPU already bound costs one status write; bindsToNode is not set: our slices name their node, so an
      // allocation is bound to it already (the scheduler's nodeSelector).
      for (GpuDevice& device : next) {
        device.slice.binding_conditions = {BindingConditionType(options_.driver_name)};
        device.slice.binding_failure_conditions = {BindingFailureConditionType(options_.driver_name)};
      }
    }
    if (next == previous && health_sent_) return;
    LogChanges(previous, next);
    {
      std::lock_guard lock(mu_);
      devices_ = next;
    }
    SendHealth(next);
    slices_stale_ = true;
  }

  // A GPU the driver was moving while `state` was scanned (its group half-bound: on vfio-pci before its
  // /dev/vfio/<group> exists, or the node gone before the driver link) keeps the sysfs health it had before: what
  // such a scan saw clears by itself and is not the GPU's health. The first scan that started after the move ended
  // decides (the move's end asks for one).
  void KeepHealthThroughMoves(const node::State& state, std::vector<GpuDevice>* devices) {
    std::map<std::string, std::string> judged;
    for (GpuDevice& device : *devices) {
      auto before = sysfs_health_.find(device.bdf);
      if (before != sysfs_health_.end() && device.unhealthy_reason != before->second &&
          moves_.Overlaps(device.bdf, state.scan_started, state.scan_ended)) {
        spdlog::debug("DRA device {} ({}): scanned while its IOMMU group was moving (\"{}\"); keeping \"{}\" until a "
                      "scan after the move", device.slice.name, device.bdf, device.unhealthy_reason, before->second);
        device.unhealthy_reason = before->second;
      }
      judged[device.bdf] = device.unhealthy_reason;
    }
    sysfs_health_ = std::move(judged);
    moves_.ForgetEndedBefore(state.scan_started);  // every later scan starts after this one
  }

  // vm-vgpu: the node's vGPUs. Each problem (a vGPU not published, and why) is logged once while it lasts: the
  // safety rescan must not repeat it.
  std::vector<GpuDevice> Vgpus(const node::State& state, const std::vector<GpuDevice>& previous) {
    VgpuDevices built =
        VgpusOf(state.snapshot, vgpu::GoneReasons(options_.paths.sysfs_root, state.inventory, *state.discovery),
                options_.pci_ids, options_.domain, options_.driver_name, previous);
    std::set<std::string> problems(built.problems.begin(), built.problems.end());
    for (const std::string& problem : problems) {
      if (!vgpu_problems_.contains(problem)) spdlog::warn("DRA vGPU: {}", problem);
    }
    for (const std::string& problem : vgpu_problems_) {
      if (!problems.contains(problem)) spdlog::info("DRA vGPU: no longer: {}", problem);
    }
    vgpu_problems_ = std::move(problems);
    std::vector<GpuDevice> devices;
    for (VgpuDevice& vgpu : built.vgpus) devices.push_back(std::move(vgpu.device));
    return devices;
  }

  static void LogChanges(const std::vector<GpuDevice>& previous, const std::vector<GpuDevice>& next) {
    std::map<std::string, const GpuDevice*> before;
    for (const GpuDevice& device : previous) before[device.slice.name] = &device;
    for (const GpuDevice& device : next) {
      auto it = before.find(device.slice.name);
      const bool was_healthy = it != before.end() && it->second->healthy();
      if (it != before.end() && was_healthy == device.healthy() && *it->second == device) continue;
      if (device.healthy()) {
        spdlog::info("DRA device {} ({}): Healthy", device.slice.name, device.bdf);
      } else {
        spdlog::warn("DRA device {} ({}): Unhealthy: {}", device.slice.name, device.bdf, device.unhealthy_reason);
      }
    }
  }

  void SendHealth(const std::vector<GpuDevice>& devices) {
    const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                            std::chrono::system_clock::now().time_since_epoch()).count();
    health_.Publish(internal::HealthMessage(devices, options_.node_name, now));
    health_sent_ = true;
    next_health_ = Clock::now() + kHealthRefresh;
  }

  void SyncSlices() {
    const Clock::time_point now = Clock::now();
    if (watch_sync_pending_) last_watch_sync_ = now;
    watch_sync_pending_ = false;
    std::vector<kube::SliceDevice> slices;
    for (const GpuDevice& device : Devices()) slices.push_back(device.slice);
    if (options_.workload != Workload::kVmVgpu) {
      // Only the slices carry it: a held sibling is reserved, not unhealthy, so devices_ and the health stream
      // never see it.
      std::vector<GroupHold> holds;
      {
        std::lock_guard lock(holds_mu_);
        holds = holds_;
      }
      LogHeldSiblings(ApplyGroupHeldTaints(&slices, holds, options_.driver_name));
    }
    absl::StatusOr<kube::PublishResult> result = options_.publish_slices(std::move(slices));
    if (result.ok() && result->binding_conditions_dropped && binding_) {
      // Kubernetes < 1.36 (or the gates off): the scheduler never waits, so nothing is watched; Prepare binds.
      spdlog::warn("DRA driver {}: the API server drops bindingConditions; the claim watch stops and GPUs are made "
                   "ready in Prepare as without --binding-conditions", options_.driver_name);
      binding_.reset();  // joins its threads; no lock of ours is held
    }
    std::lock_guard lock(mu_);
    if (!result.ok()) {
      // Retried in a second: an API server that is down costs one failed request a second, no more.
      if (slice_error_ != result.status().message()) {
        spdlog::error("DRA ResourceSlices of node {}: {}", options_.node_name, std::string(result.status().message()));
      }
      slice_error_ = std::string(result.status().message());
      next_slices_ = now + kSliceRetry;
      return;
    }
    slice_error_.clear();
    slices_stale_ = false;
    if (result->others_meanwhile) {
      // A watch report held back during our writes: someone else changed a slice meanwhile. Set here, on the loop's
      // own thread, it must also wake the wait that follows, or it is seen only at the next wake-up (the resync).
      slices_changed_ = true;
      wakeup_.Notify();
    }
    if (result->changed()) {
      ++slice_writes_;
      spdlog::info("DRA ResourceSlices of node {}: generation {} ({} created, {} updated, {} deleted{})",
                   options_.node_name, result->generation, result->created, result->updated, result->deleted,
                   result->left_out > 0 ? absl::StrCat("; ", result->left_out, " unhealthy or group-held left out")
                                        : "");
    }
    next_slices_ = now < slice_burst_until_ ? now + kSliceBurstInterval : now + slice_resync_;
  }

  // One line per GPU that becomes or stops being a held sibling.
  void LogHeldSiblings(std::map<std::string, HeldSibling> held) {
    for (const auto& [name, sibling] : held) {
      auto it = held_logged_.find(name);
      if (it != held_logged_.end() && it->second == sibling) continue;
      spdlog::info("DRA device {} ({}): taint {}={}: its IOMMU group is held by {}; off new allocations until "
                   "that claim is unprepared", name, sibling.bdf, Qualified(options_.driver_name, kTaintGroupHeld),
                   sibling.group, sibling.claim);
    }
    for (const auto& [name, sibling] : held_logged_) {
      if (!held.contains(name)) {
        spdlog::info("DRA device {} ({}): IOMMU group {} no longer held by another claim; taint {} removed", name,
                     sibling.bdf, sibling.group, Qualified(options_.driver_name, kTaintGroupHeld));
      }
    }
    held_logged_ = std::move(held);
  }

  // A claim prepared here whose ResourceClaim the API no longer has (deleted while the agent was down, or an
  // Unprepare the kubelet never sent) is cleaned up: CDI spec, metadata, checkpoint, and the GPUs as Unprepare
  // leaves them (on vfio-pci, or with --bind-on-prepare back on their recorded drivers).
  void SweepStaleClaims() {
    if (!options_.get_claim) return;
    std::vector<internal::PreparedClaim> prepared;
    {
      std::lock_guard lock(serialize_);
      prepared = claims_.Prepared();
    }
    for (const internal::PreparedClaim& claim : prepared) {
      if (stopping_) return;
      // Asked without holding Prepare/Unprepare: a GET may take its whole timeout.
      absl::StatusOr<kube::ResourceClaim> current = options_.get_claim(claim.namespace_name, claim.name);
      std::string why;
      if (!current.ok() && current.status().code() == absl::StatusCode::kNotFound) {
        why = "deleted";
      } else if (current.ok() && current->uid != claim.uid) {
        why = absl::StrCat("replaced by UID ", current->uid);
      } else {
        continue;  // still there, or the API did not answer: asked again next sweep
      }
      std::lock_guard lock(serialize_);
      if (absl::Status forgotten = claims_.Forget(claim.uid); !forgotten.ok()) {
        spdlog::warn("DRA claim {}/{} ({}) {}: {}", claim.namespace_name, claim.name, claim.uid, why,
                     std::string(forgotten.message()));
        continue;
      }
      spdlog::info("DRA claim {}/{} ({}) {} in the API: released (CDI spec, metadata, checkpoint, binding policy)",
                   claim.namespace_name, claim.name, claim.uid, why);
    }
  }

  // Its own thread: GETs of an API that does not answer must not hold the health stream or the slices.
  void SweepLoop() {
    NameThisThread("dra-claims");
    std::unique_lock lock(sweep_mu_);
    while (!stopping_) {
      lock.unlock();
      SweepStaleClaims();
      lock.lock();
      sweep_cv_.wait_for(lock, kClaimSweep, [this] { return stopping_.load(); });
    }
  }

  // Blocks until something under <dev_root>/vfio (or vfio/ itself, or /dev/iommu) changed (true), a wake-up from
  // another thread (a registration, Fabric Manager, Stop) or `until`. A directory not watched yet is looked for
  // every second.
  bool WaitForDevices(Clock::time_point until) {
    if (!dirs_.complete()) until = std::min(until, Clock::now() + kMaxPollWait);
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now());
    const int timeout_ms = until == Clock::time_point::max()
                               ? -1
                               : static_cast<int>(std::clamp<int64_t>(left.count(), 0, INT32_MAX));
    pollfd fds[2] = {{dirs_.fd(), POLLIN, 0}, {wakeup_.fd(), POLLIN, 0}};
    bool devices = false;
    if (::poll(fds, 2, timeout_ms) > 0) {
      if (fds[1].revents & POLLIN) wakeup_.Drain();
      if (fds[0].revents & POLLIN) devices = dirs_.Drain().devices;
    }
    dirs_.Refresh({}, options_.paths.dev_root);
    return devices;
  }

  void Loop() {
    NameThisThread("dra-devices");
    Clock::time_point next_rescan = Clock::now() + options_.rescan_interval;
    Clock::time_point settle = Clock::time_point::max();
    while (!stopping_) {
      if (registered_.exchange(false)) {
        slice_burst_until_ = Clock::now() + kSliceBurst;
        slices_stale_ = true;
      }
      if (holds_changed_.exchange(false)) slices_stale_ = true;  // a Prepare or Unprepare: republished now
      if (slices_changed_.exchange(false)) {
        // Someone else deleted or changed a slice: put it back now, but after a pass the watch asked for, the
        // next one no sooner than a second later (another writer that keeps changing them gets one write a second).
        watch_sync_pending_ = true;
        next_slices_ = std::min(next_slices_, last_watch_sync_ + kSliceBurstInterval);
      }
      if (options_.publish_slices && (slices_stale_ || Clock::now() >= next_slices_)) SyncSlices();
      Clock::time_point wake = std::min({next_rescan, settle, next_health_});
      if (options_.publish_slices) wake = std::min(wake, next_slices_);
      const bool devices_changed = WaitForDevices(wake);
      if (stopping_) break;
      const Clock::time_point now = Clock::now();
      const bool fabric_changed = fabric_changed_.exchange(false);  // FM's partitions, so the attributes, may differ
      bool rescan = fabric_changed;
      if (!own_source_) {
        // `run`'s loop follows the devices and rescans the shared source; its states arrive through the subscription.
        Refresh(fabric_changed);
      } else {
        if (move_ended_.exchange(false)) rescan = true;  // a scan that starts after the move ended
        if (devices_changed) {
          rescan = true;
          settle = now + kSettleRescan;
        } else if (now >= settle) {
          settle = Clock::time_point::max();
          rescan = true;
        }
        if (rescan || now >= next_rescan) {
          next_rescan = now + options_.rescan_interval;
          Rescan();
        }
      }
      if (Clock::now() >= next_health_) SendHealth(Devices());
    }
  }

  // The kubelet takes a device not reported within its health_check_timeout_seconds as Unknown (healthinfo.go), so
  // the full list is sent again well inside that even when nothing changed.
  static constexpr std::chrono::seconds kHealthRefresh{internal::kHealthCheckTimeoutSeconds / 3};
  static constexpr std::chrono::milliseconds kSettleRescan{25};  // second look after a device event
  static constexpr std::chrono::milliseconds kMaxPollWait{1000};  // while an inotify watch is missing
  // NVIDIA's driver sweeps every 10 minutes; a claim deleted while the agent was down is cleaned up at its start
  // and one the kubelet never unprepared within a minute.
  static constexpr std::chrono::seconds kClaimSweep{60};
  static constexpr std::chrono::seconds kSliceRetry{1};
  static constexpr std::chrono::seconds kSliceBurst{5};
  static constexpr std::chrono::seconds kSliceBurstInterval{1};

  const DriverOptions options_;
  // The loop thread's (Start's first Rescan runs before the thread exists): the driver's own (`serve`), or `run`'s,
  // whose subscription posts each new state to the loop.
  const std::unique_ptr<node::Source> own_source_;
  node::Source& source_;
  const std::chrono::milliseconds slice_resync_;
  std::optional<uint64_t> subscription_;
  std::mutex posted_mu_;
  std::shared_ptr<const node::State> posted_;
  internal::RegistrationService registration_;
  internal::MoveTracker moves_;  // before claims_, which records its binds and returns here
  internal::FabricClaims fabric_;
  internal::ClaimPreparer claims_;
  const bool binding_wanted_;
  std::set<std::string> vgpu_problems_;   // vm-vgpu: the last rescan's, logged once each
  std::mutex serialize_;
  internal::DraServiceV1 v1_;
  internal::DraServiceV1beta1 v1beta1_;
  internal::HealthService health_;
  node::DirWatcher dirs_;  // the loop thread's
  node::Wakeup wakeup_;
  std::unique_ptr<grpc::Server> dra_server_;
  std::unique_ptr<grpc::Server> registration_server_;
  std::unique_ptr<kube::ResourceSliceWatch> slice_watch_;  // its own thread; reset before the loop is joined
  // --binding-conditions: its own threads; ended by the loop thread (the server drops the fields) or by Stop.
  std::unique_ptr<internal::BindingWorker> binding_;

  mutable std::mutex mu_;  // devices_ and the slice counters, read by other threads
  std::vector<GpuDevice> devices_;
  int slice_writes_ = 0;
  std::string slice_error_;

  // The GPUs claims hold (ClaimPreparer::OnHoldsChanged, under serialize_ on the caller's thread), read by the loop.
  std::mutex holds_mu_;
  std::vector<GroupHold> holds_;
  std::atomic<bool> holds_changed_{false};

  // The loop thread's own (Start's Rescan runs before the thread exists).
  std::map<std::string, HeldSibling> held_logged_;  // the group-held devices of the last slice sync
  bool health_sent_ = false;
  bool slices_stale_ = true;
  std::map<std::string, std::string> sysfs_health_;  // BDF -> the last Take's health from sysfs (before FM's)
  Clock::time_point next_health_ = Clock::time_point::max();
  Clock::time_point next_slices_{};
  Clock::time_point slice_burst_until_{};
  Clock::time_point last_watch_sync_{};
  bool watch_sync_pending_ = false;
  std::atomic<bool> registered_{false};
  std::atomic<bool> slices_changed_{false};  // set by the slice watch's thread
  std::atomic<bool> fabric_changed_{false};
  std::atomic<bool> move_ended_{false};  // own source: a GPU's move ended, rescan
  std::atomic<bool> stopping_{false};
  std::thread loop_;
  std::mutex sweep_mu_;
  std::condition_variable sweep_cv_;
  std::thread sweeper_;
};

Driver::Driver(DriverOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
Driver::~Driver() { Stop(); }
absl::Status Driver::Start() { return impl_->Start(); }
void Driver::Stop() { impl_->Stop(); }
RegistrationStatus Driver::Registration() const { return impl_->Registration(); }
std::vector<GpuDevice> Driver::Devices() const { return impl_->Devices(); }
int Driver::HealthStreams() const { return impl_->HealthStreams(); }
int Driver::SliceWrites() const { return impl_->SliceWrites(); }
std::string Driver::SliceError() const { return impl_->SliceError(); }
std::optional<fabric::FabricStatus> Driver::Fabric() const { return impl_->Fabric(); }
std::string Driver::FabricUnusable(const std::string& bdf) const { return impl_->FabricUnusable(bdf); }

absl::Status Serve(const DriverOptions& options) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  // Blocked before any thread starts, so every thread inherits the mask and sigwait sees the signal.
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  Driver driver(options);
  if (absl::Status status = driver.Start(); !status.ok()) return status;
  int signal = 0;
  sigwait(&signals, &signal);
  spdlog::info("signal {}: DRA driver {} deregistering and removing its sockets", signal, options.driver_name);
  driver.Stop();
  return absl::OkStatus();
}

}  // namespace vfio_agent::dra
