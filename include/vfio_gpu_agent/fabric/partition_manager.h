// Shared-NVSwitch mode: which GPUs may be advertised, which partition an allocation gets, and the partitions
// released once no pod holds their GPUs. One FM connection for the process, reconnected when it breaks.
//
// After an FM restart FM must be told which partitions are active (fmSetActivatedFabricPartitions); in resiliency
// mode (FABRIC_MODE_RESTART=1) it refuses every partition call, reads included, with FM_ST_NOT_CONFIGURED until it
// is told, and exits if it is not told within 60 s. So FM is told from what the agent already knows, before any
// read: the partition table it last read (kept in memory and in FabricOptions::checkpoint, so that an agent that
// restarted too can tell) and what its holders hold. It is told after a reconnect, and whenever a read is refused
// with FM_ST_NOT_CONFIGURED (FM restarted before this process connected).
// Thread-safe: Allocate and Preferred run on gRPC threads, Reconcile on the agent's fabric thread.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "vfio_gpu_agent/fabric/fm_client.h"
#include "vfio_gpu_agent/fabric/partitions.h"

namespace vfio_agent::fabric {

struct FabricOptions {
  std::string address;  // as NvfmOptions::address; shown in messages
  // fail_open: a GPU FM cannot vouch for is still advertised (with a warning) and an allocation that is no
  // partition gets each GPU's own single-GPU partition. Closed (default): neither happens.
  bool fail_open = false;
  // A partition Allocate activated is kept this long before pod-resources must show a pod holding it: the
  // kubelet records the assignment only after our answer.
  std::chrono::milliseconds activation_grace{5000};
  // "<state-dir>/fabric-partitions.txt": FM's partition table as last read, and the partitions this agent asked FM
  // to activate for an owner (written before FM is asked), kept across agent restarts. "" = in memory only.
  std::filesystem::path checkpoint;
};

// What the agent tells its host about the fabric (events, metrics); called without the manager's lock held.
class FabricObserver {
 public:
  virtual ~FabricObserver() = default;
  virtual void OnPartitionActivated(const Partition& partition, const std::vector<std::string>& for_gpus) = 0;
  virtual void OnPartitionDeactivated(const Partition& partition, const std::string& why) = 0;
  // FM refused: `fm_status` is FM's name for the code ("FM_ST_NVLINK_ERROR"), or "unavailable".
  virtual void OnActivationFailed(const std::vector<std::string>& gpus, const std::string& fm_status,
                                  const std::string& message) = 0;
  virtual void OnFabricWarning(const std::string& reason, const std::string& message) = 0;
  // What Unusable() answers may have changed (FM came, went, or changed its partitions).
  virtual void OnFabricStateChanged() {}
};

// What pods hold now (pod-resources): every GPU, and each container's GPUs, from which the partitions that serve
// a pod are known even when FM forgot them and this process never saw them active.
// What FM is told after its restart is exactly the partitions that serve a holder: `partitions`, then each container's
// exact partition (skipping any that overlaps one already chosen), then partitions Allocate activated moments ago.
struct Held {
  Held() = default;
  Held(std::set<std::string> gpus) : gpus(std::move(gpus)) {}  // NOLINT(google-explicit-constructor): no containers known
  Held(std::set<std::string> gpus, std::vector<std::set<std::string>> containers)
      : gpus(std::move(gpus)), containers(std::move(containers)) {}
  std::set<std::string> gpus;
  std::vector<std::set<std::string>> containers;
  std::set<uint32_t> partitions;  // known by id to serve a holder (DRA: a prepared claim's recorded partitions)
};

// Whether a Reconcile pass may deactivate the active partitions nobody holds.
enum class Release { kUnheld, kNothing };

struct FabricStatus {
  bool connected = false;
  std::string error;  // the last failure talking to FM; "" when the last call worked
  PartitionTable table;  // as of the last successful read
  int reconnects = 0;    // connections made after one was lost
  uint64_t generation = 0;  // bumped whenever what Unusable() answers may have changed
};

class PartitionManager {
 public:
  using ClientFactory = std::function<absl::StatusOr<std::unique_ptr<FmClient>>()>;
  using Clock = std::function<std::chrono::steady_clock::time_point()>;

  PartitionManager(FabricOptions options, ClientFactory connect, FabricObserver* observer = nullptr,
                   Clock clock = std::chrono::steady_clock::now);
  ~PartitionManager();

  // One pass: connect if needed (after a lost connection, fmSetActivatedFabricPartitions with what is still
  // held), read the partitions, adopt the active ones found, and deactivate every active partition none of
  // whose GPUs `held` names (nullopt = pod-resources did not answer: nothing is released).
  // Release::kNothing: `held` is only what FM is told after a restart (the caller does not yet know every holder).
  absl::Status Reconcile(const std::optional<Held>& held, Release release = Release::kUnheld);

  // Why `bdf` must not be advertised now; "" when it may. Fail-open answers "" throughout.
  std::string Unusable(const std::string& bdf) const;

  // The partition-aligned choice for GetPreferredAllocation; nullopt when there is none (the caller falls back
  // to its own choice and this reports it).
  std::optional<std::vector<std::string>> Preferred(const std::set<std::string>& free, const std::set<std::string>& must,
                                                    int size, const std::map<std::string, int>& numa);

  // Before Allocate answers: `gpus` must be exactly one supported partition, which is then active (an
  // overlapping partition left active by a finished pod is deactivated first). The error names the
  // partitions that would work, or FM's status.
  // `owner` (non-empty): recorded in the checkpoint as the partition's owner before FM is asked to activate it, so a
  // process that dies before its caller recorded the allocation leaves a trace (Owners) after its restart.
  absl::Status PrepareAllocation(const std::set<std::string>& gpus, const std::string& owner = "");

  // Partitions activated for an owner (PrepareAllocation's `owner`, this process or one before it) that FM has not
  // been seen to report inactive since, and this agent has not deactivated.
  std::map<uint32_t, std::string> Owners() const;

  FabricStatus Status() const;

 private:
  absl::Status ConnectLocked();
  // fmSetActivatedFabricPartitions with exactly the partitions that serve a holder (Held), found in the table last
  // read or, before any read, the checkpointed one. Refused while no holder list is known.
  absl::Status TellActivatedLocked();
  void LoadCheckpoint();
  void SaveCheckpointLocked();
  absl::Status ReadLocked();
  void DropLocked(const absl::Status& why);
  // By value: a read of FM's list replaces the table the caller found it in.
  absl::Status ActivateLocked(Partition partition, const std::set<std::string>& gpus, const std::string& owner,
                              std::vector<std::function<void()>>* notes);
  bool HeldLocked(const Partition& partition) const;
  void SetErrorLocked(std::string error);

  const FabricOptions options_;
  const ClientFactory connect_;
  FabricObserver* const observer_;
  const Clock clock_;

  mutable std::mutex mu_;
  std::unique_ptr<FmClient> client_;
  bool ever_connected_ = false;
  bool must_tell_ = false;  // reconnected: FM has not yet been told which partitions are active
  bool read_once_ = false;
  FabricStatus status_;
  Held last_held_;  // as of the last pod-resources answer
  bool held_known_ = false;  // last_held_ is an answer (nothing may be told before one)
  PartitionTable checkpointed_;  // the checkpoint's table (no active flags): what is told before any read
  std::map<uint32_t, std::string> owners_;  // Owners(), as checkpointed
  std::map<uint32_t, std::chrono::steady_clock::time_point> activated_at_;  // by Allocate, this process
};

}  // namespace vfio_agent::fabric
