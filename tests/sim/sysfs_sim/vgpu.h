// NVIDIA vGPU on the simulated node: which functions are vGPU parents, and how much of a card is left.
// A card is a PF with a `vgpu` catalog; its VFs share its capacity. Each instance of a type uses
// 1/max_instances of the card, and with one_type_at_a_time a card with instances of one type offers no other.
#pragma once

#include <string>
#include <vector>

#include "state.h"

namespace vfio_agent::sim {

// The driver that owns mdevs (NVIDIA's vendor module registers its mdev_driver under this name).
inline constexpr const char* kMdevDriver = "nvidia-vgpu-vfio";

// The PF whose catalog applies to `dev` (itself or its physfn); nullptr when neither carries one.
const DeviceState* CardOf(const KernelState& state, const DeviceState& dev);

// `dev` is registered on the mdev bus: bound to nvidia and the parent its card's framework names.
bool IsMdevParent(const KernelState& state, const DeviceState& dev);
// `dev` has the nvidia/ vGPU attributes of the SR-IOV framework (bound to nvidia, card framework sriov).
bool HasSriovVgpuFiles(const KernelState& state, const DeviceState& dev);

// available_instances of `type` on the mdev parent `parent`.
int AvailableInstances(const KernelState& state, const DeviceState& parent, const VgpuTypeSpec& type);
// The types `dev` (PF or VF of an sriov card) could take now; empty for a VF that already has a type.
std::vector<const VgpuTypeSpec*> CreatableTypes(const KernelState& state, const DeviceState& dev);
// nvidia/creatable_vgpu_types: the header, then "<id padded to 6> : <name>" per creatable type.
std::string CreatableVgpuTypesText(const std::vector<const VgpuTypeSpec*>& types);

// A fresh IOMMU group number: the lowest one at or above first_dynamic_group that no device or mdev
// uses (iommu_group_alloc() takes the lowest free id; the node file's numbers stand for a full host).
int AllocateIommuGroup(const KernelState& state);

// guid_parse(): 36 characters, dashes at 8, 13, 18, 23, hex elsewhere. Returns the lower-case form or "".
std::string ParseUuid(const std::string& text);

}  // namespace vfio_agent::sim
