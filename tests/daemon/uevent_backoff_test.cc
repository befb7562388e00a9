// The per-device backoff of the reconcile loop and what resets it: a uevent for that device. The simulated
// sysfs raises no uevents, so the test feeds the Daemon's uevent source itself, through a pipe.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "passthrough_daemon.h"
#include "run_harness.h"
#include "vfio_gpu_agent/daemon/daemon.h"

namespace vfio_agent::daemon::testing {
namespace {

using plugin::testing::kH200Gpus;
using plugin::testing::Node;
using ::testing::HasSubstr;

// The test's end of the seam: Send(bdf) writes a line to a pipe whose read end is the Daemon's UeventSource;
// drained() counts the BDFs the loop has taken out.
class UeventFeed {
 public:
  UeventFeed() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) == 0) {
      read_fd_ = fds[0];
      write_fd_ = fds[1];
    }
  }
  ~UeventFeed() {
    if (write_fd_ >= 0) ::close(write_fd_);
  }
  UeventFeed(const UeventFeed&) = delete;
  UeventFeed& operator=(const UeventFeed&) = delete;

  bool ok() const { return write_fd_ >= 0; }
  // The read end, once; the Daemon owns it from then on.
  std::unique_ptr<UeventSource> Source() {
    auto source = std::make_unique<PipeSource>(read_fd_, drained_);
    read_fd_ = -1;
    return source;
  }
  bool Send(const std::string& bdf) {
    const std::string line = bdf + "\n";
    return ::write(write_fd_, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  }
  int drained() const { return drained_->load(); }

 private:
  class PipeSource final : public UeventSource {
   public:
    PipeSource(int fd, std::shared_ptr<std::atomic<int>> drained) : fd_(fd), drained_(std::move(drained)) {}
    ~PipeSource() override { ::close(fd_); }
    int fd() const override { return fd_; }
    bool Drain(std::vector<std::string>* bdfs) override {
      bool any = false;
      char buffer[512];
      for (ssize_t n; (n = ::read(fd_, buffer, sizeof buffer)) > 0;) partial_.append(buffer, static_cast<size_t>(n));
      for (size_t end; (end = partial_.find('\n')) != std::string::npos;) {
        bdfs->push_back(partial_.substr(0, end));
        partial_.erase(0, end + 1);
        drained_->fetch_add(1);
        any = true;
      }
      return any;
    }

   private:
    const int fd_;
    const std::shared_ptr<std::atomic<int>> drained_;
    std::string partial_;
  };

  int read_fd_ = -1, write_fd_ = -1;
  std::shared_ptr<std::atomic<int>> drained_ = std::make_shared<std::atomic<int>>(0);
};

// A GPU whose bind fails backs off for an hour (first_backoff), so once its fault is cleared only a uevent
// for it can explain a retry; passes for any other reason, and a uevent for another device, leave it alone.
TEST(UeventBackoffTest, UeventForTheDeviceRetriesItAtOnceAndOneForAnotherDoesNot) {
  constexpr char kFaulty[] = "0000:18:00.0";
  constexpr char kOther[] = "0000:2a:00.0";
  auto created = NodeWithKubelet("hgx-h200-8gpu.json");
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<Node> node = *std::move(created);
  ASSERT_TRUE(node->Control(std::string("bind-errno ") + kFaulty + " EIO").ok());

  // Every other GPU's bind must meet its deadlines on a loaded machine: a miss would back it off for the hour.
  DaemonOptions options = PassthroughDaemonOptions(*node);
  options.first_backoff = std::chrono::hours(1);
  UeventFeed feed;
  ASSERT_TRUE(feed.ok()) << "pipe2: " << std::strerror(errno);
  Daemon daemon(options, nullptr, feed.Source());
  ASSERT_TRUE(daemon.Start().ok());

  // The first pass tried it and it failed: not ready on it, every other GPU bound.
  for (const std::string& bdf : kH200Gpus) {
    if (bdf != kFaulty) {
      EXPECT_EQ(DriverOf(*node, bdf), "vfio-pci") << bdf;
    }
  }
  ASSERT_NE(DriverOf(*node, kFaulty), "vfio-pci");
  Readiness state = daemon.State();
  EXPECT_EQ(state.check_id, "devices.bound");
  EXPECT_THAT(state.message, HasSubstr(kFaulty));

  ASSERT_TRUE(node->Control(std::string("bind-errno ") + kFaulty + " 0").ok());
  // A pass with no news about it keeps the backoff.
  daemon.ReconcileNow();
  EXPECT_NE(DriverOf(*node, kFaulty), "vfio-pci") << "retried before its backoff expired, without a uevent";

  // A uevent for another device: the loop takes it out, and a pass that starts after that leaves the
  // faulty GPU alone (a pass binds synchronously, so a retry would have bound it by now).
  ASSERT_TRUE(feed.Send(kOther));
  ASSERT_TRUE(WaitUntil([&] { return feed.drained() == 1; }));
  daemon.ReconcileNow();
  EXPECT_NE(DriverOf(*node, kFaulty), "vfio-pci") << "a uevent for " << kOther << " retried " << kFaulty;
  EXPECT_EQ(daemon.State().check_id, "devices.bound");

  // A uevent for the device itself: retried at once and bound, the node ready.
  ASSERT_TRUE(feed.Send(kFaulty));
  EXPECT_TRUE(WaitUntil([&] { return DriverOf(*node, kFaulty) == "vfio-pci"; }));
  EXPECT_EQ(feed.drained(), 2);
  EXPECT_TRUE(WaitUntil([&] {
    daemon.ReconcileNow();
    return daemon.State().ready;
  })) << daemon.State().message;
  daemon.Stop();
}

}  // namespace
}  // namespace vfio_agent::daemon::testing
