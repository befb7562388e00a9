// What the simulated kernel knows at one instant: devices with their binding, the loaded drivers, and the
// faults in force. The sysfs tree and the dev tree are pure functions of it.
#pragma once

#include <cstdint>
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
};

struct KernelState {
  bool iommu = false;
  PlatformSpec platform;
  std::vector<std::string> drivers;
  std::map<std::string, std::set<std::pair<uint16_t, uint16_t>>> dynamic_ids;  // driver -> new_id entries
  std::vector<DeviceState> devices;  // parents before children

  DeviceState* Find(absl::string_view bdf);
  const DeviceState* Find(absl::string_view bdf) const;
  DeviceState* FindPresent(absl::string_view bdf);
  bool HasDriver(absl::string_view name) const;
};

// vfio-pci and the vfio variant drivers (nvgrace-gpu-vfio-pci, ...): they need an IOMMU group and create
// /dev/vfio/<group>.
bool IsVfioDriver(absl::string_view driver);
bool IsNvSwitch(const DeviceSpec& spec);

}  // namespace vfio_agent::sim
