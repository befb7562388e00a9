// Layer 3 against the real agent on the simulated 8x H200 node, and against other plugins beside it.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "validation/cluster_node.h"

namespace vfio_agent::validation {
namespace {

using ::testing::HasSubstr;
using testing::FindCheck;
using testing::kH200;
using testing::kH200Gpus;
using testing::kWait;
using testing::ScriptedPlugin;
using namespace std::chrono_literals;


using ClusterPluginTest = testing::ClusterNodeTest;

TEST_F(ClusterPluginTest, ServedNodePassesEveryPluginCheck) {
  Serve();
  const auto checks = PluginChecks(node_->View(), kWait);
  ASSERT_EQ(checks.size(), 3u);
  for (const Check& check : checks) {
    EXPECT_EQ(check.result, Result::kPass) << check.id << ": " << check.message;
    EXPECT_EQ(check.layer, Layer::kPlugin);
    EXPECT_TRUE(check.fix.empty());
  }
  const Check* devices = FindCheck(checks, "plugin.devices", kH200);
  ASSERT_NE(devices, nullptr);
  EXPECT_THAT(testing::EvidenceText(*devices),
              HasSubstr("ListAndWatch kubevirt-GH100_H200_SXM_141GB.sock = healthy 8 devices: 0000:18:00.0,"));
  const Check* socket = FindCheck(checks, "plugin.socket", kH200);
  ASSERT_NE(socket, nullptr);
  EXPECT_THAT(testing::EvidenceText(*socket),
              HasSubstr("pre_start_required=false get_preferred_allocation_available=true"));
  ASSERT_NE(FindCheck(checks, "plugin.duplicate_provider", "node"), nullptr);
}

TEST_F(ClusterPluginTest, NoGpuOnVfioSkipsWithWhy) {
  const auto checks = PluginChecks(node_->View(), kWait);
  ASSERT_EQ(checks.size(), 1u);
  EXPECT_EQ(checks[0].id, "plugin.socket");
  EXPECT_EQ(checks[0].result, Result::kSkip);
  EXPECT_THAT(checks[0].message, HasSubstr("no GPU on a vfio driver"));
}

TEST_F(ClusterPluginTest, AgentNotRunningFailsSocketAndSkipsDevices) {
  ASSERT_TRUE(node_->BindToVfio(kH200Gpus).ok());
  const auto checks = PluginChecks(node_->View(), kWait);
  const Check* socket = FindCheck(checks, "plugin.socket", kH200);
  ASSERT_NE(socket, nullptr);
  EXPECT_EQ(socket->result, Result::kFail);
  EXPECT_THAT(socket->fix, HasSubstr("vfio-gpu-agent run"));
  EXPECT_THAT(testing::EvidenceText(*socket), HasSubstr("kubevirt-GH100_H200_SXM_141GB.sock = absent"));
  const Check* devices = FindCheck(checks, "plugin.devices", kH200);
  ASSERT_NE(devices, nullptr);
  EXPECT_EQ(devices->result, Result::kSkip);
}

TEST_F(ClusterPluginTest, SocketNobodyListensOnFails) {
  ASSERT_TRUE(node_->BindToVfio(kH200Gpus).ok());
  // What a plugin that died leaves behind: the socket file, and nobody accepting on it.
  const std::string path = node_->PluginSocket("kubevirt-GH100_H200_SXM_141GB.sock").string();
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ASSERT_LT(path.size(), sizeof addr.sun_path);
  std::copy(path.begin(), path.end(), addr.sun_path);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  close(fd);

  const auto checks = PluginChecks(node_->View(), kWait);
  const Check* socket = FindCheck(checks, "plugin.socket", kH200);
  ASSERT_NE(socket, nullptr);
  EXPECT_EQ(socket->result, Result::kFail);
  EXPECT_THAT(socket->message, HasSubstr("does not answer"));
  EXPECT_EQ(FindCheck(checks, "plugin.devices", kH200)->result, Result::kSkip);
}

TEST_F(ClusterPluginTest, PluginListingAGpuSysfsSaysIsUnhealthyFails) {
  ASSERT_TRUE(node_->BindToVfio(kH200Gpus).ok());
  // A plugin with stale health owns the socket: it still lists 0000:3b:00.0, which went back to nvidia.
  ScriptedPlugin stale(node_->PluginSocket("kubevirt-GH100_H200_SXM_141GB.sock"), kH200Gpus);
  ASSERT_TRUE(stale.Start().ok());
  ASSERT_TRUE(node_->Control("set-driver 0000:3b:00.0 nvidia").ok());

  // The plugin never sends a matching list, so the (short) wait always runs out.
  const auto checks = PluginChecks(node_->View(node::WholeDevices::kEverySelected), 300ms);
  EXPECT_EQ(FindCheck(checks, "plugin.socket", kH200)->result, Result::kPass);
  const Check* devices = FindCheck(checks, "plugin.devices", kH200);
  ASSERT_NE(devices, nullptr);
  EXPECT_EQ(devices->result, Result::kFail);
  EXPECT_THAT(devices->message, HasSubstr("listed healthy but not a healthy vfio-bound GPU here: 0000:3b:00.0"));
  EXPECT_THAT(testing::EvidenceText(*devices), HasSubstr("0000:3b:00.0 (driver nvidia)"));
  EXPECT_FALSE(devices->fix.empty());
}

// The agent tells a probe's stream from the kubelet's by this metadata; without it, a `validate` run could delay the
// agent's re-registration after a stream cut until the probe's stream ended.
TEST_F(ClusterPluginTest, ListAndWatchIsSentAsAProbe) {
  ASSERT_TRUE(node_->BindToVfio(kH200Gpus).ok());
  ScriptedPlugin plugin(node_->PluginSocket("kubevirt-GH100_H200_SXM_141GB.sock"), kH200Gpus);
  ASSERT_TRUE(plugin.Start().ok());
  const auto checks = PluginChecks(node_->View(node::WholeDevices::kEverySelected), kWait);
  EXPECT_EQ(FindCheck(checks, "plugin.devices", kH200)->result, Result::kPass);
  EXPECT_THAT(plugin.probes(), ::testing::ElementsAre("validate"));
}

TEST_F(ClusterPluginTest, PluginThatNeverSendsItsListFails) {
  ASSERT_TRUE(node_->BindToVfio(kH200Gpus).ok());
  ScriptedPlugin silent(node_->PluginSocket("kubevirt-GH100_H200_SXM_141GB.sock"), std::nullopt);
  ASSERT_TRUE(silent.Start().ok());
  // The plugin never writes, so the (short) wait always runs out.
  const auto checks = PluginChecks(node_->View(), 300ms);
  EXPECT_EQ(FindCheck(checks, "plugin.socket", kH200)->result, Result::kPass);
  const Check* devices = FindCheck(checks, "plugin.devices", kH200);
  ASSERT_NE(devices, nullptr);
  EXPECT_EQ(devices->result, Result::kFail);
  EXPECT_EQ(devices->message, "no ListAndWatch message within 300 ms");
  EXPECT_THAT(devices->fix, HasSubstr("Restart the plugin"));
}

TEST_F(ClusterPluginTest, KubevirtsOwnPluginForOurNameIsADuplicateProvider) {
  Serve();
  // virt-handler's plugin for a name permitted without externalResourceProvider: ids are IOMMU groups.
  ScriptedPlugin kubevirt(node_->PluginSocket("kubevirt-nvidia.com-GH100_H200_SXM_141GB.sock"), {"11", "13"});
  ASSERT_TRUE(kubevirt.Start().ok());
  const auto checks = PluginChecks(node_->View(), kWait);
  const Check* duplicate = FindCheck(checks, "plugin.duplicate_provider", kH200);
  ASSERT_NE(duplicate, nullptr);
  EXPECT_EQ(duplicate->result, Result::kFail);
  EXPECT_THAT(duplicate->message, HasSubstr("KubeVirt's own device plugin"));
  EXPECT_THAT(duplicate->fix, HasSubstr("externalResourceProvider: true"));
  EXPECT_EQ(FindCheck(checks, "plugin.devices", kH200)->result, Result::kPass);
}

TEST_F(ClusterPluginTest, AnotherPluginAdvertisingOurGpusUnderAnotherNameFails) {
  Serve();
  // The GPU Operator's sandbox plugin with an old pci.ids: the H200 falls back to its device id.
  ScriptedPlugin sandbox(node_->PluginSocket("kubevirt-2335.sock"), {"0000:18:00.0", "0000:2a:00.0"});
  ASSERT_TRUE(sandbox.Start().ok());
  const auto checks = PluginChecks(node_->View(), kWait);
  const Check* duplicate = FindCheck(checks, "plugin.duplicate_provider", "kubevirt-2335.sock");
  ASSERT_NE(duplicate, nullptr);
  EXPECT_EQ(duplicate->result, Result::kFail);
  EXPECT_THAT(duplicate->message, HasSubstr("0000:18:00.0,0000:2a:00.0"));
  EXPECT_THAT(duplicate->fix, HasSubstr("nvidia.com/gpu.deploy.sandbox-device-plugin=false"));
}

TEST_F(ClusterPluginTest, UnrelatedPluginIsNotADuplicate) {
  Serve();
  ScriptedPlugin kvm(node_->PluginSocket("kubevirt-kvm.sock"), {"kvm0", "kvm1"});
  ASSERT_TRUE(kvm.Start().ok());
  const auto checks = PluginChecks(node_->View(), kWait);
  const Check* duplicate = FindCheck(checks, "plugin.duplicate_provider");
  ASSERT_NE(duplicate, nullptr);
  EXPECT_EQ(duplicate->result, Result::kPass);
  EXPECT_THAT(testing::EvidenceText(*duplicate), HasSubstr("kubevirt-kvm.sock (2 devices: kvm0,kvm1)"));
}

}  // namespace
}  // namespace vfio_agent::validation
