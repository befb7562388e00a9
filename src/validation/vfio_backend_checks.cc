#include "vfio_backend_checks.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cluster_check_util.h"
#include "vfio_gpu_agent/common/fs.h"
#include "vfio_gpu_agent/plugin/vfio_backend.h"

namespace vfio_agent::validation {
namespace {

using cluster::MakeCheck;
constexpr std::string_view kIommufdGate = "IOMMUFD";

std::string NodeSetText(pci::VfioNodeSet set) {
  switch (set) {
    case pci::VfioNodeSet::kLegacy: return "the legacy nodes (/dev/vfio/vfio, /dev/vfio/<group>)";
    case pci::VfioNodeSet::kLegacyAndCdevs:
      return "the legacy nodes and the cdevs (/dev/vfio/vfio, /dev/vfio/<group>, /dev/vfio/devices/vfioN), as "
             "KubeVirt >= v1.9's own PCI plugin";
    case pci::VfioNodeSet::kIommufd: return "the iommufd nodes only (/dev/vfio/devices/vfioN, /dev/iommu)";
  }
  return "";
}

}  // namespace

bool KubevirtEnablesIommufd(const KubevirtCr& cr) {
  const std::optional<kube::KubevirtRelease> release = kube::ParseKubevirtRelease(cr.observed_version);
  return release && kube::HandsOutCdevs(*release) &&
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
  std::string message = absl::StrCat("the node offers ", absl::StrJoin(offered, " and "), "; ", kubevirt);
  if (node.vfio_backend) {
    // The device plugin: one node set for the node, resolved as the agent resolves it.
    const plugin::VfioBackendChoice choice = *node.vfio_backend;
    const pci::VfioNodeSet set = plugin::ResolveNodeSet(choice, kube::ParseKubevirtRelease(cr.observed_version));
    evidence.push_back({"--vfio-backend", std::string(plugin::VfioBackendChoiceName(choice))});
    absl::StrAppend(&message, "; the device plugin hands out ", NodeSetText(set), " (--vfio-backend ",
                    std::string(plugin::VfioBackendChoiceName(choice)), ")");
    if (set == pci::VfioNodeSet::kIommufd && !host_iommufd) {
      return MakeCheck("kubevirt.vfio_backend", Layer::kKubevirt, "node", Result::kFail, message, std::move(evidence),
                       absl::StrCat("The agent refuses to start with --vfio-backend iommufd without ", iommu.string(),
                                    ": load the iommufd module (kernel >= 6.2), or use --vfio-backend auto"));
    }
    if (set == pci::VfioNodeSet::kIommufd && !iommufd) {
      return MakeCheck("kubevirt.vfio_backend", Layer::kKubevirt, "node", Result::kFail, message, std::move(evidence),
                       "A selected GPU has no VFIO cdev under /dev/vfio/devices (vfio-pci of a kernel >= 6.2 with "
                       "VFIO_DEVICE_CDEV makes one): the device plugin advertises it Unhealthy under --vfio-backend "
                       "iommufd");
    }
    if (set == pci::VfioNodeSet::kIommufd && !kubevirt_iommufd) {
      return MakeCheck("kubevirt.vfio_backend", Layer::kKubevirt, "node", Result::kFail, message, std::move(evidence),
                       "A VM handed the iommufd nodes only needs KubeVirt >= v1.9 with IOMMUFD in "
                       "spec.configuration.developerConfiguration.featureGates; enable it, or run the agent with "
                       "--vfio-backend auto (the chart's vfioBackend)");
    }
    if (set != pci::VfioNodeSet::kIommufd && !legacy) {
      return MakeCheck("kubevirt.vfio_backend", Layer::kKubevirt, "node", Result::kFail, message, std::move(evidence),
                       "The node has no legacy group nodes (a kernel without VFIO_GROUP): run the agent with "
                       "--vfio-backend iommufd and KubeVirt >= v1.9 with its IOMMUFD gate");
    }
    return MakeCheck("kubevirt.vfio_backend", Layer::kKubevirt, "node", Result::kPass, message, std::move(evidence));
  }
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
