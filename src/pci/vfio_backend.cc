#include "vfio_gpu_agent/pci/vfio_backend.h"

#include "absl/strings/str_cat.h"

namespace vfio_agent::pci {

std::string_view VfioBackendName(VfioBackend backend) {
  return backend == VfioBackend::kIommufd ? "iommufd" : "legacy";
}

std::optional<VfioBackend> ParseVfioBackend(std::string_view name) {
  if (name == "legacy") return VfioBackend::kLegacy;
  if (name == "iommufd") return VfioBackend::kIommufd;
  return std::nullopt;
}

std::string_view VfioNodeSetName(VfioNodeSet set) {
  switch (set) {
    case VfioNodeSet::kLegacy: return "legacy";
    case VfioNodeSet::kLegacyAndCdevs: return "legacy+cdevs";
    case VfioNodeSet::kIommufd: return "iommufd";
  }
  return "legacy";
}

absl::StatusOr<std::vector<std::string>> VfioNodes(VfioNodeSet set, const std::vector<std::string>& cdevs,
                                                   std::optional<int> iommu_group, bool host_iommufd,
                                                   std::string_view what) {
  std::vector<std::string> nodes;
  if (set == VfioNodeSet::kIommufd) {
    if (!host_iommufd) {
      return absl::FailedPreconditionError(absl::StrCat(std::string(what), ": iommufd asked for, but the node has no /dev/iommu"));
    }
    if (cdevs.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat(std::string(what), ": iommufd asked for, but it has no VFIO cdev (/sys/bus/pci/devices/.../vfio-dev)"));
    }
    for (const std::string& cdev : cdevs) nodes.push_back("/dev/vfio/devices/" + cdev);
    nodes.push_back("/dev/iommu");
    return nodes;
  }
  if (!iommu_group) return absl::FailedPreconditionError(absl::StrCat(std::string(what), ": the legacy VFIO backend needs an IOMMU group"));
  nodes.push_back("/dev/vfio/vfio");
  nodes.push_back(absl::StrCat("/dev/vfio/", *iommu_group));
  if (set == VfioNodeSet::kLegacyAndCdevs) {
    for (const std::string& cdev : cdevs) nodes.push_back("/dev/vfio/devices/" + cdev);
  }
  return nodes;
}

}  // namespace vfio_agent::pci
