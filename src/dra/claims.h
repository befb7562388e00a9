// Prepare and Unprepare. By default for GPUs already on vfio-pci, which stay there; with --bind-on-prepare the
// claim's groups are bound first and returned after (bind_policy.h). For each claim: its
// ResourceClaim read from the API (UID and allocation checked), every device allocated to this driver checked
// (whole IOMMU group on a vfio driver, group node present, held by no other prepared claim), one CDI spec, a
// KEP-5304 metadata file per request bind-mounted by that spec, and a checkpoint file. Unprepare removes all three.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "bind_policy.h"
#include "cdi/v1/spec.pb.h"
#include "fabric_claims.h"
#include "kubelet/kubelet_services.h"
#include "vfio_gpu_agent/common/host_paths.h"
#include "vfio_gpu_agent/dra/driver.h"
#include "vfio_gpu_agent/dra/taints.h"
#include "vfio_gpu_agent/names/resource_names.h"
#include "vfio_gpu_agent/pci/selection.h"
#include "vfio_gpu_agent/vgpu/catalog.h"
#include "vgpu_claims.h"

namespace vfio_agent::dra::internal {

// One prepared device as the checkpoint keeps it and the kubelet gets it back on a repeat.
struct PreparedDevice {
  std::string request;  // base request name (subrequest dropped)
  std::string pool;
  std::string device;
  std::string bdf;        // the GPU, or the SR-IOV vGPU's VF; "" for an mdev
  std::string mdev_uuid;  // an mdev vGPU's UUID; "" otherwise
  std::vector<std::string> cdi_ids;
};

struct PreparedClaim {
  std::string namespace_name;
  std::string name;
  std::string uid;
  std::string boot_id;
  std::filesystem::path cdi_spec;
  std::filesystem::path metadata_dir;
  std::vector<PreparedDevice> devices;
  RecordedDrivers drivers_before_bind;  // --bind-on-prepare: what this claim moved to vfio-pci, and from where
  std::vector<uint32_t> fabric_partitions;  // --fabric-manager: the partitions activated for the claim
  // The pods the claim is reserved for (status.reservedFor UIDs): claims of one pod may share an IOMMU group (one
  // VM opens it), claims of different pods may not (a group has one owner; the second VM would get EBUSY).
  std::vector<std::string> consumers;
  // A Prepare under way: written before sysfs or Fabric Manager is touched, with the driver of every function the
  // bind may move. A checkpoint still pending after a crash is undone at the next start (or by the kubelet's retry):
  // each recorded function back on its driver, the claim's files removed.
  bool pending = false;
  // --binding-conditions: bound (and its partition activated) before the pod was bound, from the claim watch; no CDI
  // spec or metadata yet. Prepare completes it without binding again; a claim deallocated or deleted first is
  // undone from it (Forget), also after a restart.
  bool prebound = false;
};

class ClaimPreparer final : public ClaimHandler {
 public:
  // `fabric` (not owned, may be null): activates a claim's partition in Prepare, releases it when the claim's
  // files are removed. `moves` (not owned, may be null): where every bind and return of a GPU is recorded.
  explicit ClaimPreparer(const DriverOptions& options, FabricClaims* fabric = nullptr, MoveTracker* moves = nullptr);

  // Reads the checkpoint directory: claims of this boot are prepared again (a repeat answers them as before,
  // their devices stay held); a claim from another boot is discarded with its CDI spec and metadata.
  absl::Status Load();

  // Called (under the caller's serialization, as every call here) after a Prepare, Unprepare, PreBind, Forget or
  // Load that changed which whole GPUs claims hold, with the new list: the driver republishes its slices with the
  // group-held taints at once.
  void OnHoldsChanged(std::function<void(const std::vector<GroupHold>&)> changed);
  // Every whole GPU a claim here holds (each claim in prepared_: prepared, pre-bound, or pending until undone),
  // with its IOMMU group as sysfs has it now; vGPUs aside (an SR-IOV vGPU's VF has its own group).
  std::vector<GroupHold> Holds() const;

  // The claims prepared now, and dropping one (its CDI spec, metadata and checkpoint removed) whose ResourceClaim
  // is gone from the API: the stale-claim sweep (Driver) asks the API between the two, without holding the calls.
  std::vector<PreparedClaim> Prepared() const;
  absl::Status Forget(const std::string& uid);

  // --binding-conditions: the work Prepare would do before its files, done for an allocated claim before its pod is
  // bound: the checkpoint's intent first (pending), the claim's devices of this node's pool with their whole IOMMU
  // groups bound to vfio-pci (--bind-on-prepare) and its Fabric Manager partition activated (--fabric-manager),
  // within kBindBudget from `start`, then a checkpoint that says `prebound`. What it did, for the claim's condition
  // message; nothing twice (a claim prepared or pre-bound already is answered at once). On failure everything moved
  // is back on its driver and the error names the holders.
  absl::StatusOr<std::string> PreBind(const kube::ResourceClaim& claim, absl::Time start);
  // The claim is pre-bound here and not prepared by the kubelet yet.
  bool PreBound(const std::string& uid) const;

  drav1::NodePrepareResourcesResponse Prepare(const drav1::NodePrepareResourcesRequest& request,
                                              absl::Time call_start) override;
  drav1::NodeUnprepareResourcesResponse Unprepare(const drav1::NodeUnprepareResourcesRequest& request,
                                                  absl::Time call_start) override;

 private:
  // The claim's devices, or the reason it cannot be prepared (the claim's error for the kubelet).
  // `vgpus`: the node's vGPUs on a vm-vgpu node (the claim's devices are vGPUs), null otherwise.
  // `prebound`: the claim's record from PreBind (its groups bound and partition active already), or null.
  absl::StatusOr<PreparedClaim> PrepareOne(const drav1::Claim& claim, const pci::Inventory& inventory,
                                           const pci::Selection& selection, absl::Time call_start,
                                           const VgpuView* vgpus, const PreparedClaim* prebound);
  // --bind-on-prepare: the allocated devices' groups onto vfio-pci (a device another claim holds is refused
  // before anything is written).
  absl::StatusOr<RecordedDrivers> BindDevices(const std::vector<std::string>& bdfs, const kube::ResourceClaim& claim,
                                              absl::Time call_start) const;
  // `bdf` and its IOMMU group held by no other prepared claim than `claim` (a claim of the same pod may share the
  // group), or the error naming the claim that holds it.
  absl::Status CheckNotHeld(const std::string& bdf, const std::string& device, const kube::ResourceClaim& claim) const;
  // A vGPU device of the claim (vm-vgpu): checked (preparable, held by no other prepared claim), its device nodes
  // under the claim's `backend` added to `spec` and its entry to `prepared`. Never binds anything.
  absl::Status AddVgpu(const kube::AllocationResult& result, const VgpuView& vgpus, pci::VfioBackend backend,
                       const std::string& kind, cdi::v1::Spec& spec, PreparedClaim& prepared) const;
  absl::Status CheckDevice(const std::string& bdf, const std::string& device, const pci::Inventory& inventory,
                           const pci::Selection& selection, const kube::ResourceClaim& claim) const;
  // KubeVirt's device-plugin view of an extended-resource claim: PCI_RESOURCE_<NAME>=<BDFs, sorted, comma-joined>
  // for each model among `devices`, exactly as the device plugin's Allocate sets it.
  void AddExtendedResourceEnv(const std::vector<PreparedDevice>& devices, const pci::Inventory& inventory,
                              const pci::Selection& selection, cdi::v1::ContainerEdits* edits) const;
  std::filesystem::path CheckpointFile(const std::string& uid) const;
  // Removes the claim's CDI spec, metadata and checkpoint file, then releases its Fabric Manager partition.
  absl::Status Remove(const PreparedClaim& claim) const;
  absl::Status WriteCheckpoint(const PreparedClaim& claim) const;
  // A pending checkpoint (a Prepare cut short by a crash) undone: every recorded function that is on a vfio driver
  // now goes back to its driver, then Remove. Its devices stay held until that succeeds.
  absl::Status UndoPending(const PreparedClaim& claim, absl::Time deadline) const;
  // Unprepare's and the sweep's undoing: the functions the claim bound back on their recorded drivers, then Remove.
  absl::Status Release(const PreparedClaim& claim, absl::Time deadline);
  // The claim's records less those of IOMMU groups another prepared claim still uses: those go to that claim (and
  // its checkpoint), so the last claim out of a shared group returns it.
  RecordedDrivers HandOverSharedGroups(const PreparedClaim& claim);

  // OnHoldsChanged's callback when Holds() differs from the list it was last given.
  void PublishHolds();

  const DriverOptions options_;
  FabricClaims* const fabric_;
  MoveTracker* const moves_;
  const names::NameResolver names_;
  const std::filesystem::path plugin_dir_;  // <plugins_dir>/<driver>
  std::optional<BindOnPrepare> bind_;  // with --bind-on-prepare
  std::string boot_id_;
  std::map<std::string, PreparedClaim> prepared_;  // by claim UID
  vgpu::CatalogStore vgpu_catalog_;  // vm-vgpu: names the SR-IOV vGPUs of a full card
  std::function<void(const std::vector<GroupHold>&)> holds_changed_;
  std::vector<GroupHold> holds_published_;
};

drav1::NodePrepareResourceResponse ToResponse(const PreparedClaim& claim);

// Each path as a device node of the claim's CDI spec, read-write (pci::VfioNodes gives a VFIO device's).
void AddCdiNodes(const std::vector<std::string>& paths, cdi::v1::ContainerEdits* edits);

}  // namespace vfio_agent::dra::internal
