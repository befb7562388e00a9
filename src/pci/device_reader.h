// Reads one PCI function relative to an open directory fd, so a scan of thousands of devices costs a
// handful of openat/read/readlinkat calls per device and no path walks from the sysfs root: one read of
// `modalias` gives every id and the class, drivers come from one listing per driver, and the device directory
// is resolved once (O_PATH) and opened for listing only for functions of the managed vendor. A function of
// another vendor costs six calls.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "attr_parsers.h"
#include "vfio_gpu_agent/pci/inventory.h"

namespace vfio_agent::pci::internal {

struct DeviceRead {
  absl::StatusOr<Function> function = Function{};
  std::filesystem::path failed_path{};  // the attribute that failed, when `function` is an error
  std::optional<int> iommu_group{};     // known even when the attributes could not be read
};

// (BDF, driver) of every bound device, sorted by BDF, from the bus/pci/drivers/<driver>/<BDF> links.
using BoundDrivers = std::vector<std::pair<std::string, std::string>>;

// Lists the open bus/pci/drivers directory `drivers_fd`; nullopt if any listing fails.
std::optional<BoundDrivers> ListBoundDrivers(int drivers_fd);

// `parent_fd` is an open directory holding the device entry `bdf` (normally bus/pci/devices);
// `parent_path` is only used to name paths in errors. Reads as `options` says. Without `read_driver_link`
// the driver is left for the caller to fill in from ListBoundDrivers.
DeviceRead ReadFunctionAt(int parent_fd, const std::filesystem::path& parent_path, const std::string& bdf,
                          const ScanOptions& options, bool read_driver_link);

// The driver of device entry `bdf` under `parent_fd` from its driver link; "" when unbound.
std::string ReadDriverLink(int parent_fd, const std::string& bdf);

// Sets fn->header_type from config space when fn is bridge-class (what ReadFunctionAt leaves out for
// functions of other vendors).
void ReadHeaderType(int parent_fd, Function* fn);

// True if `text` is a BDF exactly as CanonicalBdf would print it; allocates nothing (a scan checks thousands).
bool IsCanonicalBdf(std::string_view text);

// Calls `visit` for each entry of the open directory `dir_fd` except "." and ".."; does not close it.
// Returns 0, or the errno of a failed listing (callers name the path, so healthy devices build none).
int ForEachEntry(int dir_fd, absl::FunctionRef<void(std::string_view)> visit);
// The same, stopping (with 0) at the first entry for which `visit` returns false.
int ForEachEntryWhile(int dir_fd, absl::FunctionRef<bool(std::string_view)> visit);

}  // namespace vfio_agent::pci::internal
