#include "vfio_backend_checks.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cluster_check_util.h"
#include "vfio_gpu_agent/common/fs.h"

namespace vfio_agent::validation {
namespace {

using cluster::MakeCheck;
constexpr std::string_view kIommufdGate = "IOMMUFD";

}  // namespace

std::optional<std::pair<int, int>> KubevirtMinorVersion(std::string_view version) {
  if (version.starts_with('v')) version.remove_prefix(1);
  // Leading digits of `text` as a number, and the rest; nullopt without a digit.
  auto number = [](std::string_view& text) -> std::optional<int> {
    size_t digits = 0;
    int value = 0;
    while (digits < text.size() && digits < 6 && text[digits] >= '0' && text[digits] <= '9') {
      value = value * 10 + (text[digits++] - '0');
    }
    if (digits == 0) return std::nullopt;
    text.remove_prefix(digits);
    return value;
  };
  const std::optional<int> major = number(version);
  if (!major || !version.starts_with('.')) return std::nullopt;
  version.remove_prefix(1);
  const std::optional<int> minor = number(version);
  if (!minor) return std::nullopt;
  return std::pair{*major, *minor};
}

bool KubevirtEnablesIommufd(const KubevirtCr& cr) {
  const std::optional<std::pair<int, int>> version = KubevirtMinorVersion(cr.observed_version);
  return version && *version >= std::pair{1, 9} &&
         std::find(cr.feature_gates.begin(), cr.feature_gates.end(), kIommufdGate) != cr.feature_gates.end();
}

Check VfioBackendCheck(const NodeView& node, const KubevirtCr& cr) {
  std::vector<Evidence> evidence;
  const std::filesystem::path iommu = node.paths.dev_root / "iommu";
  const bool host_iommufd = fs::Exists(iommu);
  evidence.push_back({iommu.string(), host_iommufd ? "present" : "(absent)"});
  int gpus = 0, with_group_node = 0, with_cdev = 0;
  if (node.selection != nullptr && node.inventory != nullptr) {
    for (const std::string& bdf : node.selection->gpus) {
      if (node.selection->RoleOf(bdf) != pci::Role::kGpu) continue;
      const pci::Function* fn = node.inventory->Find(bdf);
      if (fn == nullptr) continue;
      ++gpus;
      if (fn->iommu_group && fs::Exists(node.paths.VfioDir() / std::to_string(*fn->iommu_group))) ++with_group_node;
      const bool cdevs = !fn->vfio_cdevs.empty() &&
                         std::all_of(fn->vfio_cdevs.begin(), fn->vfio_cdevs.end(), [&](const std::string& cdev) {
                           return fs::Exists(node.paths.VfioDir() / "devices" / cdev);
                         });
      if (cdevs) ++with_cdev;
    }
  }
  evidence.push_back({"selected GPUs with a group node / an iommufd cdev",
                      absl::StrCat(with_group_node, " / ", with_cdev, " of ", gpus)});
  evidence.push_back({absl::StrCat(cr.name.empty() ? "KubeVirt CR" : cr.name, " status.observedKubeVirtVersion"),
                      cr.observed_version.empty() ? "(not reported)" : cr.observed_version});
  const bool legacy = gpus > 0 && with_group_node == gpus;
  const bool iommufd = gpus > 0 && host_iommufd && with_cdev == gpus;
  std::vector<std::string> offered;
  if (legacy) offered.push_back("legacy (/dev/vfio/<group>)");
  if (iommufd) offered.push_back("iommufd (/dev/iommu, /dev/vfio/devices/vfioN)");
  if (offered.empty()) {
    return MakeCheck("kubevirt.vfio_backend", Layer::kKubevirt, "node", Result::kSkip,
                     "no selected GPU has the nodes of one VFIO backend yet (the devices layer says why)",
                     std::move(evidence));
  }
  const bool kubevirt_iommufd = KubevirtEnablesIommufd(cr);
  const std::string kubevirt =
      kubevirt_iommufd
          ? absl::StrCat("KubeVirt ", cr.observed_version, " with the IOMMUFD gate opens iommufd")
          : absl::StrCat("KubeVirt ", cr.observed_version.empty() ? "(version not reported)" : cr.observed_version,
                         " opens the legacy nodes only (iommufd needs >= v1.9 and the IOMMUFD feature gate)");
  const std::string message = absl::StrCat("the node offers ", absl::StrJoin(offered, " and "), "; ", kubevirt);
  if (!legacy && !kubevirt_iommufd) {
    return MakeCheck("kubevirt.vfio_backend", Layer::kKubevirt, "node", Result::kFail, message, std::move(evidence),
                     "Give KubeVirt the legacy group nodes (a kernel with VFIO_CONTAINER / VFIO_GROUP), or run "
                     "KubeVirt >= v1.9 with IOMMUFD in spec.configuration.developerConfiguration.featureGates and "
                     "claim the GPUs through the <model>-iommufd DeviceClass");
  }
  return MakeCheck("kubevirt.vfio_backend", Layer::kKubevirt, "node", Result::kPass,
                   absl::StrCat(message,
                                iommufd && !kubevirt_iommufd
                                    ? "; claims of a <model>-iommufd DeviceClass would fail in the VM: use <model>."
                                    : ""),
                   std::move(evidence));
}

}  // namespace vfio_agent::validation
