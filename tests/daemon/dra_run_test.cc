// `vfio-gpu-agent run --kubelet-api dra` as a process on the simulated 8x H200 node: it binds as always, then
// serves the GPUs as a DRA driver (registered with kubelet-dra-sim, health stream, ResourceSlices on the fake API
// server) and never starts the device plugin; with --bind-on-prepare it binds nothing at start.
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
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

// The simulated 8x H200 node (every GPU on nvidia), the fake API server and kubelet-dra-sim, and `run --kubelet-api
// dra` on them with `extra_args`.
struct DraNode {
  std::unique_ptr<Node> node;
  std::unique_ptr<sim::KubeApiSim> api;
  std::unique_ptr<kubeletsim::dra::KubeletDraSim> kubelet;
  std::unique_ptr<RunProcess> run;
  std::filesystem::path dir;

  void Start(const std::vector<std::string>& extra_args = {}) {
    auto created = Node::Create("hgx-h200-8gpu.json");
    ASSERT_TRUE(created.ok()) << created.status();
    node = *std::move(created);
    ASSERT_TRUE(node->StartKubelet({.pod_resources_socket = PodResourcesSocket(*node)}).ok());
    dir = node->kubelet_dir().parent_path();
    auto started = sim::KubeApiSim::Start(dir, {.nodes = {"node-a"}});
    ASSERT_TRUE(started.ok()) << started.status();
    api = *std::move(started);
    auto kubeconfig = api->WriteKubeconfig(dir / "kubeconfig");
    ASSERT_TRUE(kubeconfig.ok()) << kubeconfig.status();
    kubelet = std::make_unique<kubeletsim::dra::KubeletDraSim>(
        kubeletsim::dra::Options{.registry_dir = dir / "plugins_registry"});
    ASSERT_TRUE(kubelet->Start().ok());
    for (const std::string& bdf : kH200Gpus) ASSERT_EQ(DriverOf(*node, bdf), "nvidia");
    std::vector<std::string> args = {"--kubelet-api", "dra", "--kubelet-registry-dir",
                                     (dir / "plugins_registry").string(), "--kubelet-plugins-dir",
                                     (dir / "plugins").string(), "--cdi-dir", (dir / "cdi").string(), "--kubeconfig",
                                     kubeconfig->string(), "--node-name", "node-a"};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    auto process = RunProcess::Start(*node, args);
    ASSERT_TRUE(process.ok()) << process.status();
    run = *std::move(process);
  }

  // Every GPU healthy on the health stream, under its address-derived name.
  bool AllHealthy() const {
    auto health = kubelet->LatestHealth(kDraDriver);
    if (!health || health->devices_size() != static_cast<int>(kH200Gpus.size())) return false;
    for (int i = 0; i < health->devices_size(); ++i) {
      if (health->devices(i).health() != ::v1alpha1::HEALTHY ||
          health->devices(i).device().device_name() != dra::DeviceName(kH200Gpus[static_cast<size_t>(i)])) {
        return false;
      }
    }
    return true;
  }
};

TEST(DraRunTest, BindsEveryGpuAndServesItAsADraDriverInsteadOfTheDevicePlugin) {
  DraNode dra;
  ASSERT_NO_FATAL_FAILURE(dra.Start());
  RunProcess* run = dra.run.get();
  EXPECT_TRUE(run->WaitReady()) << run->Log();
  for (const std::string& bdf : kH200Gpus) EXPECT_EQ(DriverOf(*dra.node, bdf), "vfio-pci");
  ASSERT_TRUE(dra.kubelet->WaitFor(
      [](const kubeletsim::dra::KubeletDraSim& k) { return k.Count("register") == 1; }, kPatience));
  EXPECT_TRUE(WaitUntil([&] { return dra.AllHealthy(); })) << run->Log();
  EXPECT_TRUE(WaitUntil([&] {
    auto slices = dra.api->Slices();
    return slices.ok() && slices->size() == 1 && (*slices)[0]["spec"]["devices"].size() == kH200Gpus.size();
  }));
  // One kubelet API a node: no device-plugin socket, nothing registered with the device-plugin kubelet.
  for (const auto& entry : std::filesystem::directory_iterator(dra.node->kubelet_dir())) {
    EXPECT_FALSE(entry.path().filename().string().starts_with("kubevirt-")) << entry.path();
  }

  const int status = run->SignalAndWait(SIGTERM);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << run->Log();
  EXPECT_FALSE(std::filesystem::exists(dra.dir / "plugins_registry" / (std::string(kDraDriver) + "-reg.sock")));
  for (const std::string& bdf : kH200Gpus) EXPECT_EQ(DriverOf(*dra.node, bdf), "vfio-pci");  // nothing unbound
}

// --bind-on-prepare: nothing is bound at start, yet every GPU is published healthy (a claim's Prepare can bind it)
// and the node is Ready.
TEST(DraRunTest, WithBindOnPrepareNothingIsBoundAtStartAndEveryGpuIsPublishedHealthy) {
  DraNode dra;
  ASSERT_NO_FATAL_FAILURE(dra.Start({"--bind-on-prepare"}));
  EXPECT_TRUE(dra.run->WaitReady()) << dra.run->Log();
  EXPECT_TRUE(WaitUntil([&] { return dra.AllHealthy(); })) << dra.run->Log();
  EXPECT_TRUE(WaitUntil([&] {
    auto slices = dra.api->Slices();
    return slices.ok() && slices->size() == 1 && (*slices)[0]["spec"]["devices"].size() == kH200Gpus.size();
  }));
  for (const std::string& bdf : kH200Gpus) EXPECT_EQ(DriverOf(*dra.node, bdf), "nvidia");

  // A claim binds its GPU and Unprepare returns it: the GPU was never lost, and no event says it was. Each move
  // is followed by a reconcile pass (its group node came or went) before the events are read.
  auto last_pass = [&] {
    const std::string metrics = dra.run->Metrics();
    const std::string name = "\nvfio_gpu_agent_last_reconcile_timestamp_seconds ";
    const size_t at = metrics.find(name);
    return at == std::string::npos ? 0.0 : std::strtod(metrics.c_str() + at + name.size(), nullptr);
  };
  auto now = [] { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); };
  const std::string gpu = kH200Gpus[0];
  nlohmann::json result = {{"request", "gpu"}, {"driver", kDraDriver}, {"pool", "node-a"}, {"device", dra::DeviceName(gpu)}};
  const nlohmann::json claim = {
      {"metadata", {{"namespace", "vms"}, {"name", "vm"}, {"uid", "uid-1"}}},
      {"spec", {{"devices", {{"requests", nlohmann::json::array()}}}}},
      {"status", {{"allocation", {{"devices", {{"results", nlohmann::json::array({result})}}}}}}}};
  ASSERT_TRUE(dra.api->Control("claim " + claim.dump()).ok());
  double moved = now();
  auto prepared = dra.kubelet->Prepare(kDraDriver, {kubeletsim::dra::MakeClaim("vms", "vm", "uid-1")});
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  ASSERT_EQ(prepared->claims().at("uid-1").error(), "");
  EXPECT_EQ(DriverOf(*dra.node, gpu), "vfio-pci");
  EXPECT_TRUE(WaitUntil([&] { return last_pass() > moved; })) << dra.run->Log();
  moved = now();
  auto unprepared = dra.kubelet->Unprepare(kDraDriver, {kubeletsim::dra::MakeClaim("vms", "vm", "uid-1")});
  ASSERT_TRUE(unprepared.ok()) << unprepared.status();
  EXPECT_EQ(unprepared->claims().at("uid-1").error(), "");
  EXPECT_EQ(DriverOf(*dra.node, gpu), "nvidia");
  EXPECT_TRUE(WaitUntil([&] { return last_pass() > moved; })) << dra.run->Log();
  auto events = dra.api->Events();
  ASSERT_TRUE(events.ok()) << events.status();
  for (const nlohmann::json& event : *events) {
    EXPECT_NE(event.value("reason", ""), "DeviceLost") << event.dump();
    EXPECT_NE(event.value("reason", ""), "DeviceRecovered") << event.dump();
  }
  const int status = dra.run->SignalAndWait(SIGTERM);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << dra.run->Log();
}

class DraUsageTest : public ::testing::TestWithParam<std::vector<std::string>> {};

TEST_P(DraUsageTest, IsAUsageError) {
  auto node = Node::Create("hgx-h200-8gpu.json");
  ASSERT_TRUE(node.ok()) << node.status();
  auto run = RunProcess::Start(**node, GetParam());
  ASSERT_TRUE(run.ok()) << run.status();
  std::optional<int> exited;
  ASSERT_TRUE(WaitUntil([&] { return (exited = (*run)->ExitedOnItsOwn()).has_value(); }));
  const int status = *exited;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << (*run)->Log();
}

INSTANTIATE_TEST_SUITE_P(Flags, DraUsageTest,
                         ::testing::Values(std::vector<std::string>{"--kubelet-api", "dra", "--workload", "vm-vgpu"},
                                           // a policy of the DRA driver, meaningless to the device plugin
                                           std::vector<std::string>{"--bind-on-prepare"}));

}  // namespace
}  // namespace vfio_agent::daemon::testing
