#include "fabric_claims.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/common/thread_name.h"
#include "vfio_gpu_agent/dra/attributes.h"
#include "vfio_gpu_agent/fabric/fm_client.h"

namespace vfio_agent::dra::internal {
namespace {

// A partition's owner in the manager's checkpoint: the claim it was activated for.
constexpr char kOwnerPrefix[] = "dra-claim:";
constexpr size_t kOwnerPrefixSize = sizeof(kOwnerPrefix) - 1;

bool IsPartitionAttribute(const std::string& key, const std::string& prefix) {
  return key.size() > prefix.size() && key.starts_with(prefix) &&
         std::all_of(key.begin() + static_cast<std::ptrdiff_t>(prefix.size()), key.end(),
                     [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

FabricClaims::FabricClaims(const DriverOptions& options)
    : driver_(options.driver_name),
      interval_(options.fabric_interval),
      fail_open_(options.fabric.fail_open),
      host_(options.fabric_observer) {
  if (options.fabric.address.empty()) return;
  fabric::FabricOptions fabric_options = options.fabric;
  // The device plugin's grace covers the kubelet recording an allocation after Allocate answers; here the claim
  // is held (under mu_) in the same step that activates its partition, so a release can follow Unprepare at once.
  fabric_options.activation_grace = std::chrono::milliseconds(0);
  const fabric::NvfmOptions nvfm{.address = fabric_options.address, .library = options.fabric_library};
  manager_ = std::make_unique<fabric::PartitionManager>(
      fabric_options, [nvfm] { return fabric::ConnectNvfm(nvfm); }, static_cast<fabric::FabricObserver*>(this));
}

FabricClaims::~FabricClaims() { Stop(); }

void FabricClaims::Restore(const std::string& uid, const std::string& claim, const std::set<std::string>& gpus,
                           const std::vector<uint32_t>& partitions) {
  if (!manager_) return;
  std::lock_guard lock(mu_);
  holds_[uid] = {.claim = claim, .gpus = gpus, .partitions = partitions};
}

void FabricClaims::Start(std::function<void()> on_change) {
  if (!manager_) return;
  on_change_ = std::move(on_change);
  {
    std::lock_guard lock(mu_);
    PassLocked();
  }
  Deliver();
  {
    std::lock_guard lock(notify_mu_);
    seen_generation_ = manager_->Status().generation;  // the driver's first scan comes next and reads this table
  }
  loop_ = std::thread([this] { Loop(); });
}

void FabricClaims::Stop() {
  if (!loop_.joinable()) return;
  {
    std::lock_guard lock(loop_mu_);
    stopping_ = true;
  }
  loop_cv_.notify_all();
  loop_.join();
}

void FabricClaims::Loop() {
  NameThisThread("dra-fabric");
  std::unique_lock lock(loop_mu_);
  while (!loop_cv_.wait_for(lock, interval_, [this] { return stopping_; })) {
    lock.unlock();
    {
      std::lock_guard pass(mu_);
      PassLocked();
    }
    Deliver();
    NotifyIfChanged();
    lock.lock();
  }
}

bool FabricClaims::TableReadLocked() {
  // Before the first read the claims are all that is known to hold: enough to tell a restarted FM what is active
  // (it answers no read before), not to release anything.
  if (!table_read_) table_read_ = manager_->Reconcile(HeldLocked(), fabric::Release::kNothing).ok();  // logged
  return table_read_;
}

fabric::Held FabricClaims::HeldLocked() {
  fabric::Held held;
  std::set<uint32_t> claimed;
  for (const auto& [uid, hold] : holds_) {
    held.gpus.insert(hold.gpus.begin(), hold.gpus.end());
    held.containers.push_back(hold.gpus);
    claimed.insert(hold.partitions.begin(), hold.partitions.end());
  }
  held.partitions = claimed;
  const std::map<uint32_t, std::string> owners = manager_->Owners();
  const fabric::FabricStatus status = manager_->Status();
  for (const fabric::Partition& partition : status.table.partitions()) {
    if (!partition.active) {
      releasing_.erase(partition.id);
      continue;
    }
    if (claimed.contains(partition.id) || releasing_.contains(partition.id)) continue;
    // Activated for a claim of ours that holds nothing now: Prepare activated it and the agent stopped before the
    // claim's checkpoint was written (or the claim is gone). Ours to release.
    if (auto owner = owners.find(partition.id); owner != owners.end() && owner->second.starts_with(kOwnerPrefix) &&
                                                 !holds_.contains(owner->second.substr(kOwnerPrefixSize))) {
      const std::string uid = owner->second.substr(kOwnerPrefixSize);
      spdlog::info("DRA claim {}: Fabric Manager partition {} was activated for it, and no prepared claim holds it",
                   uid, fabric::Describe(partition));
      releasing_[partition.id] = absl::StrCat("claim ", uid, " (never prepared)");
      continue;
    }
    held.gpus.insert(partition.gpus.begin(), partition.gpus.end());  // not ours: its holder may still use it
    held.containers.push_back({partition.gpus.begin(), partition.gpus.end()});  // and FM is told it after a restart
  }
  return held;
}

void FabricClaims::PassLocked() {
  if (!TableReadLocked()) return;
  (void)manager_->Reconcile(HeldLocked());  // logged by the manager; a failed release is retried next pass
}

void FabricClaims::NotifyIfChanged() {
  const uint64_t generation = manager_->Status().generation;
  {
    std::lock_guard lock(notify_mu_);
    if (generation == seen_generation_) return;
    seen_generation_ = generation;
  }
  if (on_change_) on_change_();
}

absl::StatusOr<std::vector<uint32_t>> FabricClaims::Activate(const std::string& uid, const std::string& claim,
                                                             const std::set<std::string>& gpus) {
  if (!manager_) return std::vector<uint32_t>{};
  absl::StatusOr<std::vector<uint32_t>> result = [&]() -> absl::StatusOr<std::vector<uint32_t>> {
    std::lock_guard lock(mu_);
    // The manager learns what the other claims hold (an overlapping partition one of them uses is never taken).
    PassLocked();
    const fabric::FabricStatus status = manager_->Status();
    if (!fail_open_ && table_read_ && status.error.empty() && status.table.Exact(gpus) == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the GPUs [", absl::StrJoin(gpus, ","), "] are no Fabric Manager partition (partition sizes: ",
          absl::StrJoin(status.table.Sizes(), ", "), "): a claim of N GPUs ties its N requests with constraints "
          "[{matchAttribute: ", driver_, "/", PartitionAttribute(static_cast<int>(gpus.size())), "}]"));
    }
    activating_ = claim;
    absl::Status activated = manager_->PrepareAllocation(gpus, absl::StrCat(kOwnerPrefix, uid));
    activating_.clear();
    if (!activated.ok()) return activated;
    std::vector<uint32_t> partitions;
    const fabric::FabricStatus now = manager_->Status();
    for (const fabric::Partition& partition : now.table.partitions()) {
      const bool inside = std::all_of(partition.gpus.begin(), partition.gpus.end(),
                                      [&](const std::string& gpu) { return gpus.contains(gpu); });
      if (partition.active && inside) {
        partitions.push_back(partition.id);
        releasing_.erase(partition.id);
      }
    }
    holds_[uid] = {.claim = claim, .gpus = gpus, .partitions = partitions};
    return partitions;
  }();
  Deliver();
  NotifyIfChanged();
  return result;
}

void FabricClaims::Release(const std::string& uid) {
  if (!manager_) return;
  {
    std::lock_guard lock(mu_);
    auto it = holds_.find(uid);
    if (it == holds_.end()) return;
    if (!it->second.partitions.empty()) {
      spdlog::info("DRA claim {}: releasing Fabric Manager partition(s) {}", uid,
                   absl::StrJoin(it->second.partitions, ","));
    }
    for (uint32_t partition : it->second.partitions) releasing_[partition] = it->second.claim;
    holds_.erase(it);
    PassLocked();
  }
  Deliver();
  NotifyIfChanged();
}

void FabricClaims::AddAttributes(std::vector<GpuDevice>* devices) const {
  if (!manager_) return;
  // size -> id for each GPU. Where partitions of one size overlap (no HGX board's table has them) a GPU carries the
  // lowest id: N GPUs sharing a value are then still exactly that partition, since only its members carry it.
  std::map<std::string, std::map<int, uint32_t>> by_gpu;
  const fabric::FabricStatus status = manager_->Status();
  for (const fabric::Partition& partition : status.table.partitions()) {
    const int size = static_cast<int>(partition.gpus.size());
    for (const std::string& gpu : partition.gpus) {
      auto [it, inserted] = by_gpu[gpu].emplace(size, partition.id);
      if (!inserted) it->second = std::min(it->second, partition.id);
    }
  }
  const std::string prefix = absl::StrCat(driver_, "/", std::string(kPartitionAttributePrefix));
  for (GpuDevice& device : *devices) {
    // A device kept from an earlier scan carries the attributes of FM's earlier table.
    std::erase_if(device.slice.attributes,
                  [&](const auto& entry) { return IsPartitionAttribute(entry.first, prefix); });
    auto sizes = by_gpu.find(device.bdf);
    if (sizes == by_gpu.end()) continue;
    for (const auto& [size, id] : sizes->second) {
      device.slice.attributes[absl::StrCat(driver_, "/", PartitionAttribute(size))] = kube::DeviceAttribute::Int(id);
    }
  }
}

void FabricClaims::MarkUnusable(std::vector<GpuDevice>* devices) const {
  if (!manager_) return;
  for (GpuDevice& device : *devices) {
    if (!device.healthy()) continue;
    device.unhealthy_reason = manager_->Unusable(device.bdf);
    if (!device.healthy()) device.slice.taints.push_back(UnhealthyTaint(driver_));
  }
}

std::string FabricClaims::Unusable(const std::string& bdf) const { return manager_ ? manager_->Unusable(bdf) : ""; }

std::optional<fabric::FabricStatus> FabricClaims::Status() const {
  if (!manager_) return std::nullopt;
  return manager_->Status();
}

void FabricClaims::OnPartitionActivated(const fabric::Partition& partition, const std::vector<std::string>& for_gpus) {
  if (host_ == nullptr) return;
  notes_.push_back([this, partition, for_gpus, claim = activating_] {
    host_->OnClaimPartitionActivated(partition, for_gpus, claim);
  });
}

void FabricClaims::OnPartitionDeactivated(const fabric::Partition& partition, const std::string& why) {
  if (host_ == nullptr) return;
  // A partition is released when its claim is gone; the manager's own reason speaks of pods.
  auto released = releasing_.find(partition.id);
  std::string reason = released == releasing_.end() ? why : absl::StrCat(released->second, " released its GPUs");
  notes_.push_back([this, partition, reason = std::move(reason)] { host_->OnPartitionDeactivated(partition, reason); });
}

void FabricClaims::OnActivationFailed(const std::vector<std::string>& gpus, const std::string& fm_status,
                                      const std::string& message) {
  if (host_ == nullptr) return;
  notes_.push_back([this, gpus, fm_status, message] { host_->OnActivationFailed(gpus, fm_status, message); });
}

void FabricClaims::OnFabricWarning(const std::string& reason, const std::string& message) {
  if (host_ == nullptr) return;
  notes_.push_back([this, reason, message] { host_->OnFabricWarning(reason, message); });
}

void FabricClaims::OnFabricStateChanged() {
  if (host_ == nullptr) return;
  notes_.push_back([this] { host_->OnFabricStateChanged(); });
}

void FabricClaims::Deliver() {
  std::vector<std::function<void()>> notes;
  {
    std::lock_guard lock(mu_);
    notes.swap(notes_);
  }
  for (const std::function<void()>& note : notes) note();
}

}  // namespace vfio_agent::dra::internal
