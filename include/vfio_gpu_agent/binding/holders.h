// Who keeps a device busy: processes with a device node open (found through <proc>/<pid>/fd links),
// kernel modules with references, and the NVIDIA daemons known to pin GPUs.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "vfio_gpu_agent/common/host_paths.h"

namespace vfio_agent::binding {

struct Holder {
  int pid = 0;       // 0 for a kernel module reference
  std::string comm;  // process name, or the module name
  std::string what;  // "/dev/nvidia0 open", "refcnt 3 (used by nvidia_uvm)", "known GPU daemon"
  std::string ToString() const;  // "pid 4242 (nvidia-smi): /dev/nvidia0 open"
};

// Processes holding open a file whose path (as <proc>/<pid>/fd/<n> names it) satisfies `match`.
// Unreadable processes are skipped: the scan runs unprivileged in tests and races with exits.
std::vector<Holder> FindOpeners(const std::filesystem::path& proc_root,
                                const std::function<bool(const std::string& path)>& match);

// What may keep the nvidia driver from releasing a GPU: openers of <dev_root>/nvidia*, references on
// <sysfs_root>/module/nvidia*, and running nvidia-persistenced / nv-fabricmanager / nv-hostengine / dcgm*.
std::vector<Holder> NvidiaHolders(const HostPaths& paths);

// Processes with <dev_root>/vfio/<group> open (a running VM).
std::vector<Holder> VfioGroupOpeners(const HostPaths& paths, int group);
// The same for every group at once, by group: one walk of <proc> for many vGPUs.
std::map<int, std::vector<Holder>> VfioGroupOpenersByGroup(const HostPaths& paths);

}  // namespace vfio_agent::binding
