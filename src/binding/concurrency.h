// The binder's two concurrency tools: a worker pool for IOMMU groups, and a sysfs write bounded by a
// deadline. The kernel may keep a write blocked indefinitely (unbind from a busy nvidia device); the write
// then stays on its own detached thread, which owns everything it touches, and the caller gets
// DeadlineExceeded and moves on.
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace vfio_agent::binding {

absl::Status WriteWithDeadline(const std::filesystem::path& path, std::string data, absl::Duration timeout);

// Runs task(0) .. task(count - 1) on worker threads, at most `parallelism` at once (0 = all at once), and
// returns when all have finished. Tasks must not throw.
void RunParallel(size_t count, int parallelism, const std::function<void(size_t)>& task);

}  // namespace vfio_agent::binding
