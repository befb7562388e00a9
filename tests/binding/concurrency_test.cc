#include "concurrency.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "support/wait.h"
#include "support/sysfs_tree.h"
#include "vfio_gpu_agent/common/fs.h"
#include "vfio_gpu_agent/common/worker_pool.h"

namespace vfio_agent::binding {
namespace {

constexpr auto kGenerous = ::vfio_agent::testing::kGenerousWait;

using ::vfio_agent::testing::WaitUntil;

// Lets the writer blocked in open() of a FIFO with no reader through, and drains what it writes; the read end
// stays open until the bytes arrive so the writer never meets a closed pipe (SIGPIPE).
std::string ReleaseFifo(const std::filesystem::path& fifo, size_t expected_bytes) {
  const int fd = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return "open: " + std::to_string(errno);
  std::string got;
  WaitUntil([&] {
    char buf[64];
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) got.append(buf, static_cast<size_t>(n));
    return got.size() >= expected_bytes;
  });
  ::close(fd);
  return got;
}

// A regular file standing in for a sysfs attribute (WriteAttribute never creates one).
bool CreateAttribute(const std::filesystem::path& path) { return static_cast<bool>(std::ofstream(path) << "(null)\n"); }

TEST(WriteWithDeadlineTest, WriteThatNeverReturnsIsAbandonedAndLaterWritesStillSucceed) {
  testing::TempDir dir;
  const std::filesystem::path stuck = dir.path() / "unbind";
  ASSERT_EQ(::mkfifo(stuck.c_str(), 0600), 0);  // open for write blocks until a reader comes: never, here
  const std::filesystem::path other = dir.path() / "driver_override";
  ASSERT_TRUE(CreateAttribute(other));

  const absl::Duration deadline = absl::Milliseconds(200);
  const auto start = std::chrono::steady_clock::now();
  const absl::Status abandoned = WriteWithDeadline(stuck, "0000:3b:00.0", deadline);
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(abandoned.code(), absl::StatusCode::kDeadlineExceeded) << abandoned;
  EXPECT_THAT(std::string(abandoned.message()), ::testing::HasSubstr(stuck.string()));
  EXPECT_GE(waited, absl::ToChronoNanoseconds(deadline));
  EXPECT_LT(waited, kGenerous);  // the caller was not held until the write returned (it never does)

  // The stuck write holds its worker; this one gets another.
  EXPECT_TRUE(WriteWithDeadline(other, "vfio-pci", absl::Seconds(30)).ok());
  EXPECT_EQ(fs::ReadTrimmed(other).value_or(""), "vfio-pci");

  // The abandoned write still owns what it writes: it completes once the kernel (here, a reader) lets it.
  EXPECT_EQ(ReleaseFifo(stuck, 12), "0000:3b:00.0");
}

TEST(WriteWithDeadlineTest, SequentialWritesReuseOneWorker) {
  testing::TempDir dir;
  const std::filesystem::path path = dir.path() / "bind";
  ASSERT_TRUE(CreateAttribute(path));
  WorkerPool& pool = ProcessWorkerPool();
  const uint64_t started_before = pool.threads_started();
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(WriteWithDeadline(path, "0000:3b:00." + std::to_string(i % 8), absl::Seconds(30)).ok());
    // The worker signals the caller before it is back waiting for the next job; wait for it, so the next
    // write shows reuse rather than a race.
    ASSERT_TRUE(WaitUntil([&] { return pool.waiting_workers() >= 1; }));
  }
  EXPECT_LE(pool.threads_started() - started_before, 1u);
  EXPECT_EQ(fs::ReadTrimmed(path).value_or(""), "0000:3b:00.3");
}

TEST(RunParallelTest, RunsEveryTaskOnceAndAtMostParallelismAtOnce) {
  constexpr size_t kCount = 64;
  std::vector<std::atomic<int>> runs(kCount);
  std::atomic<int> running{0};
  std::atomic<int> most{0};
  RunParallel(kCount, 3, [&](size_t i) {
    const int now = running.fetch_add(1) + 1;
    int seen = most.load();
    while (now > seen && !most.compare_exchange_weak(seen, now)) {
    }
    runs[i].fetch_add(1);
    running.fetch_sub(1);
  });
  for (size_t i = 0; i < kCount; ++i) EXPECT_EQ(runs[i].load(), 1) << "task " << i;
  EXPECT_LE(most.load(), 3);
}

TEST(RunParallelTest, ParallelismZeroRunsAllTasksAtOnce) {
  constexpr size_t kCount = 5;
  // Each task waits for all of them to have started: only all-at-once gets every task past it.
  std::mutex mu;
  std::condition_variable cv;
  size_t arrived = 0;
  std::atomic<int> met{0};
  RunParallel(kCount, 0, [&](size_t) {
    std::unique_lock lock(mu);
    ++arrived;
    cv.notify_all();
    if (cv.wait_for(lock, kGenerous, [&] { return arrived == kCount; })) met.fetch_add(1);
  });
  EXPECT_EQ(met.load(), static_cast<int>(kCount));
}

TEST(RunParallelTest, NoTasksIsANoOp) {
  std::atomic<int> runs{0};
  RunParallel(0, 4, [&](size_t) { runs.fetch_add(1); });
  EXPECT_EQ(runs.load(), 0);
}

}  // namespace
}  // namespace vfio_agent::binding
