// The device plugin's --vfio-backend: which VFIO nodes Allocate and the CDI specs hand a VM, one set for the whole
// node (the kubelet caches an Allocate answer and replays it, so the set is a node's setting, not a pod's). In DRA
// the claim's DeviceClass picks instead (dra/vfio_backend.h).
#pragma once

#include <filesystem>
#include <optional>
#include <string_view>

#include "absl/status/status.h"
#include "vfio_gpu_agent/kube/kubevirt_release.h"
#include "vfio_gpu_agent/pci/vfio_backend.h"

namespace vfio_agent::plugin {

enum class VfioBackendChoice { kLegacy, kIommufd, kAuto };

std::string_view VfioBackendChoiceName(VfioBackendChoice choice);  // "legacy", "iommufd", "auto"
std::optional<VfioBackendChoice> ParseVfioBackendChoice(std::string_view name);

// legacy -> kLegacy; iommufd -> kIommufd; auto -> what KubeVirt's own PCI device plugin hands out for `release`:
// kLegacy before v1.9, kLegacyAndCdevs from v1.9 on, and kLegacyAndCdevs while the release is unknown (no API, no CR,
// not read yet): the newest release's set, whose cdevs an older launcher simply leaves unopened. mdev resources are
// handed the group node whatever this says (ResourceDevices::NodeSetFor).
pci::VfioNodeSet ResolveNodeSet(VfioBackendChoice choice, const std::optional<kube::KubevirtRelease>& release);

// FailedPrecondition naming <dev_root>/iommu when `choice` is iommufd and the host has no iommufd: the agent refuses
// to start rather than advertise devices no VM could open.
absl::Status CheckHostSupports(VfioBackendChoice choice, const std::filesystem::path& dev_root);

}  // namespace vfio_agent::plugin
