// `vfio-gpu-agent run --kubelet-api dra` as a process on the simulated 8x H200 node: it binds as always, then
// serves the GPUs as a DRA driver (registered with kubelet-dra-sim, health stream, ResourceSlices on the fake API
// server) and never starts the device plugin.
#include <signal.h>
#include <sys/wait.h>

#include <fstream>
#include <stdexcept>

#include "gtest/gtest.h"
#include "kube_api_sim.h"
#include "kubelet_dra_sim.h"
#include "run_harness.h"
#include "vfio_gpu_agent/dra/device_names.h"
#include "vgpu/profile_configs.h"

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

// vm-vgpu with DRA: the profiles of a config made, the vGPUs published one device each (never a GPU), nothing
// bound to vfio-pci and no device-plugin socket.
TEST(DraRunTest, VgpuWorkloadPublishesEachVgpuAsADraDeviceAndBindsNothing) {
  auto node = Node::Create("vgpu-sriov-l40s-h200.json");
  ASSERT_TRUE(node.ok()) << node.status();
  ASSERT_TRUE((*node)->StartKubelet({.pod_resources_socket = PodResourcesSocket(**node)}).ok());
  const std::filesystem::path dir = (*node)->kubelet_dir().parent_path();
  std::ofstream(dir / "vgpu-config.yaml") << vfio_agent::testing::kSimNodeProfileConfigs;
  auto api = sim::KubeApiSim::Start(dir, {.nodes = {"node-a"}});
  ASSERT_TRUE(api.ok()) << api.status();
  auto kubeconfig = (*api)->WriteKubeconfig(dir / "kubeconfig");
  ASSERT_TRUE(kubeconfig.ok()) << kubeconfig.status();
  kubeletsim::dra::KubeletDraSim kubelet({.registry_dir = dir / "plugins_registry"});
  ASSERT_TRUE(kubelet.Start().ok());

  auto run = RunProcess::Start(
      **node, {"--kubelet-api", "dra", "--workload", "vm-vgpu", "--vgpu-config-file", (dir / "vgpu-config.yaml").string(),
               "--vgpu-config", "h200-small-3", "--state-dir", (dir / "state").string(), "--kubelet-registry-dir",
               (dir / "plugins_registry").string(), "--kubelet-plugins-dir", (dir / "plugins").string(), "--cdi-dir",
               (dir / "cdi").string(), "--kubeconfig", kubeconfig->string(), "--node-name", "node-a"});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_TRUE((*run)->WaitReady()) << (*run)->Log();
  // Three H200X-1-18C on each H200, each a VF of its card: six devices named from their VFs.
  EXPECT_TRUE(WaitUntil([&] {
    auto slices = (*api)->Slices();
    if (!slices.ok() || slices->size() != 1 || (*slices)[0]["spec"]["devices"].size() != 6) return false;
    for (const auto& device : (*slices)[0]["spec"]["devices"]) {
      if (!device["name"].get<std::string>().starts_with("vgpu-") ||
          device["attributes"][std::string(kDraDriver) + "/resourceName"]["string"] != "NVIDIA_H200X-1-18C") {
        return false;
      }
    }
    return true;
  })) << (*run)->Log();
  for (const auto& entry : std::filesystem::directory_iterator((*node)->kubelet_dir())) {
    EXPECT_FALSE(entry.path().filename().string().starts_with("kubevirt-")) << entry.path();
  }
  const int status = (*run)->SignalAndWait(SIGTERM);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << (*run)->Log();
  for (const std::string& line : (*node)->SimLog()) {
    EXPECT_FALSE(line.starts_with("bind ") && line.ends_with("vfio-pci")) << line;  // nothing bound on vm-vgpu
  }
}

}  // namespace
}  // namespace vfio_agent::daemon::testing
