// The simulated /dev: a real directory (so inotify behaves as on devtmpfs) holding empty regular files where
// the kernel would create character devices.
#pragma once

#include <filesystem>

#include "absl/status/status.h"
#include "state.h"

namespace vfio_agent::sim {

// Makes dev_root match `state`: vfio/vfio (IOMMU on), vfio/<group> while a member is on a vfio driver,
// vfio/devices/vfioN per function on a vfio driver, nvidiactl + nvidiaN / nvidia-nvswitchN while on nvidia.
// Only those names are managed; anything else under dev_root is left alone.
absl::Status SyncDevTree(const KernelState& state, const std::filesystem::path& dev_root);

}  // namespace vfio_agent::sim
