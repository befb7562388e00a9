// The binder's two concurrency tools: parallel work over IOMMU groups, and a sysfs write bounded by a
// deadline. Both run on the process's reused workers (common/worker_pool.h). The kernel may keep a write
// blocked indefinitely (unbind from a busy nvidia device); the write then keeps its worker, which owns
// everything the write touches, the caller gets DeadlineExceeded and moves on, and later writes go to other
// workers.
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace vfio_agent::binding {

absl::Status WriteWithDeadline(const std::filesystem::path& path, std::string data, absl::Duration timeout);

// Runs task(0) .. task(count - 1), at most `parallelism` at once (0 = all at once), on the calling thread
// and pool workers, and returns when all have finished. Tasks must not throw.
void RunParallel(size_t count, int parallelism, const std::function<void(size_t)>& task);

}  // namespace vfio_agent::binding
