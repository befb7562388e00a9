// `vfio-gpu-agent run --kubelet-api dra` as a process on the simulated 8x H200 node: it binds as always, then
// serves the GPUs as a DRA driver (registered with kubelet-dra-sim, health stream, ResourceSlices on the fake API
// server) and never starts the device plugin.
#include <signal.h>
#include <sys/wait.h>

#include <stdexcept>

#include "gtest/gtest.h"
#include "kube_api_sim.h"
#include "kubelet_dra_sim.h"
#include "run_harness.h"
#include "vfio_gpu_agent/dra/device_names.h"

namespace vfio_agent::daemon::testing {
namespace {

using plugin::testing::kH200Gpus;
using plugin::testing::Node;

constexpr char kDraDriver[] = "gpu.vfio-agent.cozystack.io";

TEST(DraRunTest, BindsEveryGpuAndServesItAsADraDriverInsteadOfTheDevicePlugin) {
  auto node = Node::Create("hgx-h200-8gpu.json");
  ASSERT_TRUE(node.ok()) << node.status();
  ASSERT_TRUE((*node)->StartKubelet({.pod_resources_socket = PodResourcesSocket(**node)}).ok());
  const std::filesystem::path dir = (*node)->kubelet_dir().parent_path();
  auto api = sim::KubeApiSim::Start(dir, {.nodes = {"node-a"}});
  ASSERT_TRUE(api.ok()) << api.status();
  auto kubeconfig = (*api)->WriteKubeconfig(dir / "kubeconfig");
  ASSERT_TRUE(kubeconfig.ok()) << kubeconfig.status();
  kubeletsim::dra::KubeletDraSim kubelet({.registry_dir = dir / "plugins_registry"});
  ASSERT_TRUE(kubelet.Start().ok());
  for (const std::string& bdf : kH200Gpus) ASSERT_EQ(DriverOf(**node, bdf), "nvidia");

  auto run = RunProcess::Start(**node, {"--kubelet-api", "dra", "--kubelet-registry-dir", (dir / "plugins_registry").string(),
                                        "--kubelet-plugins-dir", (dir / "plugins").string(), "--cdi-dir",
                                        (dir / "cdi").string(), "--kubeconfig", kubeconfig->string(), "--node-name",
                                        "node-a"});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_TRUE((*run)->WaitReady()) << (*run)->Log();
  for (const std::string& bdf : kH200Gpus) EXPECT_EQ(DriverOf(**node, bdf), "vfio-pci");
  ASSERT_TRUE(kubelet.WaitFor([](const kubeletsim::dra::KubeletDraSim& k) { return k.Count("register") == 1; },
                              kPatience));
  // Every GPU healthy on the health stream and in the node's slice, under its address-derived name.
  EXPECT_TRUE(WaitUntil([&] {
    auto health = kubelet.LatestHealth(kDraDriver);
    if (!health || health->devices_size() != static_cast<int>(kH200Gpus.size())) return false;
    for (int i = 0; i < health->devices_size(); ++i) {
      if (health->devices(i).health() != ::v1alpha1::HEALTHY ||
          health->devices(i).device().device_name() != dra::DeviceName(kH200Gpus[static_cast<size_t>(i)])) {
        return false;
      }
    }
    return true;
  })) << (*run)->Log();
  EXPECT_TRUE(WaitUntil([&] {
    auto slices = (*api)->Slices();
    return slices.ok() && slices->size() == 1 && (*slices)[0]["spec"]["devices"].size() == kH200Gpus.size();
  }));
  // One kubelet API a node: no device-plugin socket, nothing registered with the device-plugin kubelet.
  for (const auto& entry : std::filesystem::directory_iterator((*node)->kubelet_dir())) {
    EXPECT_FALSE(entry.path().filename().string().starts_with("kubevirt-")) << entry.path();
  }

  const int status = (*run)->SignalAndWait(SIGTERM);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << (*run)->Log();
  EXPECT_FALSE(std::filesystem::exists(dir / "plugins_registry" / (std::string(kDraDriver) + "-reg.sock")));
  for (const std::string& bdf : kH200Gpus) EXPECT_EQ(DriverOf(**node, bdf), "vfio-pci");  // nothing unbound
}

TEST(DraRunTest, VgpuWorkloadWithDraIsAUsageError) {
  auto node = Node::Create("hgx-h200-8gpu.json");
  ASSERT_TRUE(node.ok()) << node.status();
  auto run = RunProcess::Start(**node, {"--kubelet-api", "dra", "--workload", "vm-vgpu"});
  ASSERT_TRUE(run.ok()) << run.status();
  std::optional<int> exited;
  ASSERT_TRUE(WaitUntil([&] { return (exited = (*run)->ExitedOnItsOwn()).has_value(); }));
  const int status = *exited;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << (*run)->Log();
}

}  // namespace
}  // namespace vfio_agent::daemon::testing
