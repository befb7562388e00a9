// The simulated /dev: a real directory (so inotify behaves as on devtmpfs) holding empty regular files where
// the kernel would create character devices.
#pragma once

#include <filesystem>

#include "absl/status/status.h"
#include "state.h"

namespace vfio_agent::sim {

// Makes dev_root match `state`: vfio/vfio (a vfio driver loaded), vfio/<group> while a member is on a vfio driver,
// vfio/devices/vfioN per function on a vfio driver, nvidiactl + nvidiaN / nvidia-nvswitchN while on nvidia,
// iommu on an iommufd host. Character devices (1:3, see dev_tree.cc). Only those names are managed; anything
// else under dev_root is left alone.
absl::Status SyncDevTree(const KernelState& state, const std::filesystem::path& dev_root);

// The procfs files the validator reads, as plain files: cmdline and cpuinfo (two CPUs with "address sizes").
absl::Status WriteProcFiles(const PlatformSpec& platform, const std::filesystem::path& proc_root);

}  // namespace vfio_agent::sim
