// The DRA driver's device model on a vm-vgpu node: one device per vGPU the vGPU discovery finds, instead of one per
// vfio-bound GPU. Nothing is bound or unbound on such a node (the vGPU manager is `nvidia`).
//   mdev:   name mdev-<uuid>; bare `mdevUUID` (what KubeVirt reads), the parent's address, pcieRoot and NUMA node.
//   SR-IOV: name vgpu-<VF address>; resource.kubernetes.io/pciBusID of the VF, pcieRoot, the PF's NUMA node.
// Both: resourceName (the device plugin's vGPU resource name part, "GRID_T4-1Q"), vgpuType, the card's
// productName, iommuGroup; health and the NoSchedule taint by the device plugin's vGPU rule (vgpu/health.h).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "vfio_gpu_agent/common/host_paths.h"
#include "vfio_gpu_agent/dra/devices.h"
#include "vfio_gpu_agent/names/resource_names.h"
#include "vfio_gpu_agent/pci/inventory.h"
#include "vfio_gpu_agent/vgpu/discovery.h"
#include "vfio_gpu_agent/vgpu/health.h"

namespace vfio_agent::dra {

struct VgpuDevice {
  bool mdev = false;
  std::string id;             // the mdev UUID, or the SR-IOV vGPU's VF BDF
  std::string resource_name;  // "nvidia.com/GRID_T4-1Q": the extended resource a DeviceClass maps it to
  std::optional<int> iommu_group;
  std::vector<std::string> vfio_cdevs;  // the VF's iommufd cdevs ("vfio3"); none for an mdev
  // name, health, slice; bdf is the VF, or the mdev's parent.
  GpuDevice device;
};

struct VgpuDevices {
  std::vector<VgpuDevice> vgpus;  // by device name
  // Why a vGPU is not published, one line each naming the device (vgpu::ServedVgpus::problems). The driver logs
  // each once while it lasts.
  std::vector<std::string> problems;
};

// One device per vGPU of `discovery` (made from `inventory`, a scan with details of vendor 10de). A vGPU of
// `previous` that is gone stays, unhealthy with the reason (mdev removed, VF retyped, ...) and its last attributes,
// until its resource publishes a vGPU `previous` did not have (the vGPUs were recreated) or the agent restarts,
// as the device plugin keeps them. `pci_ids` may be null (no productName).
// The vGPUs of `node` (node::Build with a discovery), with those of `previous` that are gone kept as above; `gone`
// answers for the scan `node` was built from.
VgpuDevices VgpusOf(const node::Snapshot& node, const vgpu::GoneReasons& gone, const names::PciIdsDatabase* pci_ids,
                    std::string_view domain, std::string_view driver, const std::vector<GpuDevice>& previous);
VgpuDevices BuildVgpuDevices(const HostPaths& paths, const pci::Inventory& inventory, const vgpu::Discovery& discovery,
                             const names::PciIdsDatabase* pci_ids, std::string_view domain, std::string_view driver,
                             const std::vector<GpuDevice>& previous);

}  // namespace vfio_agent::dra
