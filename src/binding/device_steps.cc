#include "device_steps.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "concurrency.h"
#include "vfio_gpu_agent/common/fs.h"

namespace vfio_agent::binding {

absl::Status DeviceWriter::Write(const std::filesystem::path& path, const std::string& data) {
  const absl::Duration left = deadline_ - absl::Now();
  absl::Status status = left <= absl::ZeroDuration()
                            ? absl::DeadlineExceededError(kNotStarted)
                            : WriteWithDeadline(path, data, std::min(timeout_, left));
  std::string shown = data == "\n" ? std::string("\\n") : data;
  absl::StrAppend(&result_->steps.emplace_back(), path.lexically_relative(paths_.sysfs_root).string(), " <- ", shown,
                  ": ", status.ok() ? std::string("ok") : std::string(status.message()));
  return status;
}

absl::Status DeviceWriter::SetOverride(const std::string& driver) {
  // The kernel clears driver_override on an empty line.
  return Write(paths_.PciDevice(result_->bdf) / "driver_override", driver.empty() ? "\n" : driver);
}

absl::Status DeviceWriter::Unbind(const std::string& driver) {
  return Write(paths_.PciDriver(driver) / "unbind", result_->bdf);
}

absl::Status DeviceWriter::BindTo(const std::string& driver) {
  return Write(paths_.PciDriver(driver) / "bind", result_->bdf);
}

absl::Status DeviceWriter::Probe() { return Write(paths_.sysfs_root / "bus/pci/drivers_probe", result_->bdf); }

std::string CurrentDriver(const HostPaths& paths, const std::string& bdf) {
  absl::StatusOr<std::string> driver = fs::ReadLinkBasename(paths.PciDevice(bdf) / "driver");
  return driver.ok() ? *driver : std::string();
}

bool IsManagedRole(pci::Role role) {
  return role == pci::Role::kGpu || role == pci::Role::kCompanion || role == pci::Role::kNvSwitch;
}

}  // namespace vfio_agent::binding
