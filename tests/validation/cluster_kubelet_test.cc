// Layer 4 through the kubelet simulator's pod-resources server, with the real agent on the simulated node.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "validation/cluster_node.h"
#include "vfio_gpu_agent/plugin/frontend.h"

namespace vfio_agent::validation {
namespace {

using ::testing::HasSubstr;
using testing::FindCheck;
using testing::kH200;
using testing::kH200Gpus;
using testing::kWait;
using testing::ScriptedPlugin;
using namespace std::chrono_literals;


class ClusterKubeletTest : public testing::ClusterNodeTest {
 protected:
  std::vector<Check> Run(node::WholeDevices whole = node::WholeDevices::kOnVfio) {
    return KubeletChecks(node_->View(whole), node_->paths.pod_resources_socket, kWait);
  }
};

TEST_F(ClusterKubeletTest, NoPodResourcesSocketSkipsWithWhy) {
  ASSERT_TRUE(node_->BindToVfio(kH200Gpus).ok());
  const auto checks = Run();
  ASSERT_EQ(checks.size(), 2u);
  for (const Check& check : checks) {
    EXPECT_EQ(check.result, Result::kSkip) << check.id;
    EXPECT_THAT(check.message, HasSubstr(node_->paths.pod_resources_socket.string()));
    EXPECT_THAT(check.message, HasSubstr("--pod-resources-socket"));
  }
  EXPECT_NE(FindCheck(checks, "kubelet.allocatable"), nullptr);
  EXPECT_NE(FindCheck(checks, "kubelet.in_use"), nullptr);
}

TEST_F(ClusterKubeletTest, PodResourcesSocketThatDoesNotAnswerFails) {
  ASSERT_TRUE(node_->BindToVfio(kH200Gpus).ok());
  // A kubelet that died: its socket file stays, nobody accepts on it.
  const std::string path = node_->paths.pod_resources_socket.string();
  std::filesystem::create_directories(node_->paths.pod_resources_socket.parent_path());
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ASSERT_LT(path.size(), sizeof addr.sun_path);
  std::copy(path.begin(), path.end(), addr.sun_path);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  close(fd);

  const auto checks = Run();
  ASSERT_EQ(checks.size(), 2u);
  for (const Check& check : checks) {
    EXPECT_EQ(check.result, Result::kFail) << check.id;
    EXPECT_THAT(check.fix, HasSubstr("systemctl status kubelet"));
  }
  EXPECT_THAT(FindCheck(checks, "kubelet.allocatable")->message, HasSubstr("does not answer GetAllocatableResources"));
  EXPECT_THAT(FindCheck(checks, "kubelet.in_use")->message, HasSubstr("does not answer List"));
}

TEST_F(ClusterKubeletTest, ServedAndRegisteredNodePasses) {
  Serve();
  const auto checks = Run();
  ASSERT_EQ(checks.size(), 2u);
  const Check* allocatable = FindCheck(checks, "kubelet.allocatable", kH200);
  ASSERT_NE(allocatable, nullptr);
  EXPECT_EQ(allocatable->result, Result::kPass) << allocatable->message;
  EXPECT_THAT(testing::EvidenceText(*allocatable), HasSubstr(std::string(kH200) + ": 8 devices: 0000:18:00.0,"));
  const Check* in_use = FindCheck(checks, "kubelet.in_use", kH200);
  ASSERT_NE(in_use, nullptr);
  EXPECT_EQ(in_use->result, Result::kPass);
  EXPECT_EQ(in_use->message, "0 of 8 in use");
}

TEST_F(ClusterKubeletTest, DevicesInUseAreListedWithTheirPod) {
  Serve();
  auto pod = node_->kubelet().Admit({.name = "virt-launcher-vm-a", .limits = {{kH200, 2}}, .pod_namespace = "tenant-a",
                                     .container = "compute"});
  ASSERT_TRUE(pod.ok()) << pod.status();
  const auto& ids = pod->devices.at(kH200);
  const auto checks = Run();
  const Check* in_use = FindCheck(checks, "kubelet.in_use", kH200);
  ASSERT_NE(in_use, nullptr);
  EXPECT_EQ(in_use->result, Result::kPass);
  EXPECT_EQ(in_use->message, "2 of 8 in use");
  EXPECT_THAT(testing::EvidenceText(*in_use),
              HasSubstr("tenant-a/virt-launcher-vm-a compute: " + ids[0] + "," + ids[1]));
  // Devices in use stay allocatable (the kubelet reports every healthy device).
  EXPECT_EQ(FindCheck(checks, "kubelet.allocatable", kH200)->result, Result::kPass);
}

TEST_F(ClusterKubeletTest, StaleKubeletViewFails) {
  Serve();
  ASSERT_TRUE(node_->kubelet().FreezeUpdates(kH200, true).ok());
  ASSERT_TRUE(node_->Control("set-driver 0000:5d:00.0 nvidia").ok());
  // The agent reports the GPU unhealthy; the frozen kubelet drops that update.
  ASSERT_TRUE(node_->kubelet().WaitFor(
      [](const kubeletsim::KubeletSim& k) {
        for (const auto& e : k.Events()) {
          if (e.kind == "list_ignored") return true;
        }
        return false;
      },
      10s));
  const auto checks = Run(node::WholeDevices::kEverySelected);
  const Check* allocatable = FindCheck(checks, "kubelet.allocatable", kH200);
  ASSERT_NE(allocatable, nullptr);
  EXPECT_EQ(allocatable->result, Result::kFail);
  EXPECT_THAT(allocatable->message, HasSubstr("stale"));
  EXPECT_THAT(allocatable->message, HasSubstr("allocatable but not healthy here: 0000:5d:00.0"));
  EXPECT_THAT(allocatable->fix, HasSubstr("Restart the agent"));
}

TEST_F(ClusterKubeletTest, UnregisteredResourceFails) {
  ASSERT_TRUE(node_->BindToVfio(kH200Gpus).ok());
  ASSERT_TRUE(node_->StartKubelet().ok());
  // A plugin serves the socket but never registered: the kubelet knows nothing of the resource.
  ScriptedPlugin unregistered(node_->PluginSocket("kubevirt-GH100_H200_SXM_141GB.sock"), kH200Gpus);
  ASSERT_TRUE(unregistered.Start().ok());
  const auto checks = Run();
  const Check* allocatable = FindCheck(checks, "kubelet.allocatable", kH200);
  ASSERT_NE(allocatable, nullptr);
  EXPECT_EQ(allocatable->result, Result::kFail);
  EXPECT_THAT(allocatable->message, HasSubstr("holds no allocatable"));
  EXPECT_THAT(testing::EvidenceText(*allocatable), HasSubstr(std::string(kH200) + ": (none)"));
}

TEST_F(ClusterKubeletTest, OurGpusAllocatableUnderAnotherNameFail) {
  Serve();
  ScriptedPlugin sandbox(node_->PluginSocket("kubevirt-2335.sock"), {"0000:18:00.0", "0000:2a:00.0"});
  ASSERT_TRUE(sandbox.Start().ok());
  ASSERT_TRUE(testing::RegisterWithKubelet(node_->kubelet().kubelet_socket(), "kubevirt-2335.sock",
                                           "nvidia.com/2335").ok());
  ASSERT_TRUE(node_->WaitForKubelet("nvidia.com/2335", 2, 2));
  const auto checks = Run();
  EXPECT_EQ(FindCheck(checks, "kubelet.allocatable", kH200)->result, Result::kPass);
  const Check* other = FindCheck(checks, "kubelet.allocatable", "nvidia.com/2335");
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(other->result, Result::kFail);
  EXPECT_THAT(other->message, HasSubstr("0000:18:00.0,0000:2a:00.0"));
}

TEST_F(ClusterKubeletTest, PodHoldingAGpuThatLostItsBindingWarns) {
  Serve();
  auto pod = node_->kubelet().Admit({.name = "vm-b", .limits = {{kH200, 1}}});
  ASSERT_TRUE(pod.ok()) << pod.status();
  const std::string held = pod->devices.at(kH200).at(0);
  ASSERT_TRUE(node_->Control("set-driver " + held + " none").ok());
  const auto checks = Run(node::WholeDevices::kEverySelected);
  const Check* in_use = FindCheck(checks, "kubelet.in_use", kH200);
  ASSERT_NE(in_use, nullptr);
  EXPECT_EQ(in_use->result, Result::kWarn);
  EXPECT_THAT(in_use->message, HasSubstr(held));
  EXPECT_FALSE(in_use->fix.empty());
}

// `validate` and the serving agent judge a GPU by one model: a GPU whose config space stopped answering is unhealthy to
// the agent, which tells the kubelet, and to the kubelet check, which then expects it not allocatable. A validator
// with a health rule of its own (a GPU on vfio-pci with its group node, say) would expect all 8 and fail here.
TEST_F(ClusterKubeletTest, ValidateExpectsOfAGpuWhatTheServingAgentServesThroughTheNodeModel) {
  Serve();
  const std::string dead = kH200Gpus[2];
  ASSERT_TRUE(node_->Control("dead " + dead + " 1").ok());
  ASSERT_TRUE(node_->WaitForKubelet(kH200, 8, 7)) << node_->kubelet().DescribeNode();

  const NodeView& view = node_->View();
  ASSERT_NE(view.served, nullptr);
  EXPECT_EQ(*view.served, plugin::ServedOf(node_->agent().Snapshot()));
  const auto served = std::find_if(view.served->begin(), view.served->end(),
                                   [&](const node::ServedDevice& device) { return device.id == dead; });
  ASSERT_NE(served, view.served->end());
  EXPECT_FALSE(served->healthy);
  EXPECT_EQ(served->unhealthy_reason, view.model->Find(dead)->unhealthy_reason);

  const auto checks = KubeletChecks(view, node_->paths.pod_resources_socket, kWait);
  const Check* allocatable = FindCheck(checks, "kubelet.allocatable", kH200);
  ASSERT_NE(allocatable, nullptr);
  EXPECT_EQ(allocatable->result, Result::kPass) << testing::EvidenceText(*allocatable);
  EXPECT_THAT(allocatable->message, HasSubstr("exactly the 7 healthy"));
}

}  // namespace
}  // namespace vfio_agent::validation
