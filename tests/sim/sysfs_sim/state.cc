#include "state.h"

#include <algorithm>

namespace vfio_agent::sim {

DeviceState* KernelState::Find(absl::string_view bdf) {
  auto it = std::find_if(devices.begin(), devices.end(), [&](const DeviceState& d) { return d.spec.bdf == bdf; });
  return it == devices.end() ? nullptr : &*it;
}

const DeviceState* KernelState::Find(absl::string_view bdf) const {
  return const_cast<KernelState*>(this)->Find(bdf);
}

DeviceState* KernelState::FindPresent(absl::string_view bdf) {
  DeviceState* dev = Find(bdf);
  return dev && dev->present ? dev : nullptr;
}

bool KernelState::HasDriver(absl::string_view name) const {
  return std::find(drivers.begin(), drivers.end(), name) != drivers.end();
}

bool IsVfioDriver(absl::string_view driver) { return driver.find("vfio") != absl::string_view::npos; }

bool VfioModuleLoaded(const KernelState& state) {
  return std::any_of(state.drivers.begin(), state.drivers.end(), [](const std::string& d) { return IsVfioDriver(d); }) ||
         std::any_of(state.devices.begin(), state.devices.end(),
                     [](const DeviceState& d) { return d.spec.vgpu.framework != VgpuFramework::kNone; });
}

bool IsNvSwitch(const DeviceSpec& spec) { return spec.vendor == 0x10de && (spec.class_code >> 8) == 0x0680; }

}  // namespace vfio_agent::sim
