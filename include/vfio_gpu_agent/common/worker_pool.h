// Long-lived worker threads for the agent's short jobs (sysfs scan helpers, bind workers, deadline-bounded
// sysfs writes). A job never waits for a busy worker: an idle worker takes it, or a new worker is started
// when every worker is busy, including workers the kernel keeps blocked in a write forever. Starting a
// thread per job cost the daemon 120-170 thread creations a second under churn (bench_daemon
// RssAfterChurn); with reused workers it starts none once warm.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "absl/functional/function_ref.h"

namespace vfio_agent {

class WorkerPool {
 public:
  // At most `max_idle_workers` workers wait for work; a worker that finishes a job while that many are
  // already waiting exits.
  explicit WorkerPool(size_t max_idle_workers);
  // Does not wait for running jobs: waiting workers exit, busy ones exit after their job. The workers share
  // the pool's state, so destroying the pool while a job is stuck is safe.
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Runs `job` on a worker and returns at once. `job` must not throw.
  void Submit(std::function<void()> job);

  // Runs `helper_work` on `helpers` workers while the calling thread runs `caller_work`, and returns when
  // all of them have returned, so both may use the caller's stack. Neither may throw.
  void RunAlongside(size_t helpers, absl::FunctionRef<void()> helper_work, absl::FunctionRef<void()> caller_work);

  // For tests: threads started since construction, workers alive (busy or waiting), workers waiting.
  uint64_t threads_started() const;
  size_t live_workers() const;
  size_t waiting_workers() const;

 private:
  struct State;
  static void WorkLoop(const std::shared_ptr<State>& state, std::function<void()> job);
  std::shared_ptr<State> state_;
};

// The process's pool, shared by the scan, the binder and its sysfs writes. Never destroyed: a write the
// kernel blocks forever keeps its worker, and exit() must neither join it nor free what it uses.
WorkerPool& ProcessWorkerPool();

// How many idle workers the process's pool keeps: the cores, 4 to 8.
size_t ProcessWorkerPoolIdleCap();

}  // namespace vfio_agent
