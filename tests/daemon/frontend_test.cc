// `run`'s daemon against a fake node::Frontend (DaemonOptions::make_frontend) on a plain sysfs tree: the daemon holds
// one frontend and its readiness, binds and start and stop go through the interface, whichever frontend it is.
#include <fstream>
#include <memory>
#include <mutex>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "support/sysfs_tree.h"
#include "vfio_gpu_agent/daemon/daemon.h"
#include "vfio_gpu_agent/node/frontend.h"

namespace vfio_agent::daemon {
namespace {

using ::testing::ElementsAre;
using ::testing::Field;

constexpr char kGpu[] = "0000:3b:00.0";

// What the fake answers and what it was asked, shared between the test and the frontend the daemon owns (the fake is
// called on the daemon's reconcile thread).
struct FakeState {
  std::mutex mu;
  node::FrontendReadiness answer;
  bool binds_on_demand = false;
  int made = 0, starts = 0, stops = 0;
  std::vector<node::ReadinessQuery> queries;
};

class FakeFrontend final : public node::Frontend {
 public:
  explicit FakeFrontend(std::shared_ptr<FakeState> state) : state_(std::move(state)) {}

  absl::Status Start() override {
    std::lock_guard lock(state_->mu);
    ++state_->starts;
    return absl::OkStatus();
  }
  void Stop() override {
    std::lock_guard lock(state_->mu);
    ++state_->stops;
  }
  node::FrontendReadiness Readiness(const node::ReadinessQuery& query) override {
    std::lock_guard lock(state_->mu);
    state_->queries.push_back(query);
    return state_->answer;
  }
  node::ServedDevices Served(const node::ServedDevices& expected) const override { return expected; }
  bool BindsOnDemand() const override {
    std::lock_guard lock(state_->mu);
    return state_->binds_on_demand;
  }
  absl::Status Supports(Workload) const override { return absl::OkStatus(); }
  std::optional<std::string> LiveSwitchRefusal(Workload) const override { return std::nullopt; }
  absl::StatusOr<std::map<std::string, std::string>> HeldVgpus() const override {
    return std::map<std::string, std::string>{};
  }
  bool FollowsKubevirtRelease() const override { return false; }
  void SetKubevirtRelease(const std::optional<kube::KubevirtRelease>&) override {}
  std::optional<fabric::FabricStatus> Fabric() const override { return std::nullopt; }

 private:
  std::shared_ptr<FakeState> state_;
};

class DaemonFrontendTest : public ::testing::Test {
 protected:
  DaemonFrontendTest() : tree_(dir_.path() / "sys") {
    options_.serve.paths.sysfs_root = tree_.root();
    options_.serve.paths.dev_root = dir_.path() / "dev";
    options_.serve.paths.kubelet_dir = dir_.path() / "kubelet";
    options_.serve.paths.pod_resources_socket = dir_.path() / "pod-resources" / "kubelet.sock";  // none
    options_.serve.udev = false;
    options_.bind.paths = options_.serve.paths;
    options_.bind.targets = binding::Targets::EverySelected();
    options_.health_port = 0;
    options_.metrics_port = 0;
    options_.make_frontend = [state = state_](Workload) {
      {
        std::lock_guard lock(state->mu);
        ++state->made;
      }
      return std::make_unique<FakeFrontend>(state);
    };
    std::filesystem::create_directories(options_.serve.paths.dev_root / "vfio");
    std::filesystem::create_directories(options_.serve.paths.kubelet_dir);
  }

  void Answer(node::FrontendReadiness answer) {
    std::lock_guard lock(state_->mu);
    state_->answer = std::move(answer);
  }

  testing::TempDir dir_;
  testing::SysfsTree tree_;
  std::shared_ptr<FakeState> state_ = std::make_shared<FakeState>();
  DaemonOptions options_;
};

TEST_F(DaemonFrontendTest, ReadinessIsTheFrontendsAnswerAfterTheHostsChecks) {
  tree_.AddDevice({.bdf = kGpu, .driver = "vfio-pci", .iommu_group = 12});
  std::ofstream(options_.serve.paths.dev_root / "vfio" / "12") << "";
  Answer({.failing = node::FrontendCheck{.id = "fake.registered", .reason = "NotRegistered",
                                         .message = "fake.registered: the kubelet has not called"}});
  Daemon daemon(options_, nullptr);
  ASSERT_TRUE(daemon.Start().ok());

  // The first pass: the GPU is bound, so the frontend's side decides, in the frontend's words.
  Readiness readiness = daemon.State();
  EXPECT_FALSE(readiness.ready);
  EXPECT_EQ(readiness.check_id, "fake.registered");
  EXPECT_EQ(readiness.reason, "NotRegistered");
  EXPECT_EQ(readiness.message, "fake.registered: the kubelet has not called");
  {
    std::lock_guard lock(state_->mu);
    EXPECT_EQ(state_->made, 1);
    EXPECT_EQ(state_->starts, 1);  // started by the first pass, before it is asked
    ASSERT_FALSE(state_->queries.empty());
    const node::ReadinessQuery& query = state_->queries.back();
    EXPECT_FALSE(query.vgpus);
    EXPECT_THAT(query.required, ElementsAre(kGpu));
    // The daemon's own scan: what it expects the frontend to serve.
    EXPECT_THAT(query.expected, ElementsAre(AllOf(Field(&node::ServedDevice::id, kGpu),
                                                  Field(&node::ServedDevice::resource_name,
                                                        "nvidia.com/GH100_H200_SXM_141GB"),
                                                  Field(&node::ServedDevice::healthy, true))));
  }

  // The frontend now answers that all holds (and the kubelet holds no allocatable set of it): ready.
  Answer({});
  daemon.ReconcileNow();
  readiness = daemon.State();
  EXPECT_TRUE(readiness.ready) << readiness.message;
  EXPECT_EQ(readiness.reason, "AllDevicesReady");
  EXPECT_EQ(readiness.message, "1 GPUs bound, healthy, registered and allocatable: 0000:3b:00.0");

  daemon.Stop();
  std::lock_guard lock(state_->mu);
  EXPECT_EQ(state_->starts, 1);
  EXPECT_EQ(state_->stops, 1);
}

TEST_F(DaemonFrontendTest, AFrontendThatBindsOnDemandLeavesTheGpusOnTheirHostDrivers) {
  tree_.AddDevice({.bdf = kGpu, .driver = "nvidia", .iommu_group = 12});
  state_->binds_on_demand = true;
  Answer({.failing = node::FrontendCheck{.id = "fake.published", .reason = "DeviceNotAdvertised",
                                         .message = "fake.published: not yet"}});
  Daemon daemon(options_, nullptr);
  ASSERT_TRUE(daemon.Start().ok());

  // Not devices.bound: the GPU on nvidia is the frontend's to bind when a claim needs it, and nothing moved it.
  const Readiness readiness = daemon.State();
  EXPECT_EQ(readiness.check_id, "fake.published") << readiness.message;
  EXPECT_EQ(std::filesystem::read_symlink(tree_.root() / "bus/pci/devices" / kGpu / "driver").filename(), "nvidia");
  std::lock_guard lock(state_->mu);
  ASSERT_FALSE(state_->queries.empty());
  EXPECT_THAT(state_->queries.back().required, ElementsAre(kGpu));
}

TEST_F(DaemonFrontendTest, AVgpuNodeWithNothingServedIsReadyInTheFrontendsWords) {
  options_.serve.workload = Workload::kVmVgpu;
  Answer({.nothing_served = true, .summary = "no vGPU on this node (none created yet); nothing to fake"});
  Daemon daemon(options_, nullptr);
  ASSERT_TRUE(daemon.Start().ok());

  const Readiness readiness = daemon.State();
  EXPECT_TRUE(readiness.ready);
  EXPECT_EQ(readiness.reason, "NoSelectedDevices");
  EXPECT_EQ(readiness.message, "no vGPU on this node (none created yet); nothing to fake");
  std::lock_guard lock(state_->mu);
  ASSERT_FALSE(state_->queries.empty());
  EXPECT_TRUE(state_->queries.back().vgpus);
  EXPECT_TRUE(state_->queries.back().required.empty());
}

}  // namespace
}  // namespace vfio_agent::daemon
