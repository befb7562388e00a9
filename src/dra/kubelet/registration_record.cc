#include "vfio_gpu_agent/dra/registration_record.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "vfio_gpu_agent/common/fs.h"

namespace vfio_agent::dra {

std::filesystem::path RegistrationRecordPath(const DriverOptions& options) {
  return options.plugins_dir / options.driver_name / "registration.json";
}

absl::Status WriteRegistrationRecord(const std::filesystem::path& path, const RegistrationStatus& status) {
  const nlohmann::json record = {{"registered", status.registered},
                                 {"error", status.error},
                                 {"notifications", status.notifications}};
  return fs::WriteFileAtomically(path, record.dump() + "\n");
}

absl::StatusOr<RegistrationStatus> ReadRegistrationRecord(const std::filesystem::path& path) {
  auto text = fs::ReadTrimmed(path);
  if (!text.ok()) return text.status();
  const nlohmann::json record = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!record.is_object() || !record.contains("registered") || !record["registered"].is_boolean() ||
      !record.value("error", nlohmann::json()).is_string() ||
      !record.value("notifications", nlohmann::json()).is_number_integer()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path.string(), ": not a registration record ({\"registered\":bool,\"error\":\"\",...})"));
  }
  RegistrationStatus status;
  status.registered = record["registered"].get<bool>();
  status.error = record["error"].get<std::string>();
  status.notifications = record["notifications"].get<int>();
  return status;
}

}  // namespace vfio_agent::dra
