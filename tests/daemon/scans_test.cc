// `run` scans sysfs through the process's one node::Source: a pass scans once, and the frontend serves what the pass
// scanned instead of scanning again (issue 31: one scan per pass, one NameResolver and one vGPU catalog a process).
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "passthrough_daemon.h"
#include "run_harness.h"
#include "vfio_gpu_agent/daemon/daemon.h"
#include "vfio_gpu_agent/pci/inventory.h"

namespace vfio_agent::daemon::testing {
namespace {

using plugin::testing::kH200;
using plugin::testing::kH200Gpus;
using plugin::testing::Node;

TEST(RunScansTest, APassScansSysfsOnceAndAReboundGpuIsServedFromThePassesScans) {
  auto created = NodeWithKubelet("hgx-h200-8gpu.json");
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<Node> node = *std::move(created);
  DaemonOptions options = PassthroughDaemonOptions(*node);
  options.resync_interval = std::chrono::hours(1);
  Daemon daemon(options, nullptr);
  ASSERT_TRUE(daemon.Start().ok());
  ASSERT_TRUE(WaitUntil([&] {
    daemon.ReconcileNow();
    return daemon.State().ready;
  })) << daemon.State().message;

  // A pass with nothing to bind: one scan, whatever else runs (a pass the loop started on its own between the two
  // readings would add its own: the condition is waited for, not asserted on the first try).
  uint64_t last = 0;
  EXPECT_TRUE(WaitUntil([&] {
    const uint64_t before = pci::ScansStarted();
    daemon.ReconcileNow();
    last = pci::ScansStarted() - before;
    return last == 1;
  })) << last << " scans in a pass with nothing to do";

  // A GPU knocked off vfio: the loop binds it again and the frontend advertises it from the loop's scan, healthy
  // and allocatable again (readiness asks the kubelet).
  const std::string& bdf = kH200Gpus[3];
  ASSERT_TRUE(node->Control("set-driver " + bdf + " none").ok());
  EXPECT_TRUE(WaitUntil([&] {
    daemon.ReconcileNow();
    return DriverOf(*node, bdf) == "vfio-pci" && daemon.State().ready;
  })) << daemon.State().message;
  daemon.Stop();
}


// What no event reports (a GPU whose config space stops answering: no uevent, no inotify) is found by the
// --rescan-interval scan of the shared source, not only by the next full pass (an hour here): the kubelet sees the
// GPU unhealthy. The frontend rescanned on its own before one node::Source per process; the loop does it now.
TEST(RunScansTest, ADeadConfigSpaceIsFoundByTheRescanIntervalNotTheResync) {
  auto created = NodeWithKubelet("hgx-h200-8gpu.json");
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<Node> node = *std::move(created);
  DaemonOptions options = PassthroughDaemonOptions(*node);
  options.resync_interval = std::chrono::hours(1);
  options.serve.rescan_interval = std::chrono::milliseconds(50);
  Daemon daemon(options, nullptr);
  ASSERT_TRUE(daemon.Start().ok());
  ASSERT_TRUE(node->WaitForCounts(kH200, 8, 8));
  ASSERT_TRUE(node->Control("dead " + kH200Gpus[5] + " 1").ok());
  EXPECT_TRUE(node->WaitForCounts(kH200, 8, 7));
  daemon.Stop();
}

}  // namespace
}  // namespace vfio_agent::daemon::testing
