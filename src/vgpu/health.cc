#include "vfio_gpu_agent/vgpu/health.h"

#include "absl/strings/str_cat.h"
#include "vfio_gpu_agent/pci/vfio_health.h"

namespace vfio_agent::vgpu {
namespace {

std::string GroupReason(const HostPaths& paths, const std::optional<int>& group, const std::vector<std::string>& cdevs,
                        bool iommufd) {
  if (!group) return "no IOMMU group";
  return pci::MissingVfioNode(paths, *group, cdevs, iommufd);
}

}  // namespace

std::string MdevUnhealthyReason(const HostPaths& paths, const Mdev& mdev, const pci::Function* parent) {
  if (parent == nullptr) return absl::StrCat("parent ", mdev.parent_bdf, " gone from sysfs");
  if (parent->driver.empty()) return absl::StrCat("parent ", mdev.parent_bdf, " lost its driver");
  return GroupReason(paths, mdev.iommu_group, {}, /*iommufd=*/false);
}

std::string VfUnhealthyReason(const HostPaths& paths, const pci::Function& vf, bool iommufd) {
  return GroupReason(paths, vf.iommu_group, vf.vfio_cdevs, iommufd);
}

GoneReasons::GoneReasons(const std::filesystem::path& sysfs_root, const pci::Inventory& inventory,
                         const Discovery& discovery)
    : sysfs_root_(sysfs_root), inventory_(inventory), discovery_(discovery) {
  for (const DeviceError& error : discovery.errors) errors_.emplace(error.device, &error);
}

std::optional<std::string> GoneReasons::Common(const std::string& id) const {
  if (!discovery_.framework.ok()) return std::string(discovery_.framework.status().message());
  if (auto error = errors_.find(id); error != errors_.end()) {
    return absl::StrCat("unreadable: ", error->second->status.message());
  }
  return std::nullopt;
}

std::string GoneReasons::OfMdev(const std::string& uuid) const {
  if (std::optional<std::string> reason = Common(uuid)) return *reason;
  for (const Mdev& mdev : discovery_.mdevs) {
    if (mdev.uuid == uuid) return absl::StrCat("now of type ", mdev.type_name);
  }
  return absl::StrCat("mdev removed (no ", (sysfs_root_ / "bus/mdev/devices" / uuid).string(), ")");
}

std::string GoneReasons::OfVf(const std::string& bdf) const {
  if (std::optional<std::string> reason = Common(bdf)) return *reason;
  const pci::Function* fn = inventory_.Find(bdf);
  if (fn == nullptr) return "gone from sysfs";
  if (fn->driver != kNvidiaDriver) return fn->driver.empty() ? "no driver" : absl::StrCat("driver ", fn->driver);
  for (const SriovVgpu& vgpu : discovery_.vgpus) {
    if (vgpu.bdf == bdf) return absl::StrCat("retyped to ", vgpu.type_name, " (type ", vgpu.type_id, ")");
  }
  for (const UnresolvedVgpu& vgpu : discovery_.unresolved) {
    if (vgpu.bdf == bdf) return absl::StrCat("retyped to vGPU type ", vgpu.type_id, ", whose name is unknown");
  }
  return "nvidia/current_vgpu_type is 0 (vGPU deleted)";
}

}  // namespace vfio_agent::vgpu
