// Pieces shared by bind and unbind: sysfs writes recorded as steps of a device's result.
#pragma once

#include <filesystem>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "vfio_gpu_agent/binding/binder.h"
#include "vfio_gpu_agent/common/host_paths.h"

namespace vfio_agent::binding {

// A write the caller's deadline kept from starting fails DeadlineExceeded with this message: nothing was written.
inline constexpr char kNotStarted[] = "not started: the caller's deadline has passed";

// Performs the writes of one device, each under the deadline, and appends
// "bus/pci/drivers/nvidia/unbind <- 0000:3b:00.0: ok" (or the error) to result->steps.
class DeviceWriter {
 public:
  // No write starts after `deadline`; each waits at most the earlier of `timeout` and it.
  DeviceWriter(const HostPaths& paths, absl::Duration timeout, DeviceResult* result,
               absl::Time deadline = absl::InfiniteFuture())
      : paths_(paths), timeout_(timeout), deadline_(deadline), result_(result) {}

  absl::Status Write(const std::filesystem::path& path, const std::string& data);
  absl::Status SetOverride(const std::string& driver);  // "" clears it
  absl::Status Unbind(const std::string& driver);
  absl::Status BindTo(const std::string& driver);
  absl::Status Probe();                                  // bus/pci/drivers_probe

 private:
  const HostPaths& paths_;
  absl::Duration timeout_;
  absl::Time deadline_;
  DeviceResult* result_;
};

// The driver link's name now; "" when the device has no driver (or is gone).
std::string CurrentDriver(const HostPaths& paths, const std::string& bdf);

// Functions bind moves to vfio and unbind gives back; bridges and foreign devices are never touched.
bool IsManagedRole(pci::Role role);

}  // namespace vfio_agent::binding
