// DRA device names (ResourceSlice devices[].name, allocation results' device): one per GPU, derived from its PCI
// address and nothing else, so a name never depends on scan order, on which GPUs are bound, or on a reboot, and a
// claim's device maps back to its BDF without any table. A DRA device name is a DNS label (lower-case
// alphanumerics and '-', at most 63), so the BDF's ':' and '.' become '-':
//   0000:3b:00.0 <-> gpu-0000-3b-00-0
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace vfio_agent::dra {

// `bdf` canonical ("dddd:bb:dd.f", lower-case).
std::string DeviceName(std::string_view bdf);

// The BDF a device name stands for; InvalidArgument (naming it) when it is not of the form DeviceName makes.
absl::StatusOr<std::string> BdfOfDevice(std::string_view device_name);

// On a vm-vgpu node the devices are the vGPUs, named from what identifies them to KubeVirt: an mdev by its UUID
// (lower-case, as the kernel prints it), an SR-IOV vGPU by its VF's address; never by type, index or scan order:
//   mdev 4b3e2c1a-0000-4000-8000-00000000000a <-> mdev-4b3e2c1a-0000-4000-8000-00000000000a
//   VF 0000:3b:00.4 <-> vgpu-0000-3b-00-4
std::string MdevDeviceName(std::string_view uuid);
std::string VfDeviceName(std::string_view bdf);

struct VgpuId {
  bool mdev = false;  // id is an mdev UUID; else an SR-IOV vGPU's VF BDF
  std::string id;
};
// InvalidArgument (naming it) when the name is not of the form MdevDeviceName or VfDeviceName makes.
absl::StatusOr<VgpuId> VgpuOfDevice(std::string_view device_name);

}  // namespace vfio_agent::dra
