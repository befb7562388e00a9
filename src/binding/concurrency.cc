#include "concurrency.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "vfio_gpu_agent/common/fs.h"

namespace vfio_agent::binding {
namespace {

// Shared between the caller and the writer thread; whichever finishes last frees it. std::mutex rather than
// absl::Mutex: ThreadSanitizer sees pthread synchronisation even through Debian's uninstrumented libraries.
struct WriteState {
  std::mutex mu;
  std::condition_variable done_cv;
  bool done = false;
  absl::Status status;
};

}  // namespace

absl::Status WriteWithDeadline(const std::filesystem::path& path, std::string data, absl::Duration timeout) {
  auto state = std::make_shared<WriteState>();
  std::thread([state, path, data = std::move(data)] {
    absl::Status status = fs::WriteAttribute(path, data);
    std::lock_guard lock(state->mu);
    state->status = std::move(status);
    state->done = true;
    state->done_cv.notify_all();
  }).detach();
  std::unique_lock lock(state->mu);
  if (!state->done_cv.wait_for(lock, absl::ToChronoNanoseconds(timeout), [&] { return state->done; })) {
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
