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

// A simulated node with both kubelets (the device-plugin one, which must see nothing of ours) and the fake API
// server; `run --kubelet-api dra` started on it with `extra` flags.
class DraRunTest : public ::testing::Test {
 protected:
  void Start(const std::string& node_file) {
    auto node = Node::Create(node_file);
    ASSERT_TRUE(node.ok()) << node.status();
    node_ = *std::move(node);
    ASSERT_TRUE(node_->StartKubelet({.pod_resources_socket = PodResourcesSocket(*node_)}).ok());
    dir_ = node_->kubelet_dir().parent_path();
    auto api = sim::KubeApiSim::Start(dir_, {.nodes = {"node-a"}});
    ASSERT_TRUE(api.ok()) << api.status();
    api_ = *std::move(api);
    auto kubeconfig = api_->WriteKubeconfig(dir_ / "kubeconfig");
    ASSERT_TRUE(kubeconfig.ok()) << kubeconfig.status();
    kubelet_ = std::make_unique<kubeletsim::dra::KubeletDraSim>(
        kubeletsim::dra::Options{.registry_dir = dir_ / "plugins_registry"});
    ASSERT_TRUE(kubelet_->Start().ok());
  }

  absl::StatusOr<std::unique_ptr<RunProcess>> Run(std::vector<std::string> extra) {
    std::vector<std::string> args = {"--kubelet-api", "dra", "--kubelet-registry-dir", (dir_ / "plugins_registry").string(),
                                     "--kubelet-plugins-dir", (dir_ / "plugins").string(), "--cdi-dir",
                                     (dir_ / "cdi").string(), "--kubeconfig", (dir_ / "kubeconfig").string(),
                                     "--node-name", "node-a"};
    args.insert(args.end(), extra.begin(), extra.end());
    return RunProcess::Start(*node_, args);
  }

  // No device-plugin socket: one kubelet API a node, nothing registered with the device-plugin kubelet.
  void ExpectNoDevicePlugin() const {
    for (const auto& entry : std::filesystem::directory_iterator(node_->kubelet_dir())) {
      EXPECT_FALSE(entry.path().filename().string().starts_with("kubevirt-")) << entry.path();
    }
  }

  std::unique_ptr<Node> node_;
  std::filesystem::path dir_;
  std::unique_ptr<sim::KubeApiSim> api_;
  std::unique_ptr<kubeletsim::dra::KubeletDraSim> kubelet_;
};

TEST_F(DraRunTest, BindsEveryGpuAndServesItAsADraDriverInsteadOfTheDevicePlugin) {
  Start("hgx-h200-8gpu.json");
  for (const std::string& bdf : kH200Gpus) ASSERT_EQ(DriverOf(*node_, bdf), "nvidia");

  auto run = Run({});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_TRUE((*run)->WaitReady()) << (*run)->Log();
  for (const std::string& bdf : kH200Gpus) EXPECT_EQ(DriverOf(*node_, bdf), "vfio-pci");
  ASSERT_TRUE(kubelet_->WaitFor([](const kubeletsim::dra::KubeletDraSim& k) { return k.Count("register") == 1; },
                                kPatience));
  // Every GPU healthy on the health stream and in the node's slice, under its address-derived name.
  EXPECT_TRUE(WaitUntil([&] {
    auto health = kubelet_->LatestHealth(kDraDriver);
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
    auto slices = api_->Slices();
    return slices.ok() && slices->size() == 1 && (*slices)[0]["spec"]["devices"].size() == kH200Gpus.size();
  }));
  ExpectNoDevicePlugin();

  const int status = (*run)->SignalAndWait(SIGTERM);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << (*run)->Log();
  EXPECT_FALSE(std::filesystem::exists(dir_ / "plugins_registry" / (std::string(kDraDriver) + "-reg.sock")));
  for (const std::string& bdf : kH200Gpus) EXPECT_EQ(DriverOf(*node_, bdf), "vfio-pci");  // nothing unbound
}

// vm-vgpu with DRA: the profiles of a config made, the vGPUs published one device each (never a GPU), nothing
// bound to vfio-pci and no device-plugin socket.
TEST_F(DraRunTest, VgpuWorkloadPublishesEachVgpuAsADraDeviceAndBindsNothing) {
  Start("vgpu-sriov-l40s-h200.json");
  std::ofstream(dir_ / "vgpu-config.yaml") << vfio_agent::testing::kSimNodeProfileConfigs;
  auto run = Run({"--workload", "vm-vgpu", "--vgpu-config-file", (dir_ / "vgpu-config.yaml").string(),
                  "--vgpu-config", "h200-small-3", "--state-dir", (dir_ / "state").string()});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_TRUE((*run)->WaitReady()) << (*run)->Log();
  // Three H200X-1-18C on each H200, each a VF of its card: six devices named from their VFs.
  EXPECT_TRUE(WaitUntil([&] {
    auto slices = api_->Slices();
    if (!slices.ok() || slices->size() != 1 || (*slices)[0]["spec"]["devices"].size() != 6) return false;
    for (const auto& device : (*slices)[0]["spec"]["devices"]) {
      if (!device["name"].get<std::string>().starts_with("vgpu-") ||
          device["attributes"][std::string(kDraDriver) + "/resourceName"]["string"] != "NVIDIA_H200X-1-18C") {
        return false;
      }
    }
    return true;
  })) << (*run)->Log();
  ExpectNoDevicePlugin();
  const int status = (*run)->SignalAndWait(SIGTERM);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << (*run)->Log();
  for (const std::string& line : node_->SimLog()) {
    EXPECT_FALSE(line.starts_with("bind ") && line.ends_with("vfio-pci")) << line;  // nothing bound on vm-vgpu
  }
}

}  // namespace
}  // namespace vfio_agent::daemon::testing
