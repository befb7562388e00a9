// Test support ("support/fuse.h"): tests on the FUSE sysfs simulator skip, with one message that
// scripts/test.sh counts and reports, when the machine has no usable /dev/fuse (a container without it, a
// kernel without the module). In CI a skip fails the run.
#pragma once

#include <unistd.h>

namespace vfio_agent::testing {

inline constexpr char kNeedsFuse[] = "needs /dev/fuse (FUSE sysfs simulator); load the fuse module or run with --device /dev/fuse";

inline bool FuseAvailable() { return ::access("/dev/fuse", R_OK | W_OK) == 0; }

}  // namespace vfio_agent::testing
