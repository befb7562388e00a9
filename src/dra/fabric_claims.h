// HGX shared-NVSwitch mode of the DRA driver (`--fabric-manager`): Fabric Manager partitions for claims, through
// the same fabric::PartitionManager the device plugin uses, so its rules carry over (exactly one supported
// partition per claim, an overlapping partition a holder still uses is never taken away, FM told what is active
// after it restarts). Partitions are not devices: each GPU carries partition<N> attributes and a claim of N
// single-device requests tied by matchAttribute on one of them gets one partition.
//
// Which partitions the driver may release: only those it activated (or found recorded) for a claim. A partition
// active for no claim of this driver (a VM the device plugin started before the node moved to DRA) counts as held,
// so it is never deactivated under that VM. Activate names the claim to the manager before FM is asked, and the
// manager checkpoints it: a partition activated for a claim that no prepared claim holds after a restart (the agent
// stopped between FM's answer and the claim's checkpoint) is released by the next pass.
//
// After an FM restart FM is told exactly the prepared claims' partitions (and the active ones that are not ours),
// before any read: a restarted FM in resiliency mode answers nothing before (fabric/partition_manager.h).
//
// What happens is told to DriverOptions::fabric_observer, as the device plugin tells its own: each activation with
// the claim it is for, each release with the claim that let the partition go.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "vfio_gpu_agent/dra/devices.h"
#include "vfio_gpu_agent/dra/driver.h"
#include "vfio_gpu_agent/fabric/partition_manager.h"

namespace vfio_agent::dra::internal {

class FabricClaims final : private fabric::FabricObserver {
 public:
  // Off (no attributes, Activate answers no partition, Release does nothing) while options.fabric.address is empty.
  explicit FabricClaims(const DriverOptions& options);
  ~FabricClaims() override;  // Stop()
  FabricClaims(const FabricClaims&) = delete;
  FabricClaims& operator=(const FabricClaims&) = delete;

  bool enabled() const { return manager_ != nullptr; }

  // A claim prepared before a restart (from its checkpoint): its partitions stay active. Before Start. `claim`
  // names it in messages: "claim <namespace>/<name> (<uid>)".
  void Restore(const std::string& uid, const std::string& claim, const std::set<std::string>& gpus,
               const std::vector<uint32_t>& partitions);

  // Reads FM once (so the first slices carry the attributes), then every fabric_interval on a thread of its own:
  // `on_change` runs there whenever FM's partitions (and so the attributes) may have changed.
  void Start(std::function<void()> on_change);
  void Stop();

  // Before Prepare answers: `gpus` must be exactly one supported partition, which is then active and held by the
  // claim. The partitions now active for it (empty when the mode is off, or fail-open gave it none); the error
  // names the GPUs and the partition sizes FM has.
  absl::StatusOr<std::vector<uint32_t>> Activate(const std::string& uid, const std::string& claim,
                                                 const std::set<std::string>& gpus);

  // After the claim's files are gone (Unprepare, the stale-claim sweep, a failed Prepare): its partitions are
  // deactivated unless another claim holds one of their GPUs; one FM could not deactivate is retried every pass.
  void Release(const std::string& uid);

  // partition<N> = FM's partition id, for every size N of a partition holding the device's GPU.
  void AddAttributes(std::vector<GpuDevice>* devices) const;
  // A healthy device FM does not vouch for (FM not usable, its GPU in no supported partition) becomes unhealthy,
  // tainted: the device plugin's rule, so the VM never gets a GPU whose CUDA would fail with error 802.
  void MarkUnusable(std::vector<GpuDevice>* devices) const;
  std::string Unusable(const std::string& bdf) const;

  // nullopt while the mode is off.
  std::optional<fabric::FabricStatus> Status() const;

 private:
  struct Hold {
    std::string claim;
    std::set<std::string> gpus;
    std::vector<uint32_t> partitions;
  };

  // fabric::FabricObserver: the manager calls these inside the calls made under mu_; each becomes a note for the
  // host, with the claim named, delivered once mu_ is released (Deliver).
  void OnPartitionActivated(const fabric::Partition& partition, const std::vector<std::string>& for_gpus) override;
  void OnPartitionDeactivated(const fabric::Partition& partition, const std::string& why) override;
  void OnActivationFailed(const std::vector<std::string>& gpus, const std::string& fm_status,
                          const std::string& message) override;
  void OnFabricWarning(const std::string& reason, const std::string& message) override;
  void OnFabricStateChanged() override;
  void Deliver();

  // What no release may touch: every claim's GPUs, and the GPUs of active partitions that are not ours to release.
  fabric::Held HeldLocked();
  // Reads FM's table without releasing anything until it has been read once: before that, the active partitions
  // that are not ours are unknown.
  bool TableReadLocked();
  void PassLocked();
  void NotifyIfChanged();
  void Loop();

  const std::string driver_;
  const std::chrono::milliseconds interval_;
  const bool fail_open_;
  dra::FabricObserver* const host_;  // DriverOptions::fabric_observer; may be null
  std::unique_ptr<fabric::PartitionManager> manager_;

  std::mutex mu_;  // holds_, releasing_, table_read_, activating_, notes_ and every manager_ call
  std::map<std::string, Hold> holds_;         // by claim UID
  std::map<uint32_t, std::string> releasing_;  // ours to deactivate (their claims are gone): id -> the claim
  bool table_read_ = false;
  std::string activating_;  // during Activate: the claim
  std::vector<std::function<void()>> notes_;  // for host_, in order

  std::function<void()> on_change_;
  std::mutex notify_mu_;
  uint64_t seen_generation_ = 0;
  std::mutex loop_mu_;
  std::condition_variable loop_cv_;
  bool stopping_ = false;
  std::thread loop_;
};

}  // namespace vfio_agent::dra::internal
