#include "concurrency.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "vfio_gpu_agent/common/fs.h"

namespace vfio_agent::binding {
namespace {

// Shared between the caller and the writer thread; whichever finishes last frees it.
struct WriteState {
  absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::Status status ABSL_GUARDED_BY(mu);
};

}  // namespace

absl::Status WriteWithDeadline(const std::filesystem::path& path, std::string data, absl::Duration timeout) {
  auto state = std::make_shared<WriteState>();
  std::thread([state, path, data = std::move(data)] {
    absl::Status status = fs::WriteAttribute(path, data);
    absl::MutexLock lock(&state->mu);
    state->status = std::move(status);
    state->done = true;
  }).detach();
  absl::MutexLock lock(&state->mu);
  if (!state->mu.AwaitWithTimeout(absl::Condition(&state->done), timeout)) {
    return absl::DeadlineExceededError(absl::StrCat("write to ", path.string(), " did not return within ",
                                                    absl::FormatDuration(timeout), "; abandoned"));
  }
  return state->status;
}

void RunParallel(size_t count, int parallelism, const std::function<void(size_t)>& task) {
  const size_t workers = parallelism <= 0 ? count : std::min(count, static_cast<size_t>(parallelism));
  std::atomic<size_t> next{0};
  std::vector<std::thread> threads;
  threads.reserve(workers);
  for (size_t w = 0; w < workers; ++w) {
    threads.emplace_back([&] {
      for (size_t i = next++; i < count; i = next++) task(i);
    });
  }
  for (std::thread& thread : threads) thread.join();
}

}  // namespace vfio_agent::binding
