#include "vfio_gpu_agent/common/worker_pool.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/common/thread_name.h"

namespace vfio_agent {

// Shared by the pool object and every worker, so a worker blocked in a job forever keeps it alive after the
// pool is gone. std::mutex rather than absl::Mutex: ThreadSanitizer sees pthread synchronisation even
// through Debian's uninstrumented libraries.
struct WorkerPool::State {
  explicit State(size_t max_idle) : max_idle(max_idle) {}

  const size_t max_idle;
  std::mutex mu;
  std::condition_variable work_cv;
  // Guarded by mu. Invariant: queue.size() <= waiting, i.e. every queued job has a waiting worker that will
  // take it; Submit starts a new thread instead of queueing when no waiting worker is free.
  std::deque<std::function<void()>> queue;
  size_t waiting = 0;  // workers blocked in work_cv.wait (a notified one counts until it has taken a job)
  size_t live = 0;     // workers started and not yet returned from WorkLoop
  bool stopping = false;
  uint64_t threads_started = 0;
};

void WorkerPool::WorkLoop(const std::shared_ptr<State>& state, std::function<void()> job) {
  NameThisThread("va-worker");
  for (;;) {
    job();
    job = nullptr;  // the job's captures are released outside the lock
    std::unique_lock lock(state->mu);
    if (state->stopping || state->waiting >= state->max_idle) {
      --state->live;
      return;
    }
    ++state->waiting;
    state->work_cv.wait(lock, [&] { return !state->queue.empty() || state->stopping; });
    --state->waiting;
    if (state->queue.empty()) {  // stopping, and nothing left that was meant for this worker
      --state->live;
      return;
    }
    job = std::move(state->queue.front());
    state->queue.pop_front();
  }
}

WorkerPool::WorkerPool(size_t max_idle_workers) : state_(std::make_shared<State>(max_idle_workers)) {}

WorkerPool::~WorkerPool() {
  std::lock_guard lock(state_->mu);
  state_->stopping = true;
  state_->work_cv.notify_all();
}

void WorkerPool::Submit(std::function<void()> job) {
  {
    std::lock_guard lock(state_->mu);
    if (state_->waiting > state_->queue.size()) {
      state_->queue.push_back(std::move(job));
      // Under the lock: each notify_one wakes a worker still blocked in wait, a distinct one per job.
      state_->work_cv.notify_one();
      return;
    }
    ++state_->live;  // counted before the thread runs, so live_workers() never misses a starting worker
    ++state_->threads_started;
  }
  // Every worker is busy (or blocked for good): a new one takes this job directly, never the queue, so the
  // queue invariant holds and the job cannot wait behind a stuck write.
  try {
    std::thread(WorkLoop, state_, std::move(job)).detach();
  } catch (const std::system_error& e) {  // nothing to undo: the process ends here
    // Out of threads (RLIMIT_NPROC, memory). The job went down with the failed std::thread, and running a
    // write here could block the caller past its deadline anyway; the DaemonSet restarts the agent.
    spdlog::critical("cannot start a worker thread: {}", e.what());
    std::terminate();
  }
}

void WorkerPool::RunAlongside(size_t helpers, absl::FunctionRef<void()> helper_work,
                              absl::FunctionRef<void()> caller_work) {
  // Lives on the caller's stack; the helpers touch it last under `mu`, and the caller returns only after it
  // has taken `mu` and seen the count reach zero, i.e. after the last helper has released `mu`.
  struct Pending {
    absl::FunctionRef<void()> work;
    std::mutex mu;
    std::condition_variable all_done;
    size_t running;
  } pending{helper_work, {}, {}, helpers};
  for (size_t h = 0; h < helpers; ++h) {
    Submit([p = &pending] {
      p->work();
      std::lock_guard lock(p->mu);
      if (--p->running == 0) p->all_done.notify_one();
    });
  }
  caller_work();
  std::unique_lock lock(pending.mu);
  pending.all_done.wait(lock, [&] { return pending.running == 0; });
}

uint64_t WorkerPool::threads_started() const {
  std::lock_guard lock(state_->mu);
  return state_->threads_started;
}

size_t WorkerPool::live_workers() const {
  std::lock_guard lock(state_->mu);
  return state_->live;
}

size_t WorkerPool::waiting_workers() const {
  std::lock_guard lock(state_->mu);
  return state_->waiting;
}

WorkerPool& ProcessWorkerPool() {
  // As many waiting workers as cores (4 to 8) cover a scan's helpers (one fewer than the cores, at most
  // seven) and the daemon's steady state (one bind and its writes at a time) without reading as a thread
  // leak; a first bind pass over every group starts more, which exit once idle. Leaked on purpose (see the
  // header).
  static WorkerPool* const pool = new WorkerPool(ProcessWorkerPoolIdleCap());
  return *pool;
}

size_t ProcessWorkerPoolIdleCap() { return std::clamp(std::thread::hardware_concurrency(), 4u, 8u); }

}  // namespace vfio_agent
