// Device taints from health (KEP-5055; GA in Kubernetes 1.37, beta and on by default in 1.36): one key per failure
// kind under the driver's name, with a value that says which (a driver, a group, "off-bus"), as NVIDIA's driver does
// (gpu.nvidia.com/xid=<n>). A device that cannot serve a new VM gets NoSchedule; a warning that does not stop it gets
// None (accepted since 1.35, KEP-5055's implementation history). NoExecute, which evicts running VMs, only when the
// operator asks (--dra-taint-no-execute) and only for kinds that mean the device is gone.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "vfio_gpu_agent/common/host_paths.h"
#include "vfio_gpu_agent/dra/devices.h"
#include "vfio_gpu_agent/kube/resource_slices.h"

namespace vfio_agent::dra {

// Failure kinds (NoSchedule), the key's part after "<driver>/".
inline constexpr std::string_view kTaintNotVfio = "not-vfio";                // value: its driver, "none", "no-node"
inline constexpr std::string_view kTaintGroupNotViable = "group-not-viable"; // value: the group, or "none"
inline constexpr std::string_view kTaintGone = "gone";                       // value: "sysfs" (NoExecute if asked)
inline constexpr std::string_view kTaintFabric = "fabric-unvouched";         // value: "fm-unusable", "no-partition"
inline constexpr std::string_view kTaintConfigSpace = "config-space";        // value: "off-bus" (NoExecute if asked), "unreadable"
// Any other reason (vGPU: retyped, mdev removed, ...), the key this driver used for every failure before.
inline constexpr std::string_view kTaintOther = kUnhealthyTaint;
// Warnings (None): what `validate` warns about on a device that still serves a VM.
inline constexpr std::string_view kTaintNoReset = "no-reset-method";  // value: "none"
// Reserved, not failed (NoSchedule, never in the health stream): a GPU whose IOMMU group holds a GPU another claim
// has, so allocating it to a new claim would split the group between two VMs. Value: the group.
inline constexpr std::string_view kTaintGroupHeld = "group-held";

struct TaintPolicy {
  // Opt-in: the kinds that mean the device is gone evict the VMs that hold it (they are dead anyway).
  bool no_execute_when_gone = false;
};

// The blocking taint an unhealthy reason (GpuDevice::unhealthy_reason, as pci/vfio_health, the bind-on-prepare
// rule, the fabric and the vGPU builders word it) makes.
kube::DeviceTaint FailureTaint(std::string_view driver, std::string_view reason, const TaintPolicy& policy = {});
// Every key FailureTaint can give (for validate, which reads the published slices).
std::vector<std::string> FailureTaintKeys(std::string_view driver);
// The None-effect warnings of a whole GPU at `bdf` (sysfs only: no config read that would wake a D3cold GPU).
std::vector<kube::DeviceTaint> WarningTaints(const HostPaths& paths, const std::string& bdf, std::string_view driver);
// Replaces each device's taints with its failure taint (when unhealthy) and, for a whole GPU still in sysfs, its
// warnings. D3cold is not one: vfio-pci parks every idle GPU there, so it would flap with use.
void ApplyHealthTaints(std::vector<GpuDevice>* devices, std::string_view driver, const HostPaths& paths,
                       const TaintPolicy& policy, bool whole_gpus);
// A whole GPU a claim on this node holds: prepared, or bound ahead of Prepare by the binding worker, or a Prepare
// cut short whose record is not undone yet (its devices stay held until then).
struct GroupHold {
  std::string bdf;
  int group = 0;                       // its IOMMU group
  std::string claim;                   // "claim <namespace>/<name> (<uid>)", for the log
  std::vector<std::string> consumers;  // the pods the claim is reserved for (status.reservedFor UIDs)
  bool operator==(const GroupHold&) const = default;
};

// A device ApplyGroupHeldTaints tainted.
struct HeldSibling {
  std::string bdf;
  int group = 0;
  std::string claim;  // the claim holding the group's other GPU
  bool operator==(const HeldSibling&) const = default;
};
// Adds `<driver>/group-held=<group>` (NoSchedule) to each device whose IOMMU group (its iommuGroup attribute) holds
// a GPU of `holds`, unless the device itself is held by that claim or by a claim of the same pod. A group is handed
// to one VM whole (a second open of /dev/vfio/<group> fails EBUSY), so the scheduler must not give the rest of it
// to another claim; NoSchedule leaves allocations made already alone. Returns the devices it tainted, by name.
std::map<std::string, HeldSibling> ApplyGroupHeldTaints(std::vector<kube::SliceDevice>* devices,
                                                        const std::vector<GroupHold>& holds, std::string_view driver);
// "key=value" of each None taint, for the health stream's message of a healthy device.
std::string WarningText(const GpuDevice& device);

}  // namespace vfio_agent::dra
