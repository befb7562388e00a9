#include <sys/stat.h>

#include "check_builder.h"
#include "absl/strings/str_cat.h"
#include "vfio_gpu_agent/common/fs.h"
#include "vfio_gpu_agent/validation/check.h"

namespace vfio_agent::validation {

const char* LayerName(Layer layer) {
  switch (layer) {
    case Layer::kPlatform: return "platform";
    case Layer::kDevices: return "devices";
    case Layer::kPlugin: return "plugin";
    case Layer::kKubelet: return "kubelet";
    case Layer::kKubevirt: return "kubevirt";
    case Layer::kApi: return "api";
    case Layer::kFabric: return "fabric";
    case Layer::kVgpu: return "vgpu";
  }
  return "platform";
}

const char* ResultName(Result result) {
  switch (result) {
    case Result::kPass: return "pass";
    case Result::kWarn: return "warn";
    case Result::kFail: return "fail";
    case Result::kSkip: return "skip";
  }
  return "fail";
}

namespace internal {

std::string ReadForEvidence(const std::filesystem::path& path) {
  auto content = fs::ReadTrimmed(path);
  if (content.ok()) return content->empty() ? "(empty)" : *content;
  if (absl::IsNotFound(content.status())) return "(absent)";
  return absl::StrCat("(unreadable: ", content.status().message(), ")");
}

bool IsCharDevice(const std::filesystem::path& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISCHR(st.st_mode);
}

std::string ReadPowerState(const HostPaths& paths, const std::string& bdf) {
  auto state = fs::ReadTrimmed(paths.PciDevice(bdf) / "power_state");
  return state.ok() ? *state : "";
}

}  // namespace internal
}  // namespace vfio_agent::validation
