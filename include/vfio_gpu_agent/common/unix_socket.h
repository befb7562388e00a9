// Unix-domain sockets the agent serves gRPC on, in directories the kubelet watches or dials.
#pragma once

#include <filesystem>

#include "absl/status/status.h"

namespace vfio_agent {

// True when something accepts connections on `path`: another live server owns it.
bool SomeoneListens(const std::filesystem::path& path);

// Makes `path` free for a new server: InvalidArgument when it does not fit in sun_path, AlreadyExists when a live
// server answers on it, otherwise a socket left by an earlier run is removed (a watcher such as the kubelet's
// plugin watcher then sees the new server's socket created afresh, not an old inode).
absl::Status ClaimSocketPath(const std::filesystem::path& path);

}  // namespace vfio_agent
