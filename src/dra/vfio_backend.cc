#include "vfio_gpu_agent/dra/vfio_backend.h"

#include <optional>

#include "absl/strings/str_cat.h"

namespace vfio_agent::dra {

pci::VfioBackend BackendOfDeviceClass(std::string_view device_class, std::string_view driver) {
  const std::string suffix = absl::StrCat(std::string(kIommufdClassSuffix), ".", std::string(driver));
  return device_class.ends_with(suffix) ? pci::VfioBackend::kIommufd : pci::VfioBackend::kLegacy;
}

absl::StatusOr<pci::VfioBackend> ClaimBackend(const std::vector<const kube::AllocationResult*>& results,
                                              std::string_view driver, std::string_view claim) {
  std::optional<pci::VfioBackend> backend;
  const kube::AllocationResult* first = nullptr;
  for (const kube::AllocationResult* result : results) {
    const pci::VfioBackend mine = BackendOfDeviceClass(result->device_class, driver);
    if (backend && *backend != mine) {
      return absl::InvalidArgumentError(absl::StrCat(
          std::string(claim), ": request ", first->request, " (class ", first->device_class, ") wants the ",
          std::string(pci::VfioBackendName(*backend)), " VFIO backend and request ", result->request, " (class ",
          result->device_class, ") ", std::string(pci::VfioBackendName(mine)), "; one claim gets one backend"));
    }
    backend = mine;
    if (first == nullptr) first = result;
  }
  return backend.value_or(pci::VfioBackend::kLegacy);
}

}  // namespace vfio_agent::dra
