// What the kubelet last answered to the driver's registration (NotifyRegistrationStatus), kept in a file so that
// `validate` (another process, maybe another container) can tell "the kubelet accepted us" from "the socket is
// up but the kubelet refused it or never came": <plugins_dir>/<driver>/registration.json, rewritten atomically
// on every notification.
#pragma once

#include <filesystem>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "vfio_gpu_agent/dra/driver.h"

namespace vfio_agent::dra {

// <plugins_dir>/<driver>/registration.json
std::filesystem::path RegistrationRecordPath(const DriverOptions& options);

absl::Status WriteRegistrationRecord(const std::filesystem::path& path, const RegistrationStatus& status);
// NotFound when no notification was ever recorded; InvalidArgument (naming the path) for a file that is not one.
absl::StatusOr<RegistrationStatus> ReadRegistrationRecord(const std::filesystem::path& path);

}  // namespace vfio_agent::dra
