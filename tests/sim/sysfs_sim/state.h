// What the simulated kernel knows at one instant: devices with their binding, the loaded drivers, and the
// faults in force. The sysfs tree and the dev tree are pure functions of it.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "node_spec.h"

namespace vfio_agent::sim {

struct DeviceState {
  DeviceSpec spec;
  bool present = true;
  std::string driver;                          // "" when unbound
  std::optional<std::string> driver_override;  // nullopt reads "(null)"
  bool dead = false;
  int unbind_delay_ms = 0;
  int bind_errno = 0;
  std::string power_state;  // "D0", "D3hot", "D3cold"
  int vfio_index = -1;    // vfio-dev/vfioN and /dev/vfio/devices/vfioN while on a vfio driver
  int nvidia_index = -1;  // /dev/nvidiaN (GPUs) or /dev/nvidia-nvswitchN while on nvidia
  uint64_t releases = 0;  // bumped by `release <BDF>`; a blocked unbind waits for it to change
  bool created_vf = false;  // a VF made by sriov_numvfs: gone for good when disabled, never back by rescan
  int vgpu_type = 0;        // SR-IOV vGPU: nvidia/current_vgpu_type of a VF (0 = none)
};

// A mediated device (a vGPU of the mdev framework) on its parent function.
struct MdevState {
  std::string uuid;  // lower case, as the kernel names the device (%pUl)
  std::string parent;
  std::string type_id;
  int iommu_group = -1;  // its own group, allocated when created
};

struct KernelState {
  bool iommu = false;
  PlatformSpec platform;
  std::vector<std::string> drivers;
  std::map<std::string, std::set<std::pair<uint16_t, uint16_t>>> dynamic_ids;  // driver -> new_id entries
  // Parents before children. A deque: a blocked unbind keeps a pointer to its device while VFs are added.
  std::deque<DeviceState> devices;
  std::vector<MdevState> mdevs;
  int first_dynamic_group = 0;  // groups of new VFs and mdevs start here (above every group of the node file)

  DeviceState* Find(absl::string_view bdf);
  const DeviceState* Find(absl::string_view bdf) const;
  DeviceState* FindPresent(absl::string_view bdf);
  bool HasDriver(absl::string_view name) const;
};

// vfio-pci and the vfio variant drivers (nvgrace-gpu-vfio-pci, ...): they need an IOMMU group and create
// /dev/vfio/<group>.
bool IsVfioDriver(absl::string_view driver);
bool IsNvSwitch(const DeviceSpec& spec);
// The vfio module is loaded: a vfio driver is, or a vGPU manager (its vfio devices need it).
bool VfioModuleLoaded(const KernelState& state);

}  // namespace vfio_agent::sim
