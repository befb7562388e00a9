// Applies a vGPU profile config (config.h) to the host through sysfs, for both frameworks: what
// vgpu-device-manager does for mdev, and what nothing operator-grade does for SR-IOV vGPUs.
//
//   mdev:   create = a fresh UUID written to <parent>/mdev_supported_types/<type id>/create (the parent is the GPU
//           on Turing and older, one of its VFs on Ampere); remove = "1" written to bus/mdev/devices/<uuid>/remove.
//   SR-IOV: create = the type id written to a free VF's nvidia/current_vgpu_type (the id from the card's catalog,
//           catalog.h); remove = "0" written there.
//   Both:   a GPU with SR-IOV disabled gets every VF it can have (sriov_numvfs = sriov_totalvfs, as
//           `sriov-manage -e` does) when the config asks for vGPUs on it and it is no mdev parent itself.
//
// Reconcile, not rebuild: each pass reads the host, plans each GPU with PlanGpu and writes only the difference,
// so a second pass over a converged host writes nothing, and a pass cut short (an agent restart) is finished
// by the next. A vGPU a running VM holds (its /dev/vfio/<group> open), or that a prepared DRA claim holds before its
// VM opened it (ApplyOptions::claimed), is never removed or retyped: its GPU is reported pending with the holder,
// and the change is made by the first pass after it is freed.
//
// All or nothing per GPU: the change is checked against what the card can hold (the types' max_instance and
// available_instances, the VFs free for it, the vGPUs kept and held) before anything is written, and a GPU whose
// config cannot fit is left as it was (kDoesNotFit, naming the card, the type, the count wanted and the count
// possible). A create that still fails (another writer took the room, a driver rule the check does not know) undoes
// what the pass wrote on that GPU: the vGPUs it created are removed and the ones it removed made again (an mdev
// under its own UUID on its own parent, a VF with its own type).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "vfio_gpu_agent/common/host_paths.h"
#include "vfio_gpu_agent/pci/inventory.h"
#include "vfio_gpu_agent/vgpu/catalog.h"
#include "vfio_gpu_agent/vgpu/config.h"

namespace vfio_agent::vgpu {

// The GPUs a config's `devices` indices count: NVIDIA display and 3D controllers that are physical functions,
// in PCI address order.
std::vector<ConfigGpu> ConfigGpus(const pci::Inventory& inventory);

enum class GpuOutcome {
  kApplied,      // the GPU holds what the config asks (changed now or already)
  kPendingHeld,  // a vGPU the config wants gone is held by a running VM; the rest is done or waits for it
  kFailed,       // a write or a lookup failed (`error` says which, on which path); what the pass wrote is undone
  kDoesNotFit,   // the config asks more than the card holds: nothing written (`error` names card, type, counts)
};
const char* GpuOutcomeName(GpuOutcome outcome);  // "applied", "pending-held", "failed", "does-not-fit"

struct GpuApplyResult {
  std::string bdf;  // the GPU (physical function)
  GpuOutcome outcome = GpuOutcome::kApplied;
  std::vector<std::string> created;  // mdev UUIDs or VF BDFs
  std::vector<std::string> removed;
  std::vector<std::string> held;     // "<id> (<type>): <holder>; ..." for each vGPU kept for a running VM
  absl::Status error;                // kFailed: names the GPU, the device and the path, with the kernel's errno
  bool undone = false;               // kFailed after writes that were undone: the GPU is as the pass found it
};

struct ApplyReport {
  std::vector<GpuApplyResult> gpus;  // the GPUs the config covers, by BDF
  bool changed() const;              // anything created, removed, undone or enabled
  bool enabled_vfs = false;          // sriov_numvfs was written on some GPU
  // "failed" if a GPU failed or does not fit, else "pending" if one waits for a VM, else "success": the values of
  // the node label nvidia.com/vgpu.config.state.
  std::string State() const;
  // Whether a later pass may succeed with the same config on the same cards (a VM may end, a write may go
  // through): pending or failed. A config that does not fit does not, until the config or the cards change.
  bool RetryLater() const;
};

struct ApplyOptions {
  HostPaths paths;
  // The SR-IOV type catalogs (shared through their file with the plugin's discovery). Required.
  CatalogStore* catalog = nullptr;
  // A fresh mdev UUID per call; empty: a random version-4 UUID.
  std::function<std::string()> new_uuid;
  // vGPUs held although no process has their group open: mdev UUID or VF BDF -> who holds it ("DRA claim
  // ns/name (uid)"). The daemon fills it from the DRA driver's checkpoint (this module never reads the driver's
  // files: vgpu is below dra).
  std::map<std::string, std::string> claimed;
};

// One reconcile pass of config `config_name` of `file`. Errors that concern the whole node (sysfs unreadable, an
// unknown config name, two entries for one GPU, both vGPU frameworks wanted or present) are the status; a GPU's
// own failure is its result, and the other GPUs are still applied.
absl::StatusOr<ApplyReport> ApplyVgpuConfig(const ApplyOptions& options, const VgpuConfigFile& file,
                                            std::string_view config_name);

}  // namespace vfio_agent::vgpu
