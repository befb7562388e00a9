// Prepare on a vm-vgpu node: what a claim's vGPU devices are now (one scan and vGPU discovery per Prepare call),
// which device nodes a VM given one opens, and the extended-resource env the device plugin's vGPU Allocate sets.
// Nothing is bound or unbound: the vGPU manager is `nvidia`.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cdi/v1/spec.pb.h"
#include "vfio_gpu_agent/common/host_paths.h"
#include "vfio_gpu_agent/dra/vgpu_devices.h"
#include "vfio_gpu_agent/pci/inventory.h"
#include "vfio_gpu_agent/pci/vfio_backend.h"
#include "vfio_gpu_agent/vgpu/catalog.h"

namespace vfio_agent::dra::internal {

class VgpuView {
 public:
  // Discovers the vGPUs of `inventory` (a scan of paths.sysfs_root with details of vendor 10de).
  static absl::StatusOr<VgpuView> Discover(const HostPaths& paths, const pci::Inventory& inventory,
                                           vgpu::CatalogStore& catalog, std::string_view domain,
                                           std::string_view driver);

  // The vGPU `device_name` names, if a VM can be given it now (found, healthy); else the reason.
  absl::StatusOr<const VgpuDevice*> Preparable(const std::string& device_name) const;

  // What a VM given `vgpu` opens under the claim's `backend` (its DeviceClass), never the nodes of both: an mdev
  // always /dev/vfio/vfio and its own group node (KubeVirt's mdev path has no iommufd, an mdev no cdev); an SR-IOV
  // vGPU (a VF) the backend's nodes. FailedPrecondition naming the vGPU when the backend has none for it.
  absl::Status AddDeviceNodes(const VgpuDevice& vgpu, pci::VfioBackend backend, std::string_view what,
                              cdi::v1::ContainerEdits* edits) const;

  // KubeVirt's device-plugin view of an extended-resource claim, as the device plugin's vGPU Allocate sets it:
  // MDEV_PCI_RESOURCE_<NAME>=<mdev UUIDs> or PCI_RESOURCE_<NAME>=<VF BDFs>, sorted and comma-joined, once per
  // resource among `device_names`.
  void AddExtendedResourceEnv(const std::vector<std::string>& device_names, cdi::v1::ContainerEdits* edits) const;

 private:
  const VgpuDevice* Find(const std::string& device_name) const;

  std::vector<VgpuDevice> vgpus_;
  bool iommufd_ = false;
};

}  // namespace vfio_agent::dra::internal
