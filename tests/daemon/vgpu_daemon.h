// The in-process `run --workload vm-vgpu` of the vGPU daemon tests: no udev, no listeners, a quick pass while not
// ready, the catalog in <state_dir>.
#pragma once

#include <chrono>
#include <filesystem>

#include "kubelet_sim.h"
#include "vfio_gpu_agent/daemon/daemon.h"

namespace vfio_agent::daemon::testing {

inline DaemonOptions VgpuDaemonOptions(const std::filesystem::path& sysfs_root, const std::filesystem::path& dev_root,
                                       const kubeletsim::Options& kubelet, const std::filesystem::path& state_dir) {
  DaemonOptions options;
  options.serve.paths.sysfs_root = sysfs_root;
  options.serve.paths.dev_root = dev_root;
  options.serve.paths.kubelet_dir = kubelet.dir;
  options.serve.paths.pod_resources_socket = kubelet.pod_resources_socket;
  options.serve.udev = false;
  options.serve.workload = Workload::kVmVgpu;
  options.serve.vgpu_catalog_file = state_dir / "vgpu-catalog.txt";
  options.bind.paths = options.serve.paths;
  options.bind.targets = binding::Targets::EverySelected();
  options.health_port = 0;
  options.metrics_port = 0;
  options.not_ready_interval = std::chrono::milliseconds(50);
  return options;
}

}  // namespace vfio_agent::daemon::testing
