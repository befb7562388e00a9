// Whether a vGPU can be handed to a VM now, and why one found before is not found any more: the rule both kubelet
// frontends (the device plugin's vGPU resources and the DRA driver's vGPU devices) apply, read from sysfs and the
// dev root only.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "vfio_gpu_agent/common/host_paths.h"
#include "vfio_gpu_agent/pci/inventory.h"
#include "vfio_gpu_agent/vgpu/discovery.h"

namespace vfio_agent::vgpu {

// "" when healthy: the parent (`parent`, null when gone from sysfs) still has a driver and the mdev's group node
// exists. Else "parent 0000:3b:00.0 lost its driver", "no /dev/vfio/140", ...
std::string MdevUnhealthyReason(const HostPaths& paths, const Mdev& mdev, const pci::Function* parent);

// "" when the VF's group node (or, with iommufd, its cdevs) exists; else "no IOMMU group" or "no <node>".
std::string VfUnhealthyReason(const HostPaths& paths, const pci::Function& vf, bool iommufd);

// Why a vGPU advertised before (an mdev UUID or an SR-IOV vGPU's VF BDF) is not found in `discovery` now.
class GoneReasons {
 public:
  // All three must outlive this object.
  GoneReasons(const std::filesystem::path& sysfs_root, const pci::Inventory& inventory, const Discovery& discovery);

  // "mdev removed (no <sysfs>/bus/mdev/devices/<uuid>)", "now of type GRID T4-2Q", "unreadable: ...", or the
  // reason the node serves no vGPU (both frameworks).
  std::string OfMdev(const std::string& uuid) const;
  // "gone from sysfs", "driver vfio-pci", "retyped to ...", "nvidia/current_vgpu_type is 0 (vGPU deleted)", ...
  std::string OfVf(const std::string& bdf) const;

 private:
  std::optional<std::string> Common(const std::string& id) const;

  const std::filesystem::path& sysfs_root_;
  const pci::Inventory& inventory_;
  const Discovery& discovery_;
  std::map<std::string, const DeviceError*> errors_;
};

}  // namespace vfio_agent::vgpu
