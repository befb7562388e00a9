#include "concurrency.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "vfio_gpu_agent/common/fs.h"
#include "vfio_gpu_agent/common/worker_pool.h"

namespace vfio_agent::binding {
namespace {

// Shared between the caller and the worker doing the write; whichever finishes last frees it, so an abandoned
// write owns its result slot. std::mutex rather than absl::Mutex: ThreadSanitizer sees pthread
// synchronisation even through Debian's uninstrumented libraries.
struct WriteState {
  std::mutex mu;
  std::condition_variable done_cv;
  bool done = false;
  absl::Status status;
};

}  // namespace

absl::Status WriteWithDeadline(const std::filesystem::path& path, std::string data, absl::Duration timeout) {
  auto state = std::make_shared<WriteState>();
  // The job owns copies of path and data: an abandoned write outlives this frame.
  ProcessWorkerPool().Submit([state, path, data = std::move(data)] {
    absl::Status status = fs::WriteAttribute(path, data);
    std::lock_guard lock(state->mu);
    state->status = std::move(status);
    state->done = true;
    state->done_cv.notify_all();
  });
  std::unique_lock lock(state->mu);
  if (!state->done_cv.wait_for(lock, absl::ToChronoNanoseconds(timeout), [&] { return state->done; })) {
    return absl::DeadlineExceededError(absl::StrCat("write to ", path.string(), " did not return within ",
                                                    absl::FormatDuration(timeout), "; abandoned"));
  }
  return state->status;
}

void RunParallel(size_t count, int parallelism, const std::function<void(size_t)>& task) {
  if (count == 0) return;
  const size_t workers = parallelism <= 0 ? count : std::min(count, static_cast<size_t>(parallelism));
  // Tasks are claimed one at a time, so a slow group does not hold up the rest; RunAlongside returns only
  // after every worker has stopped claiming, so `next` may live on this stack.
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < count; i = next++) task(i);
  };
  ProcessWorkerPool().RunAlongside(workers - 1, work, work);
}

}  // namespace vfio_agent::binding
