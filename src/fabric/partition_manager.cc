#include "vfio_gpu_agent/fabric/partition_manager.h"

#include <algorithm>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/common/fs.h"
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

constexpr char kCheckpointHeader[] =
    "# vfio-gpu-agent: Fabric Manager's partitions as last read (partition <id> <module ids> <GPUs>), and those the "
    "agent asked FM to activate for an owner (owner <id> <owner>); read at start to tell a restarted FM what is active";

// The table's partitions without FM's active flags: what a checkpoint keeps.
PartitionTable Layout(const PartitionTable& table) {
  std::vector<Partition> partitions = table.partitions();
  for (Partition& partition : partitions) partition.active = false;
  return PartitionTable(std::move(partitions));
}

absl::Status ParseCheckpoint(const std::filesystem::path& file, const std::string& text, PartitionTable* table,
                             std::map<uint32_t, std::string>* owners) {
  std::vector<Partition> partitions;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    if (line.empty() || line.front() == '#') continue;
    std::vector<absl::string_view> words = absl::StrSplit(line, absl::MaxSplits(' ', 3));
    uint32_t id = 0;
    if (words.size() >= 3 && words[0] == "owner" && absl::SimpleAtoi(words[1], &id)) {
      (*owners)[id] = std::string(line.substr(words[0].size() + words[1].size() + 2));
      continue;
    }
    Partition partition;
    bool ok = words.size() == 4 && words[0] == "partition" && absl::SimpleAtoi(words[1], &partition.id);
    if (ok) {
      for (absl::string_view module : absl::StrSplit(words[2], ',')) {
        uint32_t value = 0;
        ok = ok && absl::SimpleAtoi(module, &value);
        partition.module_ids.push_back(value);
      }
      for (absl::string_view gpu : absl::StrSplit(words[3], ',')) partition.gpus.emplace_back(gpu.data(), gpu.size());
      std::sort(partition.gpus.begin(), partition.gpus.end());
    }
    if (!ok) {
      return absl::DataLossError(absl::StrCat("Fabric Manager checkpoint ", file.string(), " line ", number,
                                              ": not \"partition <id> <module,...> <BDF,...>\" or \"owner <id> <owner>\""));
    }
    partitions.push_back(std::move(partition));
  }
  *table = PartitionTable(std::move(partitions));
  return absl::OkStatus();
}

}  // namespace

PartitionManager::PartitionManager(FabricOptions options, ClientFactory connect, FabricObserver* observer, Clock clock)
    : options_(std::move(options)), connect_(std::move(connect)), observer_(observer), clock_(std::move(clock)) {
  status_.error = "not connected yet";
  LoadCheckpoint();
}

void PartitionManager::LoadCheckpoint() {
  if (options_.checkpoint.empty()) return;
  absl::StatusOr<std::string> text = fs::ReadTrimmed(options_.checkpoint);
  if (absl::IsNotFound(text.status())) return;
  absl::Status parsed = text.status();
  PartitionTable table;
  std::map<uint32_t, std::string> owners;
  if (parsed.ok()) parsed = ParseCheckpoint(options_.checkpoint, *text, &table, &owners);
  if (!parsed.ok()) {
    // Only a restarted FM needs it, and then only until FM answers: the next read writes it anew.
    spdlog::warn("fabric: {}; a Fabric Manager restarted before this agent's first read cannot be told what is active",
                 parsed.ToString());
    return;
  }
  checkpointed_ = std::move(table);
  owners_ = std::move(owners);
  spdlog::info("fabric: checkpoint {}: {} partitions; activated for an owner: [{}]", options_.checkpoint.string(),
               checkpointed_.partitions().size(),
               absl::StrJoin(owners_, ",", [](std::string* out, const auto& entry) { absl::StrAppend(out, entry.first); }));
}

void PartitionManager::SaveCheckpointLocked() {
  if (options_.checkpoint.empty()) return;
  std::string text = absl::StrCat(kCheckpointHeader, "\n");
  for (const Partition& partition : checkpointed_.partitions()) {
    absl::StrAppend(&text, "partition ", partition.id, " ", absl::StrJoin(partition.module_ids, ","), " ",
                    absl::StrJoin(partition.gpus, ","), "\n");
  }
  for (const auto& [id, owner] : owners_) absl::StrAppend(&text, "owner ", id, " ", owner, "\n");
  std::error_code ec;
  std::filesystem::create_directories(options_.checkpoint.parent_path(), ec);
  absl::Status written = ec ? fs::ErrnoStatus(ec.value(), "create directory", options_.checkpoint.parent_path())
                            : fs::WriteFileAtomically(options_.checkpoint, text);
  if (!written.ok()) {
    spdlog::warn("fabric: checkpoint not written ({}): an agent restarted together with Fabric Manager could not tell "
                 "it what is active", written.ToString());
  }
}

std::map<uint32_t, std::string> PartitionManager::Owners() const {
  std::lock_guard lock(mu_);
  return owners_;
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
  const PartitionTable& table = read_once_ ? status_.table : checkpointed_;
  if (!held_known_) {
    return absl::UnavailableError(absl::StrCat("Fabric Manager at ", options_.address,
                                               " not told what is active yet: what pods hold is not known yet"));
  }
  // In priority order; a candidate overlapping one already chosen is left out (FM refuses an overlapping list, and
  // a container holds exactly one partition: the other is stale).
  std::vector<uint32_t> candidates(last_held_.partitions.begin(), last_held_.partitions.end());
  for (const std::set<std::string>& container : last_held_.containers) {
    if (container.empty()) continue;
    if (const Partition* partition = table.Exact(container)) {
      candidates.push_back(partition->id);
    } else if (table.partitions().empty() && last_held_.partitions.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "Fabric Manager at ", options_.address, " cannot be told what is active: a pod holds [",
          absl::StrJoin(container, ","), "] and no partition table was read or checkpointed (",
          options_.checkpoint.empty() ? "no checkpoint file" : options_.checkpoint.string(), ")"));
    } else if (options_.fail_open) {
      for (const std::string& gpu : container) {
        if (const Partition* single = table.Exact({gpu})) candidates.push_back(single->id);
      }
    }
  }
  const auto now = clock_();
  for (const auto& [id, at] : activated_at_) {
    if (now - at < options_.activation_grace) candidates.push_back(id);
  }
  std::vector<uint32_t> list;
  for (uint32_t id : candidates) {
    if (std::find(list.begin(), list.end(), id) != list.end()) continue;
    const Partition* partition = table.Find(id);
    const auto clash = std::find_if(list.begin(), list.end(), [&](uint32_t chosen) {
      const Partition* other = table.Find(chosen);
      return partition != nullptr && other != nullptr && Overlaps(*partition, *other);
    });
    if (clash != list.end()) {
      spdlog::warn("fabric: partition {} is not told to Fabric Manager: it overlaps P{}, which a holder uses",
                   Describe(*partition), *clash);
      continue;
    }
    list.push_back(id);
  }
  std::sort(list.begin(), list.end());
  if (absl::Status told = client_->SetActivated(list); !told.ok()) return told;
  must_tell_ = false;
  spdlog::info("fabric: told Fabric Manager at {} the active partitions: [{}]", options_.address, absl::StrJoin(list, ","));
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
  bool changed = false;
  if (PartitionTable layout = Layout(status_.table); !(layout == checkpointed_)) {
    checkpointed_ = std::move(layout);
    changed = true;
  }
  // An owner's partition FM reports inactive is no one's any more (a record written before an activation that
  // failed, or never happened because the agent died first).
  changed |= std::erase_if(owners_, [&](const auto& entry) {
               const Partition* partition = status_.table.Find(entry.first);
               return partition == nullptr || !partition->active;
             }) > 0;
  if (changed) SaveCheckpointLocked();
  return absl::OkStatus();
}

absl::Status PartitionManager::Reconcile(const std::optional<Held>& held, Release release) {
  std::vector<std::function<void()>> notes;
  absl::Status result;
  {
    std::lock_guard lock(mu_);
    const uint64_t generation = status_.generation;
    if (held) {
      last_held_ = *held;
      held_known_ = true;
    }
    // A restarted FM in resiliency mode answers no read until it is told: it is told first, from what this process
    // kept (or its checkpoint) and what is held; a read it refuses with FM_ST_NOT_CONFIGURED is the same news.
    auto connect_and_read = [&] {
      absl::Status status = client_ ? absl::OkStatus() : ConnectLocked();
      if (!status.ok()) return status;
      absl::Status told = absl::UnavailableError("not told");
      if (must_tell_ && held_known_) {
        told = TellActivatedLocked();
        if (!told.ok() && ConnectionLost(told)) return told;
      }
      status = ReadLocked();
      if (Is(status, nvfm::kNotConfigured) && held_known_ && !told.ok()) {
        told = TellActivatedLocked();
        if (told.ok() || ConnectionLost(told)) {
          status = told.ok() ? ReadLocked() : told;
        } else if (!Is(told, nvfm::kNotConfigured)) {
          // Why FM stays refused (and will exit) belongs in the message the GPUs are Unhealthy with.
          absl::Status both(status.code(), absl::StrCat(status.message(), "; ", told.message()));
          status.ForEachPayload([&](auto url, const absl::Cord& payload) { both.SetPayload(url, payload); });
          status = both;
        }
      }
      if (!told.ok() && must_tell_ && held_known_) {
        if (status.ok()) {
          // FM answers without having heard it: it was not waiting for the list (no resiliency restart).
          spdlog::warn("fabric: Fabric Manager at {} answers, but did not take the active partitions: {}",
                       options_.address, told.ToString());
          must_tell_ = false;
        } else if (!Is(told, nvfm::kNotConfigured)) {
          spdlog::warn("fabric: telling Fabric Manager at {} the active partitions failed: {}", options_.address,
                       told.ToString());
        }
      }
      return status;
    };
    result = connect_and_read();
    if (!result.ok() && client_ && ConnectionLost(result)) {
      // FM restarted under a working connection: reconnect now, so that FM hears what is active at once.
      DropLocked(result);
      result = connect_and_read();
    }
    if (result.ok() && held && release == Release::kUnheld) {
      const auto now = clock_();
      for (const Partition& partition : status_.table.partitions()) {
        if (!partition.active || HeldLocked(partition)) continue;
        auto activated = activated_at_.find(partition.id);
        if (activated != activated_at_.end() && now - activated->second < options_.activation_grace) continue;
        absl::Status released = client_->Deactivate(partition.id);
        if (released.ok() || Is(released, nvfm::kUninitialized)) {
          activated_at_.erase(partition.id);
          if (owners_.erase(partition.id) > 0) SaveCheckpointLocked();
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
                                              const std::string& owner, std::vector<std::function<void()>>* notes) {
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
    if (owners_.erase(other.id) > 0) SaveCheckpointLocked();
    spdlog::info("fabric: partition {} deactivated: it overlaps {}, requested for [{}]", Describe(other),
                 Describe(partition), requested);
    notes->push_back([this, other, partition] {
      observer_->OnPartitionDeactivated(other, absl::StrCat("it overlaps ", Describe(partition)));
    });
  }
  // Recorded before FM is asked: a process that dies between FM's answer and its caller's own record leaves this.
  if (!owner.empty() && owners_[partition.id] != owner) {
    owners_[partition.id] = owner;
    SaveCheckpointLocked();
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
    // An IN_USE partition someone else activated is not this owner's; the next read drops a record of an inactive one.
    if (!owner.empty() && owners_.erase(partition.id) > 0) SaveCheckpointLocked();
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

absl::Status PartitionManager::PrepareAllocation(const std::set<std::string>& gpus, const std::string& owner) {
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
      result = ActivateLocked(*exact, gpus, owner, &notes);
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
        if (absl::Status one = ActivateLocked(*single, {gpu}, owner, &notes); !one.ok()) {
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
