// Shared-NVSwitch mode end to end: the agent on the simulated HGX H200 node, the kubelet simulator admitting
// pods through GetPreferredAllocation and Allocate (and answering pod-resources), and the fake libnvfm.
#include <set>

#include "fabric_fixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plugin_harness.h"
#include "support/fuse.h"
#include "vfio_gpu_agent/fabric/nvfm_api.h"

namespace vfio_agent::plugin::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using vfio_agent::testing::FakeFmState;
using vfio_agent::testing::Module;
using vfio_agent::testing::PartitionOf;
using vfio_agent::testing::UpdateFakeFm;

class FabricIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!vfio_agent::testing::FuseAvailable()) GTEST_SKIP() << vfio_agent::testing::kNeedsFuse;
    auto node = Node::Create("hgx-h200-8gpu.json");
    ASSERT_TRUE(node.ok()) << node.status();
    node_ = *std::move(node);
    ASSERT_TRUE(node_->BindToVfio(kH200Gpus).ok());
    fm_ = vfio_agent::testing::MakeFakeFm(node_->kubelet_dir().parent_path() / "fm");
    node_->options.fabric.address = "unix:" + fm_.string();
    node_->options.fabric_library = FAKE_NVFM_LIBRARY;
    node_->options.fabric_interval = std::chrono::milliseconds(50);
    // Only the kubelet's moment between our Allocate answer and its record needs covering.
    node_->options.fabric.activation_grace = std::chrono::milliseconds(1000);
    node_->options.paths.pod_resources_socket = node_->kubelet_dir().parent_path() / "pod-resources.sock";
  }
  void Start() {
    ASSERT_TRUE(node_->StartKubelet({.pod_resources_socket = node_->options.paths.pod_resources_socket}).ok());
    ASSERT_TRUE(node_->StartAgent().ok());
  }
  FakeFmState Fm() const { return vfio_agent::testing::SnapshotFakeFm(fm_); }
  bool FmActive(const std::set<uint32_t>& active) const {
    return WaitUntil([&] { return Fm().active == active; });
  }
  std::vector<std::string> Admit(const std::string& name, int gpus) {
    absl::StatusOr<kubeletsim::AdmittedPod> pod = node_->kubelet().Admit({.name = name, .limits = {{kH200, gpus}}});
    EXPECT_TRUE(pod.ok()) << name << ": " << pod.status();
    return pod.ok() ? pod->devices[kH200] : std::vector<std::string>{};
  }

  std::unique_ptr<Node> node_;
  std::filesystem::path fm_;
};

TEST_F(FabricIntegrationTest, PodsOfOneTwoFourAndEightGpusEachGetAWholePartitionReleasedWhenTheyEnd) {
  Start();
  ASSERT_TRUE(node_->WaitForCounts(kH200, 8, 8));
  EXPECT_EQ(PartitionOf(Admit("vm8", 8)), 0);
  EXPECT_THAT(Fm().active, ElementsAre(0));
  node_->kubelet().Release("vm8");
  ASSERT_TRUE(FmActive({}));

  const int four = PartitionOf(Admit("vm4", 4));
  const int two = PartitionOf(Admit("vm2", 2));
  const int one = PartitionOf(Admit("vm1", 1));
  ASSERT_TRUE(four == 1 || four == 2) << four;
  ASSERT_GE(two, 3);
  ASSERT_LE(two, 6);
  ASSERT_GE(one, 7);
  // The pair and the singles come out of the 4 the first pod left: the 2 breaks no more free 4s than it must,
  // the 1s no free pair.
  std::set<uint32_t> expected = {static_cast<uint32_t>(four), static_cast<uint32_t>(two), static_cast<uint32_t>(one)};
  EXPECT_EQ(Fm().active, expected);
  const int rest = PartitionOf(Admit("vm1b", 1));
  EXPECT_GE(rest, 7);
  expected.insert(static_cast<uint32_t>(rest));
  EXPECT_EQ(Fm().active, expected);

  for (const char* pod : {"vm4", "vm2", "vm1", "vm1b"}) node_->kubelet().Release(pod);
  ASSERT_TRUE(FmActive({}));
  EXPECT_EQ(Fm().counts["deactivate"], 5);
}

// The fake's restart is FM's resiliency restart (FABRIC_MODE_RESTART=1): every read is refused until FM is told, so
// the agent tells first, from the table it kept, and the GPUs come back.
TEST_F(FabricIntegrationTest, AnFmRestartMidRunIsToldTheActivePartitionAndTheVmKeepsIt) {
  Start();
  ASSERT_TRUE(node_->WaitForCounts(kH200, 8, 8));
  const int two = PartitionOf(Admit("vm2", 2));
  ASSERT_GE(two, 3);
  vfio_agent::testing::RestartFakeFm(fm_);
  ASSERT_TRUE(WaitUntil([&] { return Fm().told_any; }));
  EXPECT_THAT(Fm().told, ElementsAre(two));
  EXPECT_THAT(Fm().active, ElementsAre(two));
  EXPECT_FALSE(Fm().dead);
  EXPECT_TRUE(node_->WaitForCounts(kH200, 8, 8));
  ASSERT_TRUE(node_->agent().Fabric());
  EXPECT_EQ(node_->agent().Fabric()->reconnects, 1);
  node_->kubelet().Release("vm2");
  ASSERT_TRUE(FmActive({}));
}

TEST_F(FabricIntegrationTest, GpusStayUnhealthyUntilFmIsReadyAndFollowItsState) {
  UpdateFakeFm(fm_, [](FakeFmState& state) { state.mode = "not-configured"; });
  Start();
  ASSERT_TRUE(node_->WaitForCounts(kH200, 8, 0));
  EXPECT_THAT(node_->agent().Snapshot().resources.at(kH200).devices.at(0).unhealthy_reason,
              HasSubstr("FM_ST_NOT_CONFIGURED"));
  UpdateFakeFm(fm_, [](FakeFmState& state) { state.mode = "shared"; });
  ASSERT_TRUE(node_->WaitForCounts(kH200, 8, 8));
  // A partition FM no longer supports takes its GPU out.
  UpdateFakeFm(fm_, [](FakeFmState& state) { state.mode = "not-supported"; });
  ASSERT_TRUE(node_->WaitForCounts(kH200, 8, 0));
}

TEST_F(FabricIntegrationTest, AllocateOfGpusThatAreNoPartitionIsRefusedNamingThePartitions) {
  Start();
  ASSERT_TRUE(node_->WaitForCounts(kH200, 8, 8));
  auto stub = node_->DialPlugin(kH200);
  ::v1beta1::AllocateRequest request;
  auto* container = request.add_container_requests();
  container->add_devices_ids(Module(2));
  container->add_devices_ids(Module(3));
  ::v1beta1::AllocateResponse response;
  grpc::ClientContext context;
  const grpc::Status status = stub->Allocate(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("is no Fabric Manager partition"));
  EXPECT_THAT(status.error_message(), HasSubstr("partitions of 2 GPUs: P3"));
  EXPECT_THAT(Fm().active, IsEmpty());
}

TEST_F(FabricIntegrationTest, AnActivationFailureFailsTheAdmissionWithFmsStatus) {
  UpdateFakeFm(fm_, [](FakeFmState& state) {
    for (uint32_t id = 3; id <= 6; ++id) state.fail[id] = vfio_agent::fabric::nvfm::kNvlinkError;
  });
  Start();
  ASSERT_TRUE(node_->WaitForCounts(kH200, 8, 8));
  absl::StatusOr<kubeletsim::AdmittedPod> pod = node_->kubelet().Admit({.name = "vm2", .limits = {{kH200, 2}}});
  ASSERT_FALSE(pod.ok());
  EXPECT_THAT(pod.status().message(), HasSubstr("FM_ST_NVLINK_ERROR"));
}

}  // namespace
}  // namespace vfio_agent::plugin::testing
