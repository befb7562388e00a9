// Debian's abseil is built with its own absl::string_view (ABSL_OPTION_USE_STD_STRING_VIEW 0), which
// does not convert implicitly from std::string_view; the public API uses std::string_view.
#pragma once

#include <string_view>

#include "absl/strings/string_view.h"

namespace vfio_agent::names {

inline absl::string_view AsAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }
inline std::string_view AsStd(absl::string_view s) { return std::string_view(s.data(), s.size()); }

}  // namespace vfio_agent::names
