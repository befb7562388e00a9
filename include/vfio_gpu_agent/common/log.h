// Process-wide logging setup: one line per event to stderr, so stdout stays for reports.
#pragma once

#include <string_view>

namespace vfio_agent {

// level: trace, debug, info, warn, error. Unknown levels fall back to info.
void InitLogging(std::string_view level);

}  // namespace vfio_agent
