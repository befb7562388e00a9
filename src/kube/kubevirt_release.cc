#include "vfio_gpu_agent/kube/kubevirt_release.h"

namespace vfio_agent::kube {

std::optional<KubevirtRelease> ParseKubevirtRelease(std::string_view version) {
  KubevirtRelease release{.text = std::string(version)};
  if (version.starts_with('v')) version.remove_prefix(1);
  // Leading digits of `text` as a number, and the rest; nullopt without a digit.
  auto number = [](std::string_view& text) -> std::optional<int> {
    size_t digits = 0;
    int value = 0;
    while (digits < text.size() && digits < 6 && text[digits] >= '0' && text[digits] <= '9') {
      value = value * 10 + (text[digits++] - '0');
    }
    if (digits == 0) return std::nullopt;
    text.remove_prefix(digits);
    return value;
  };
  const std::optional<int> major = number(version);
  if (!major || !version.starts_with('.')) return std::nullopt;
  version.remove_prefix(1);
  const std::optional<int> minor = number(version);
  if (!minor) return std::nullopt;
  release.major = *major;
  release.minor = *minor;
  return release;
}

}  // namespace vfio_agent::kube
