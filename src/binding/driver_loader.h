// Makes a vfio driver available: finds its directory under <sysfs>/bus/pci/drivers ('-' or '_' spelling)
// and, when absent, loads its module with libkmod (no host modprobe needed).
#pragma once

#include <filesystem>
#include <string>

#include "absl/status/statusor.h"
#include "vfio_gpu_agent/common/host_paths.h"

namespace vfio_agent::binding {

// Driver directory name registered for `module`, or NotFound.
absl::StatusOr<std::string> FindRegisteredDriver(const HostPaths& paths, const std::string& module);

// FindRegisteredDriver, loading `module` from <modules_root>/<kernel_release> first when needed. Modules
// are only loaded when sysfs_root is the running kernel's /sys: a module loaded into this kernel cannot
// register a driver in a simulated or copied tree. Errors say what to do on hosts that cannot load modules.
// Inserts `module` and its dependencies from `modules_dir` (<modules_root>/<release>) into the running kernel
// with libkmod, honouring the host's blacklist. NotFound when the module is not in that tree.
absl::Status LoadModule(const std::filesystem::path& modules_dir, const std::string& module);

absl::StatusOr<std::string> EnsureDriverRegistered(const HostPaths& paths, const std::string& kernel_release,
                                                   const std::string& module);

}  // namespace vfio_agent::binding
