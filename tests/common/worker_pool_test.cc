#include "vfio_gpu_agent/common/worker_pool.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "support/wait.h"
#include "vfio_gpu_agent/common/thread_name.h"

namespace vfio_agent {
namespace {

constexpr auto kGenerous = ::vfio_agent::testing::kGenerousWait;

using ::vfio_agent::testing::WaitUntil;

// A gate jobs block on until the test opens it; shared so a job may outlive the test's frame.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  int entered = 0;
  int left = 0;

  void Pass() {
    std::unique_lock lock(mu);
    ++entered;
    cv.notify_all();
    cv.wait(lock, [&] { return open; });
    ++left;
    cv.notify_all();
  }
  void Open() {
    std::lock_guard lock(mu);
    open = true;
    cv.notify_all();
  }
  bool WaitEntered(int n) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, kGenerous, [&] { return entered >= n; });
  }
  bool WaitLeft(int n) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, kGenerous, [&] { return left >= n; });
  }
};

TEST(WorkerPoolTest, SequentialJobsReuseOneWorker) {
  WorkerPool pool(4);
  std::mutex mu;
  std::set<std::thread::id> ids;
  for (int i = 0; i < 20; ++i) {
    auto ran = std::make_shared<std::atomic<bool>>(false);
    pool.Submit([&, ran] {
      {
        std::lock_guard lock(mu);
        ids.insert(std::this_thread::get_id());
      }
      ran->store(true);
    });
    ASSERT_TRUE(WaitUntil([&] { return ran->load() && pool.waiting_workers() == 1; })) << "job " << i;
  }
  EXPECT_EQ(pool.threads_started(), 1u);
  std::lock_guard lock(mu);
  EXPECT_EQ(ids.size(), 1u);
  EXPECT_FALSE(ids.contains(std::this_thread::get_id()));
}

// The soak tells idle workers (kept, up to the cap) from the agent's other threads by this name.
TEST(WorkerPoolTest, WorkersAreNamed) {
  WorkerPool pool(1);
  std::mutex mu;
  std::string name;
  bool ran = false;
  pool.Submit([&] {
    std::lock_guard lock(mu);
    name = ThisThreadName();
    ran = true;
  });
  ASSERT_TRUE(WaitUntil([&] {
    std::lock_guard lock(mu);
    return ran;
  }));
  std::lock_guard lock(mu);
  EXPECT_EQ(name, "va-worker");
}

TEST(WorkerPoolTest, BlockedWorkerDoesNotHoldUpTheNextJob) {
  WorkerPool pool(4);
  auto gate = std::make_shared<Gate>();
  pool.Submit([gate] { gate->Pass(); });
  ASSERT_TRUE(gate->WaitEntered(1));

  auto ran = std::make_shared<std::atomic<bool>>(false);
  pool.Submit([ran] { ran->store(true); });
  EXPECT_TRUE(WaitUntil([&] { return ran->load(); }));
  EXPECT_EQ(pool.threads_started(), 2u);

  gate->Open();
  ASSERT_TRUE(gate->WaitLeft(1));
  // Both workers are idle now and reused: a third job starts no thread.
  ASSERT_TRUE(WaitUntil([&] { return pool.waiting_workers() == 2; }));
  auto third = std::make_shared<std::atomic<bool>>(false);
  pool.Submit([third] { third->store(true); });
  EXPECT_TRUE(WaitUntil([&] { return third->load(); }));
  EXPECT_EQ(pool.threads_started(), 2u);
}

TEST(WorkerPoolTest, IdleWorkersBeyondTheCapExit) {
  WorkerPool pool(1);
  auto gate = std::make_shared<Gate>();
  for (int i = 0; i < 3; ++i) pool.Submit([gate] { gate->Pass(); });
  ASSERT_TRUE(gate->WaitEntered(3));
  EXPECT_EQ(pool.threads_started(), 3u);
  EXPECT_EQ(pool.live_workers(), 3u);
  gate->Open();
  EXPECT_TRUE(WaitUntil([&] { return pool.live_workers() == 1 && pool.waiting_workers() == 1; }));
}

TEST(WorkerPoolTest, DestroyedWhileAJobIsBlockedTheJobStillFinishes) {
  auto gate = std::make_shared<Gate>();
  auto finished = std::make_shared<std::atomic<bool>>(false);
  {
    WorkerPool pool(2);
    pool.Submit([gate, finished] {
      gate->Pass();
      finished->store(true);
    });
    ASSERT_TRUE(gate->WaitEntered(1));
  }
  gate->Open();
  EXPECT_TRUE(WaitUntil([&] { return finished->load(); }));
}

TEST(WorkerPoolTest, RunAlongsideRunsEveryHelperAndTheCallerBeforeReturning) {
  WorkerPool pool(4);
  for (int round = 0; round < 3; ++round) {
    std::atomic<int> helpers_ran{0};
    std::atomic<bool> helper_on_caller{false};
    bool caller_ran = false;
    const std::thread::id caller = std::this_thread::get_id();
    pool.RunAlongside(
        3,
        [&] {
          if (std::this_thread::get_id() == caller) helper_on_caller.store(true);
          helpers_ran.fetch_add(1);
        },
        [&] { caller_ran = true; });
    // Read right after the return: RunAlongside must not return before every helper has run.
    EXPECT_EQ(helpers_ran.load(), 3) << "round " << round;
    EXPECT_TRUE(caller_ran);
    EXPECT_FALSE(helper_on_caller.load());
  }
}

TEST(WorkerPoolTest, RunAlongsideHelpersRunAtTheSameTime) {
  WorkerPool pool(4);
  // Each helper waits for all three to have arrived: only concurrent helpers get past it.
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  bool all_met = true;
  pool.RunAlongside(
      3,
      [&] {
        std::unique_lock lock(mu);
        ++arrived;
        cv.notify_all();
        if (!cv.wait_for(lock, kGenerous, [&] { return arrived == 3; })) all_met = false;
      },
      [] {});
  EXPECT_TRUE(all_met);
  EXPECT_EQ(arrived, 3);
}

}  // namespace
}  // namespace vfio_agent
