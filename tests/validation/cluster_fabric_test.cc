// Layer 7 through `vfio-gpu-agent validate --layers fabric --fabric-manager ...` on the simulated HGX H200 node,
// against the fake libnvfm.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>

#include "fabric_fixture.h"
#include "host_node.h"

namespace vfio_agent::validation::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using vfio_agent::testing::FakeFmState;
using vfio_agent::testing::UpdateFakeFm;

class FabricLayerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto node = HostNode::Start(kH200Node);
    ASSERT_TRUE(node.ok()) << node.status();
    node_ = *std::move(node);
    fm_ = vfio_agent::testing::MakeFakeFm(dir_.path());
  }
  // Exit code and the text report.
  std::pair<int, std::string> Validate(const std::string& extra = "") {
    const std::string command = absl::StrCat(
        VA_AGENT_BIN, " validate --layers fabric --sysfs-root ", node_->paths.sysfs_root.string(), " --dev-root ",
        node_->paths.dev_root.string(), " --proc-root ", node_->paths.proc_root.string(), " --fabric-library ",
        FAKE_NVFM_LIBRARY, " ", extra, " --log-level error 2>&1");
    std::string out;
    FILE* pipe = ::popen(command.c_str(), "r");
    if (pipe == nullptr) return {-1, ""};
    char buffer[4096];
    for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) out.append(buffer, n);
    const int status = ::pclose(pipe);
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
  }
  std::string Fm() const { return "--fabric-manager unix:" + fm_.string(); }

  std::unique_ptr<HostNode> node_;
  vfio_agent::testing::TempDir dir_;
  std::filesystem::path fm_;
};

TEST_F(FabricLayerTest, SharedModeNodePasses) {
  ASSERT_TRUE(node_->BindNvidia(/*nvswitches=*/false).ok());
  auto [code, out] = Validate(Fm());
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("pass  fabric.reachable"));
  EXPECT_THAT(out, HasSubstr("pass  fabric.partitions"));
  EXPECT_THAT(out, HasSubstr("15 partitions of 1, 2, 4, 8 GPUs; 0 active"));
  EXPECT_THAT(out, HasSubstr("pass  fabric.gpus"));
  EXPECT_THAT(out, HasSubstr("pass  fabric.nvswitches"));
}

TEST_F(FabricLayerTest, WithoutFabricManagerTheLayerIsSkipped) {
  auto [code, out] = Validate();
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("SKIP  fabric.reachable"));
  EXPECT_THAT(out, HasSubstr("no --fabric-manager"));
}

TEST_F(FabricLayerTest, WrongModeNamesFabricModeOne) {
  UpdateFakeFm(fm_, [](FakeFmState& state) { state.mode = "not-supported"; });
  auto [code, out] = Validate(Fm());
  EXPECT_EQ(code, 1) << out;
  EXPECT_THAT(out, HasSubstr("FAIL  fabric.reachable"));
  EXPECT_THAT(out, HasSubstr("FM_ST_NOT_SUPPORTED"));
  EXPECT_THAT(out, HasSubstr("FABRIC_MODE=1"));
  EXPECT_THAT(out, HasSubstr("SKIP  fabric.gpus"));
}

TEST_F(FabricLayerTest, NoFabricManagerListeningIsAFailureWithTheFix) {
  auto [code, out] = Validate("--fabric-manager unix:" + (dir_.path() / "absent").string());
  EXPECT_EQ(code, 1) << out;
  EXPECT_THAT(out, HasSubstr("FM_ST_CONNECTION_NOT_VALID"));
  EXPECT_THAT(out, HasSubstr("systemctl status nvidia-fabricmanager"));
}

TEST_F(FabricLayerTest, AGpuInNoSupportedPartitionAndSwitchesOnVfioFail) {
  // Module 8 (0000:5d:00.0) is no longer in any supported partition.
  UpdateFakeFm(fm_, [](FakeFmState& state) { state.unsupported = {0, 2, 6, 14}; });
  ASSERT_TRUE(node_->BindNvidia(/*nvswitches=*/true).ok());
  auto [code, out] = Validate(Fm());
  EXPECT_EQ(code, 1) << out;
  EXPECT_THAT(out, HasSubstr("FAIL  fabric.gpus"));
  EXPECT_THAT(out, HasSubstr("in no supported partition (advertised Unhealthy): 0000:5d:00.0"));
  EXPECT_THAT(out, Not(HasSubstr("0000:db:00.0 (")));
  EXPECT_THAT(out, HasSubstr("FAIL  fabric.nvswitches"));
}

TEST_F(FabricLayerTest, NvSwitchesFlagAndFabricManagerAreAUsageError) {
  auto [code, out] = Validate(Fm() + " --nvswitches");
  EXPECT_EQ(code, 2) << out;
  EXPECT_THAT(out, HasSubstr("exclude each other"));
}

}  // namespace
}  // namespace vfio_agent::validation::testing
