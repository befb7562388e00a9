// Reads one PCI function relative to an open directory fd, so a scan of thousands of devices costs a
// handful of openat/read/readlinkat calls per device and no path walks from the sysfs root: one listing
// tells which optional entries exist, and one read of `modalias` gives every id and the class.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "vfio_gpu_agent/pci/inventory.h"

namespace vfio_agent::pci::internal {

struct DeviceRead {
  absl::StatusOr<Function> function = Function{};
  std::filesystem::path failed_path{};  // the attribute that failed, when `function` is an error
  std::optional<int> iommu_group{};     // known even when the attributes could not be read
};

// `parent_fd` is an open directory holding the device entry `bdf` (normally bus/pci/devices);
// `parent_path` is only used to name paths in errors.
DeviceRead ReadFunctionAt(int parent_fd, const std::filesystem::path& parent_path, const std::string& bdf);

// Calls `visit` for each entry of the open directory `dir_fd` except "." and ".."; does not close it.
// Returns 0, or the errno of a failed listing (callers name the path, so healthy devices build none).
int ForEachEntry(int dir_fd, absl::FunctionRef<void(std::string_view)> visit);

// std::string_view without surrounding ASCII whitespace (this abseil's string_view is not std's).
std::string_view TrimWhitespace(std::string_view text);

}  // namespace vfio_agent::pci::internal
