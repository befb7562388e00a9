// The device model of a vm-vgpu node (--workload vm-vgpu): one resource per vGPU type, from the vGPU discovery
// instead of the vfio-bound GPUs. Nothing is bound or unbound on such a node: the vGPU manager is `nvidia`.
//
//   mdev:   id = the mdev UUID; env MDEV_PCI_RESOURCE_<NAME> = UUIDs; nodes /dev/vfio/vfio + the mdev's group.
//   SR-IOV: id = the VF BDF; env PCI_RESOURCE_<NAME> = VF BDFs; nodes as a GPU's (group, or cdev + /dev/iommu
//           on an iommufd host); NUMA node of the PF.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "vfio_gpu_agent/common/host_paths.h"
#include "vfio_gpu_agent/pci/inventory.h"
#include "vfio_gpu_agent/node/snapshot.h"
#include "vfio_gpu_agent/plugin/devices.h"
#include "vfio_gpu_agent/vgpu/discovery.h"
#include "vfio_gpu_agent/vgpu/health.h"

namespace vfio_agent::plugin {

struct VgpuSnapshot {
  DeviceSnapshot snapshot;
  // Why a vGPU is not advertised (or the node not served), one line each naming the device: unreadable devices,
  // SR-IOV types whose name is unknown, type names that give no valid resource name, both frameworks on one
  // node. The caller logs them (and reports them as events).
  std::vector<std::string> problems;
};

// Healthy: mdev: its parent still has a driver, its group node exists; SR-IOV: its group node (or, with
// iommufd, its cdevs) exists. A vGPU of `previous` that is no longer found stays listed, Unhealthy with the
// reason (mdev removed; VF off `nvidia`, type back to 0, retyped, gone; both frameworks), until its resource
// advertises a vGPU `previous` did not have (the vGPUs were recreated) or the agent restarts. On a node with
// both frameworks nothing new is advertised.
// The vGPUs of `node` (node::Build with a discovery), with those of `previous` that are gone kept as above; `gone`
// answers for the scan `node` was built from.
VgpuSnapshot VgpusOf(const node::Snapshot& node, const vgpu::GoneReasons& gone, const DeviceSnapshot& previous);
VgpuSnapshot BuildVgpuSnapshot(const HostPaths& paths, const pci::Inventory& inventory,
                               const vgpu::Discovery& discovery, std::string_view domain,
                               const DeviceSnapshot& previous);

}  // namespace vfio_agent::plugin
