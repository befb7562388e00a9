#include "vfio_gpu_agent/fabric/partition_manager.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/fabric/nvfm_api.h"

namespace vfio_agent::fabric {
namespace {

bool Overlaps(const Partition& a, const Partition& b) {
  return std::any_of(a.gpus.begin(), a.gpus.end(),
                     [&](const std::string& gpu) { return std::binary_search(b.gpus.begin(), b.gpus.end(), gpu); });
}

bool Is(const absl::Status& status, int fm_code) { return FmReturnOf(status) == fm_code; }

std::string FmStatusName(const absl::Status& status) {
  const std::optional<int> code = FmReturnOf(status);
  if (!code) return "unavailable";
  const char* name = nvfm::ReturnName(*code);
  return name != nullptr ? name : absl::StrCat("FM_ST_", *code);
}

}  // namespace

PartitionManager::PartitionManager(FabricOptions options, ClientFactory connect, FabricObserver* observer, Clock clock)
    : options_(std::move(options)), connect_(std::move(connect)), observer_(observer), clock_(std::move(clock)) {
  status_.error = "not connected yet";
}

PartitionManager::~PartitionManager() = default;

void PartitionManager::SetErrorLocked(std::string error) {
  const bool usable_before = status_.connected && status_.error.empty() && read_once_;
  status_.error = std::move(error);
  const bool usable_now = status_.connected && status_.error.empty() && read_once_;
  if (usable_before != usable_now) ++status_.generation;
}

void PartitionManager::DropLocked(const absl::Status& why) {
  if (client_) spdlog::warn("fabric: connection to Fabric Manager at {} lost: {}", options_.address, why.ToString());
  client_.reset();
  status_.connected = false;
  for (const Partition& partition : status_.table.partitions()) {
    if (partition.active) active_before_loss_.insert(partition.id);
  }
  SetErrorLocked(std::string(why.message()));
}

bool PartitionManager::HeldLocked(const Partition& partition) const {
  return std::any_of(partition.gpus.begin(), partition.gpus.end(),
                     [&](const std::string& gpu) { return last_held_.gpus.contains(gpu); });
}

absl::Status PartitionManager::ConnectLocked() {
  absl::StatusOr<std::unique_ptr<FmClient>> client = connect_();
  if (!client.ok()) return client.status();
  client_ = *std::move(client);
  status_.connected = true;
  if (ever_connected_) {
    // FM may have restarted and forgotten what it had activated: it is told what still serves a pod.
    ++status_.reconnects;
    // Until FM has heard it (it may still be initialising), every pass tells it again.
    must_tell_ = true;
  } else {
    spdlog::info("fabric: connected to Fabric Manager at {}", options_.address);
  }
  ever_connected_ = true;
  return absl::OkStatus();
}

absl::Status PartitionManager::TellActivatedLocked() {
  // What serves a pod: a container's exact partition, a held partition that was active before the connection was
  // lost (or is now), or one activated moments ago (the kubelet has not recorded its pod yet).
  std::set<uint32_t> active;
  for (const std::set<std::string>& container : last_held_.containers) {
    if (const Partition* partition = status_.table.Exact(container)) active.insert(partition->id);
  }
  const auto now = clock_();
  for (const Partition& partition : status_.table.partitions()) {
    auto activated = activated_at_.find(partition.id);
    const bool young = activated != activated_at_.end() && now - activated->second < options_.activation_grace;
    const bool was_active = partition.active || active_before_loss_.contains(partition.id);
    if (young || (was_active && HeldLocked(partition))) active.insert(partition.id);
  }
  const std::vector<uint32_t> list(active.begin(), active.end());
  if (absl::Status told = client_->SetActivated(list); !told.ok()) return told;
  must_tell_ = false;
  active_before_loss_.clear();
  spdlog::info("fabric: reconnected to {}; told it the active partitions: [{}]", options_.address,
               absl::StrJoin(list, ","));
  return absl::OkStatus();
}

absl::Status PartitionManager::ReadLocked() {
  absl::StatusOr<PartitionTable> table = client_->Partitions();
  if (!table.ok()) return table.status();
  if (!read_once_) {
    std::vector<std::string> active;
    for (const Partition& partition : table->partitions()) {
      if (partition.active) active.push_back(Describe(partition));
    }
    spdlog::info("fabric: {} supported partitions (sizes {}); active: [{}]", table->partitions().size(),
                 absl::StrJoin(table->Sizes(), ","), absl::StrJoin(active, " "));
  }
  if (!(*table == status_.table)) ++status_.generation;
  status_.table = *std::move(table);
  read_once_ = true;
  return absl::OkStatus();
}

absl::Status PartitionManager::Reconcile(const std::optional<Held>& held) {
  std::vector<std::function<void()>> notes;
  absl::Status result;
  {
    std::lock_guard lock(mu_);
    const uint64_t generation = status_.generation;
    if (held) last_held_ = *held;
    // FM is told after a read: the partitions of the held containers are found in its table.
    auto connect_and_read = [&] {
      absl::Status status = client_ ? absl::OkStatus() : ConnectLocked();
      if (status.ok()) status = ReadLocked();
      if (status.ok() && must_tell_) {
        status = TellActivatedLocked();
        if (status.ok()) status = ReadLocked();
      }
      return status;
    };
    result = connect_and_read();
    if (!result.ok() && client_ && ConnectionLost(result)) {
      // FM restarted under a working connection: reconnect now, so that FM hears what is active at once.
      DropLocked(result);
      result = connect_and_read();
    }
    if (result.ok() && held) {
      const auto now = clock_();
      for (const Partition& partition : status_.table.partitions()) {
        if (!partition.active || HeldLocked(partition)) continue;
        auto activated = activated_at_.find(partition.id);
        if (activated != activated_at_.end() && now - activated->second < options_.activation_grace) continue;
        absl::Status released = client_->Deactivate(partition.id);
        if (released.ok() || Is(released, nvfm::kUninitialized)) {
          activated_at_.erase(partition.id);
          spdlog::info("fabric: partition {} deactivated: no pod holds its GPUs", Describe(partition));
          notes.push_back([this, partition] { observer_->OnPartitionDeactivated(partition, "no pod holds its GPUs"); });
        } else {
          spdlog::warn("fabric: partition {} is no longer used, but deactivating it failed: {}", Describe(partition),
                       released.ToString());
          result = released;
          break;
        }
      }
      if (result.ok()) result = ReadLocked();
    }
    if (!result.ok()) {
      if (client_ && ConnectionLost(result)) {
        DropLocked(result);
      } else {
        if (status_.error != result.message()) {
          spdlog::warn("fabric: Fabric Manager at {}: {}", options_.address, result.ToString());
        }
        SetErrorLocked(std::string(result.message()));
      }
    } else {
      SetErrorLocked("");
    }
    if (status_.generation != generation) notes.push_back([this] { observer_->OnFabricStateChanged(); });
  }
  if (observer_ != nullptr) {
    for (auto& note : notes) note();
  }
  return result;
}

std::string PartitionManager::Unusable(const std::string& bdf) const {
  if (options_.fail_open) return "";
  std::lock_guard lock(mu_);
  if (!status_.connected || !status_.error.empty() || !read_once_) {
    return absl::StrCat("Fabric Manager at ", options_.address, " not usable: ", status_.error);
  }
  if (!status_.table.Contains(bdf)) return "in no supported Fabric Manager partition";
  return "";
}

std::optional<std::vector<std::string>> PartitionManager::Preferred(const std::set<std::string>& free,
                                                                    const std::set<std::string>& must, int size,
                                                                    const std::map<std::string, int>& numa) {
  PartitionTable table;
  {
    std::lock_guard lock(mu_);
    if (!read_once_) return std::nullopt;
    table = status_.table;
  }
  std::optional<std::vector<std::string>> chosen = PreferredPartition(table, free, must, size, numa);
  if (!chosen && observer_ != nullptr) {
    const std::set<int> sizes = table.Sizes();
    observer_->OnFabricWarning(
        "NoFreePartition",
        sizes.contains(size)
            ? absl::StrCat("no free Fabric Manager partition of ", size, " GPUs holds the GPUs offered; the kubelet "
                           "picks GPUs that are no partition, and Allocate will refuse them")
            : absl::StrCat("no Fabric Manager partition has ", size, " GPUs (sizes: ", absl::StrJoin(sizes, ", "),
                           "); ask for a partition size"));
  }
  return chosen;
}

// NOLINTNEXTLINE(performance-unnecessary-value-param): a read replaces the table `partition` would point into.
absl::Status PartitionManager::ActivateLocked(Partition partition, const std::set<std::string>& gpus,
                                              std::vector<std::function<void()>>* notes) {
  const std::string requested = absl::StrJoin(gpus, ",");
  for (const Partition& other : status_.table.partitions()) {
    if (other.id == partition.id || !other.active || !Overlaps(other, partition)) continue;
    for (const std::string& gpu : other.gpus) {
      if (!gpus.contains(gpu) && last_held_.gpus.contains(gpu)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "Fabric Manager partition ", Describe(other), " is active and its GPU ", gpu,
            " is held by a pod: it cannot be deactivated for ", Describe(partition)));
      }
    }
    absl::Status released = client_->Deactivate(other.id);
    if (!released.ok() && !Is(released, nvfm::kUninitialized)) {
      if (ConnectionLost(released)) DropLocked(released);
      notes->push_back([this, gpus, name = FmStatusName(released), message = std::string(released.message())] {
        observer_->OnActivationFailed({gpus.begin(), gpus.end()}, name, message);
      });
      return absl::Status(released.code(), absl::StrCat("deactivate overlapping partition ", Describe(other),
                                                        " for [", requested, "]: ", released.message()));
    }
    activated_at_.erase(other.id);
    spdlog::info("fabric: partition {} deactivated: it overlaps {}, requested for [{}]", Describe(other),
                 Describe(partition), requested);
    notes->push_back([this, other, partition] {
      observer_->OnPartitionDeactivated(other, absl::StrCat("it overlaps ", Describe(partition)));
    });
  }
  absl::Status activated = client_->Activate(partition.id);
  if (Is(activated, nvfm::kInUse)) {
    // In use means active already, or a GPU of it held by a partition this process did not see: only FM's list
    // tells which.
    if (absl::Status read = ReadLocked(); !read.ok()) {
      activated = read;
    } else if (const Partition* now = status_.table.Find(partition.id); now != nullptr && now->active) {
      activated = absl::OkStatus();
    }
  }
  if (!activated.ok()) {
    if (ConnectionLost(activated)) DropLocked(activated);
    notes->push_back([this, gpus, name = FmStatusName(activated), message = std::string(activated.message())] {
      observer_->OnActivationFailed({gpus.begin(), gpus.end()}, name, message);
    });
    return absl::Status(activated.code() == absl::StatusCode::kUnavailable ? absl::StatusCode::kUnavailable
                                                                           : absl::StatusCode::kFailedPrecondition,
                        absl::StrCat("activate Fabric Manager partition ", Describe(partition), ": ",
                                     activated.message()));
  }
  activated_at_[partition.id] = clock_();
  // The table is rebuilt from FM's answer at the next read; until then it must show what was just done.
  std::vector<Partition> partitions = status_.table.partitions();
  for (Partition& entry : partitions) {
    if (entry.id == partition.id) entry.active = true;
    else if (entry.active && Overlaps(entry, partition)) entry.active = false;
  }
  status_.table = PartitionTable(std::move(partitions));
  spdlog::info("fabric: partition {} active for [{}]", Describe(partition), requested);
  notes->push_back([this, partition, gpus] { observer_->OnPartitionActivated(partition, {gpus.begin(), gpus.end()}); });
  return absl::OkStatus();
}

absl::Status PartitionManager::PrepareAllocation(const std::set<std::string>& gpus) {
  std::vector<std::function<void()>> notes;
  absl::Status result;
  {
    std::lock_guard lock(mu_);
    const std::string requested = absl::StrJoin(gpus, ",");
    if (!client_ || !read_once_ || !status_.error.empty()) {
      const std::string why = absl::StrCat("Fabric Manager at ", options_.address, " not usable (", status_.error,
                                           "): without an active partition the VM's CUDA fails with error 802");
      if (!options_.fail_open) return absl::UnavailableError(absl::StrCat("[", requested, "]: ", why));
      spdlog::warn("fabric: [{}] allocated without a partition (--fabric-fail-mode open): {}", requested, why);
      return absl::OkStatus();
    }
    if (const Partition* exact = status_.table.Exact(gpus)) {
      result = ActivateLocked(*exact, gpus, &notes);
      if (!result.ok() && options_.fail_open) {
        spdlog::warn("fabric: [{}] allocated without its partition (--fabric-fail-mode open): {}", requested,
                     result.ToString());
        result = absl::OkStatus();
      }
    } else if (options_.fail_open) {
      // No NVLink between them, but each GPU initialises CUDA in its own single-GPU partition.
      spdlog::warn("fabric: [{}] is no partition; activating each GPU's own (--fabric-fail-mode open)", requested);
      for (const std::string& gpu : gpus) {
        const Partition* single = status_.table.Exact({gpu});
        if (single == nullptr) continue;
        if (absl::Status one = ActivateLocked(*single, {gpu}, &notes); !one.ok()) {
          spdlog::warn("fabric: {}: {}", gpu, one.ToString());
        }
      }
    } else {
      std::vector<std::string> same_size;
      for (const Partition& partition : status_.table.partitions()) {
        if (partition.gpus.size() == gpus.size()) same_size.push_back(Describe(partition));
      }
      result = absl::FailedPreconditionError(
          same_size.empty()
              ? absl::StrCat("[", requested, "] is no Fabric Manager partition: none has ", gpus.size(),
                             " GPUs (sizes: ", absl::StrJoin(status_.table.Sizes(), ", "), ")")
              : absl::StrCat("[", requested, "] is no Fabric Manager partition, so NVLink cannot be set up between "
                             "them; partitions of ", gpus.size(), " GPUs: ", absl::StrJoin(same_size, " ")));
    }
  }
  if (observer_ != nullptr) {
    for (auto& note : notes) note();
  }
  return result;
}

FabricStatus PartitionManager::Status() const {
  std::lock_guard lock(mu_);
  return status_;
}

}  // namespace vfio_agent::fabric
