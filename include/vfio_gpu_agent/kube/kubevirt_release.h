// The KubeVirt release a cluster runs, as its KubeVirt CR reports it (status.observedKubeVirtVersion). What it
// decides here: which nodes KubeVirt's own PCI device plugin hands a VM (the device plugin's --vfio-backend auto)
// and whether KubeVirt can open iommufd at all (validate's kubevirt.vfio_backend). One parser for both.
#pragma once

#include <compare>
#include <optional>
#include <string>
#include <string_view>

namespace vfio_agent::kube {

struct KubevirtRelease {
  int major = 0;
  int minor = 0;
  std::string text;  // as the CR says it, "v1.9.0-alpha.0"

  // Ordered by (major, minor) only: what changes what KubeVirt hands out is a minor release.
  std::strong_ordering operator<=>(const KubevirtRelease& other) const {
    if (auto c = major <=> other.major; c != 0) return c;
    return minor <=> other.minor;
  }
  bool operator==(const KubevirtRelease& other) const { return major == other.major && minor == other.minor; }
};

// "v1.9.0" / "1.10.2-rc.1" -> 1.9 / 1.10; nullopt for anything else ("main", "", "v1").
std::optional<KubevirtRelease> ParseKubevirtRelease(std::string_view version);

// The first release from which KubeVirt's PCI device plugin also hands out each function's /dev/vfio/devices/vfioN
// ("Expose VFIO cdev devices to virt-launcher for IOMMUFD passthrough") and can open iommufd (its IOMMUFD gate).
inline constexpr int kCdevMajor = 1, kCdevMinor = 9;
inline bool HandsOutCdevs(const KubevirtRelease& release) {
  return release >= KubevirtRelease{.major = kCdevMajor, .minor = kCdevMinor};
}

}  // namespace vfio_agent::kube
