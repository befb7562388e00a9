// Shared by the host layers: building one Check, and the small reads they all make.
#pragma once

#include <filesystem>
#include <string>
#include <utility>

#include "vfio_gpu_agent/validation/check.h"

namespace vfio_agent::validation::internal {

class CheckBuilder {
 public:
  CheckBuilder(std::string id, Layer layer, std::string subject) {
    check_.id = std::move(id);
    check_.layer = layer;
    check_.subject = std::move(subject);
  }
  CheckBuilder& Saw(std::string source, std::string value) {
    check_.evidence.push_back({std::move(source), std::move(value)});
    return *this;
  }
  Check Pass(std::string message) { return Finish(Result::kPass, std::move(message), ""); }
  Check Warn(std::string message, std::string fix) { return Finish(Result::kWarn, std::move(message), std::move(fix)); }
  Check Fail(std::string message, std::string fix) { return Finish(Result::kFail, std::move(message), std::move(fix)); }
  Check Skip(std::string why) { return Finish(Result::kSkip, std::move(why), ""); }

 private:
  Check Finish(Result result, std::string message, std::string fix) {
    check_.result = result;
    check_.message = std::move(message);
    check_.fix = std::move(fix);
    return std::move(check_);
  }
  Check check_;
};

// Trimmed content of a small file, or "(absent)" / "(unreadable: <error>)" as evidence text.
std::string ReadForEvidence(const std::filesystem::path& path);

// stat(2) says a character device (not following a dangling link into nothing).
bool IsCharDevice(const std::filesystem::path& path);

// <BDF>/power_state ("D0", "D3hot", "D3cold", ...); "" when the kernel does not expose it.
std::string ReadPowerState(const HostPaths& paths, const std::string& bdf);

}  // namespace vfio_agent::validation::internal
