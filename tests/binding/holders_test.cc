#include "vfio_gpu_agent/binding/holders.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "concurrency.h"
#include "support/holding_process.h"
#include "support/sysfs_tree.h"

namespace vfio_agent::binding {
namespace {

namespace stdfs = std::filesystem;
using ::testing::AllOf;
using ::testing::Contains;
using ::testing::Field;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

void WriteFile(const stdfs::path& path, const std::string& content) {
  stdfs::create_directories(path.parent_path());
  std::ofstream(path) << content;
}

// A fake /proc entry: comm plus fd links to the given targets.
void FakeProcess(const stdfs::path& proc, int pid, const std::string& comm, const std::vector<stdfs::path>& open) {
  const stdfs::path dir = proc / std::to_string(pid);
  WriteFile(dir / "comm", comm + "\n");
  stdfs::create_directories(dir / "fd");
  int fd = 3;
  for (const stdfs::path& target : open) stdfs::create_symlink(target, dir / "fd" / std::to_string(fd++));
}

TEST(HoldersTest, NvidiaHoldersFromFakeProcAndModules) {
  vfio_agent::testing::TempDir tmp;
  HostPaths paths{.sysfs_root = tmp.path() / "sys", .dev_root = tmp.path() / "dev", .proc_root = tmp.path() / "proc"};
  FakeProcess(paths.proc_root, 4242, "nvidia-persiste", {paths.dev_root / "nvidiactl", paths.dev_root / "nvidia0"});
  FakeProcess(paths.proc_root, 77, "bash", {"/dev/pts/0"});
  FakeProcess(paths.proc_root, 99, "dcgm-exporter", {});
  WriteFile(paths.sysfs_root / "module/nvidia/refcnt", "3\n");
  stdfs::create_directories(paths.sysfs_root / "module/nvidia/holders/nvidia_uvm");
  WriteFile(paths.sysfs_root / "module/nvidia_drm/refcnt", "0\n");
  WriteFile(paths.sysfs_root / "module/i40e/refcnt", "5\n");

  std::vector<Holder> holders = NvidiaHolders(paths);
  EXPECT_THAT(holders, Contains(AllOf(Field(&Holder::pid, 4242), Field(&Holder::comm, "nvidia-persiste"),
                                      Field(&Holder::what, HasSubstr("/nvidia0 open")))));
  EXPECT_THAT(holders, Contains(AllOf(Field(&Holder::pid, 4242), Field(&Holder::what, "known GPU daemon"))));
  EXPECT_THAT(holders, Contains(AllOf(Field(&Holder::pid, 99), Field(&Holder::what, "known GPU daemon"))));
  EXPECT_THAT(holders, Contains(AllOf(Field(&Holder::pid, 0), Field(&Holder::comm, "nvidia"),
                                      Field(&Holder::what, "module refcnt 3 (used by nvidia_uvm)"))));
  for (const Holder& holder : holders) {
    EXPECT_NE(holder.pid, 77);
    EXPECT_NE(holder.comm, "nvidia_drm");  // refcnt 0 holds nothing
    EXPECT_NE(holder.comm, "i40e");
  }
  EXPECT_EQ((Holder{.pid = 4242, .comm = "x", .what = "y"}.ToString()), "pid 4242 (x): y");
}

// A proc root is read as found: a digit name too large for a pid, a process without fd or comm, an fd that
// is not a link. None of it may throw out of the scan; the real holder is still found.
TEST(HoldersTest, OddProcEntriesAreSkippedNotThrown) {
  vfio_agent::testing::TempDir tmp;
  HostPaths paths{.sysfs_root = tmp.path() / "sys", .dev_root = tmp.path() / "dev", .proc_root = tmp.path() / "proc"};
  FakeProcess(paths.proc_root, 4242, "qemu", {paths.dev_root / "nvidia0"});
  stdfs::create_directories(paths.proc_root / "99999999999" / "fd");
  stdfs::create_directories(paths.proc_root / "77");
  WriteFile(paths.proc_root / "88" / "fd" / "3", "not a link");
  std::vector<Holder> holders;
  EXPECT_NO_THROW(holders = NvidiaHolders(paths));
  EXPECT_THAT(holders, Contains(Field(&Holder::pid, 4242)));
  EXPECT_EQ(holders.size(), 1u);
}

TEST(HoldersTest, VfioGroupOpenerIsARealProcess) {
  vfio_agent::testing::TempDir tmp;
  HostPaths paths{.dev_root = tmp.path() / "dev", .proc_root = "/proc"};
  WriteFile(paths.dev_root / "vfio/33", "");
  WriteFile(paths.dev_root / "vfio/77", "");
  EXPECT_THAT(VfioGroupOpeners(paths, 33), IsEmpty());
  vfio_agent::testing::HoldingProcess vm(paths.dev_root / "vfio/33");
  EXPECT_THAT(VfioGroupOpeners(paths, 33), Contains(Field(&Holder::pid, vm.pid())));
  EXPECT_THAT(VfioGroupOpeners(paths, 77), IsEmpty());
}

TEST(ConcurrencyTest, BlockedWriteIsAbandonedAtTheDeadline) {
  vfio_agent::testing::TempDir tmp;
  const stdfs::path fifo = tmp.path() / "blocked";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);  // opening a FIFO for writing blocks until a reader comes
  // The write can never complete while no reader exists, so the deadline is certainly hit; how much later
  // than the deadline the call returns depends on the machine's load and is not asserted (a hang would be
  // ended by ctest's timeout).
  const auto start = std::chrono::steady_clock::now();
  absl::Status status = WriteWithDeadline(fifo, "0000:3b:00.0", absl::Milliseconds(200));
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_TRUE(absl::IsDeadlineExceeded(status)) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(fifo.string()));
  EXPECT_GE(waited, std::chrono::milliseconds(200));
  // Let the abandoned writer finish so it does not outlive the temp dir.
  const int reader = open(fifo.c_str(), O_RDONLY);
  ASSERT_GE(reader, 0);
  char buf[64];
  EXPECT_GT(read(reader, buf, sizeof(buf)), 0);
  close(reader);
}

TEST(ConcurrencyTest, WriteErrorIsReturned) {
  vfio_agent::testing::TempDir tmp;
  absl::Status status = WriteWithDeadline(tmp.path() / "missing/attr", "x", absl::Seconds(1));
  EXPECT_FALSE(status.ok());
  EXPECT_FALSE(absl::IsDeadlineExceeded(status));
}

// The first three tasks wait for each other, so the test needs three workers running at once however the
// scheduler orders them: it cannot pass on a serial pool, and never depends on how quickly threads start.
TEST(ConcurrencyTest, RunParallelRunsEveryTaskOnceWithinTheLimit) {
  constexpr int kLimit = 3;
  std::vector<int> runs(20, 0);
  std::mutex mu;
  std::condition_variable cv;
  int running = 0, peak = 0, met = 0;
  bool all_met = true;
  RunParallel(runs.size(), kLimit, [&](size_t i) {
    std::unique_lock lock(mu);
    peak = std::max(peak, ++running);
    if (i < kLimit) {
      ++met;
      cv.notify_all();
      // Generous: only a pool that never runs three at once waits this long (and then fails below).
      all_met &= cv.wait_for(lock, std::chrono::seconds(30), [&] { return met == kLimit; });
    }
    ++runs[i];
    --running;
  });
  EXPECT_THAT(runs, ::testing::Each(1));
  EXPECT_TRUE(all_met) << "three tasks never ran at once";
  EXPECT_EQ(peak, kLimit);
}

}  // namespace
}  // namespace vfio_agent::binding
