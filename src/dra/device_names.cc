#include "vfio_gpu_agent/dra/device_names.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "vfio_gpu_agent/pci/inventory.h"

namespace vfio_agent::dra {
namespace {
constexpr std::string_view kPrefix = "gpu-";
}  // namespace

std::string DeviceName(std::string_view bdf) {
  std::string name = absl::StrCat(std::string(kPrefix), std::string(bdf));
  std::replace(name.begin(), name.end(), ':', '-');
  std::replace(name.begin(), name.end(), '.', '-');
  return name;
}

absl::StatusOr<std::string> BdfOfDevice(std::string_view device_name) {
  auto invalid = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("device \"", std::string(device_name), "\" is not one of this driver's (gpu-dddd-bb-dd-f)"));
  };
  // gpu- + dddd-bb-dd-f: the separators at fixed places, so the BDF is rebuilt exactly.
  if (!device_name.starts_with(kPrefix) || device_name.size() != kPrefix.size() + 12) return invalid();
  std::string bdf(device_name.substr(kPrefix.size()));
  if (bdf[4] != '-' || bdf[7] != '-' || bdf[10] != '-') return invalid();
  bdf[4] = ':';
  bdf[7] = ':';
  bdf[10] = '.';
  absl::StatusOr<std::string> canonical = pci::CanonicalBdf(bdf);
  if (!canonical.ok() || *canonical != bdf) return invalid();
  return bdf;
}

}  // namespace vfio_agent::dra
