#include "vfio_gpu_agent/plugin/vfio_backend.h"

#include "absl/strings/str_cat.h"
#include "vfio_gpu_agent/common/fs.h"

namespace vfio_agent::plugin {

std::string_view VfioBackendChoiceName(VfioBackendChoice choice) {
  switch (choice) {
    case VfioBackendChoice::kLegacy: return "legacy";
    case VfioBackendChoice::kIommufd: return "iommufd";
    case VfioBackendChoice::kAuto: return "auto";
  }
  return "auto";
}

std::optional<VfioBackendChoice> ParseVfioBackendChoice(std::string_view name) {
  if (name == "legacy") return VfioBackendChoice::kLegacy;
  if (name == "iommufd") return VfioBackendChoice::kIommufd;
  if (name == "auto") return VfioBackendChoice::kAuto;
  return std::nullopt;
}

pci::VfioNodeSet ResolveNodeSet(VfioBackendChoice choice, const std::optional<kube::KubevirtRelease>& release) {
  switch (choice) {
    case VfioBackendChoice::kLegacy: return pci::VfioNodeSet::kLegacy;
    case VfioBackendChoice::kIommufd: return pci::VfioNodeSet::kIommufd;
    case VfioBackendChoice::kAuto: break;
  }
  if (release && !kube::HandsOutCdevs(*release)) return pci::VfioNodeSet::kLegacy;
  return pci::VfioNodeSet::kLegacyAndCdevs;
}

absl::Status CheckHostSupports(VfioBackendChoice choice, const std::filesystem::path& dev_root) {
  if (choice != VfioBackendChoice::kIommufd) return absl::OkStatus();
  const std::filesystem::path iommu = dev_root / "iommu";
  if (fs::Exists(iommu)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "--vfio-backend iommufd: ", iommu.string(),
      " does not exist (a kernel without CONFIG_IOMMUFD, or the iommufd module not loaded); use --vfio-backend "
      "legacy or auto on this node"));
}

}  // namespace vfio_agent::plugin
