#include "vfio_gpu_agent/dra/device_names.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "vfio_gpu_agent/pci/inventory.h"
#include "vfio_gpu_agent/vgpu/discovery.h"

namespace vfio_agent::dra {
namespace {

constexpr std::string_view kPrefix = "gpu-";
constexpr std::string_view kVfPrefix = "vgpu-";
constexpr std::string_view kMdevPrefix = "mdev-";

std::string NameOfAddress(std::string_view prefix, std::string_view bdf) {
  std::string name = absl::StrCat(std::string(prefix), std::string(bdf));
  std::replace(name.begin(), name.end(), ':', '-');
  std::replace(name.begin(), name.end(), '.', '-');
  return name;
}

// <prefix> + dddd-bb-dd-f: the separators at fixed places, so the BDF is rebuilt exactly; nullopt otherwise.
std::optional<std::string> AddressOfName(std::string_view prefix, std::string_view device_name) {
  if (!device_name.starts_with(prefix) || device_name.size() != prefix.size() + 12) return std::nullopt;
  std::string bdf(device_name.substr(prefix.size()));
  if (bdf[4] != '-' || bdf[7] != '-' || bdf[10] != '-') return std::nullopt;
  bdf[4] = ':';
  bdf[7] = ':';
  bdf[10] = '.';
  absl::StatusOr<std::string> canonical = pci::CanonicalBdf(bdf);
  if (!canonical.ok() || *canonical != bdf) return std::nullopt;
  return bdf;
}

}  // namespace

std::string DeviceName(std::string_view bdf) { return NameOfAddress(kPrefix, bdf); }

absl::StatusOr<std::string> BdfOfDevice(std::string_view device_name) {
  if (std::optional<std::string> bdf = AddressOfName(kPrefix, device_name)) return *bdf;
  return absl::InvalidArgumentError(
      absl::StrCat("device \"", std::string(device_name), "\" is not one of this driver's (gpu-dddd-bb-dd-f)"));
}

std::string MdevDeviceName(std::string_view uuid) { return absl::StrCat(std::string(kMdevPrefix), std::string(uuid)); }

std::string VfDeviceName(std::string_view bdf) { return NameOfAddress(kVfPrefix, bdf); }

absl::StatusOr<VgpuId> VgpuOfDevice(std::string_view device_name) {
  if (std::optional<std::string> bdf = AddressOfName(kVfPrefix, device_name)) {
    return VgpuId{.mdev = false, .id = *bdf};
  }
  if (device_name.starts_with(kMdevPrefix)) {
    const std::string_view uuid = device_name.substr(kMdevPrefix.size());
    // Lower-case only, as MdevDeviceName makes it from the kernel's spelling.
    if (vgpu::IsMdevUuid(uuid) && std::none_of(uuid.begin(), uuid.end(), [](char c) { return c >= 'A' && c <= 'Z'; })) {
      return VgpuId{.mdev = true, .id = std::string(uuid)};
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("device \"", std::string(device_name),
                                                 "\" is not one of this driver's vGPUs (mdev-<uuid> or vgpu-dddd-bb-dd-f)"));
}

}  // namespace vfio_agent::dra
