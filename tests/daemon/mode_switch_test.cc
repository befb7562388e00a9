// The workload mode from the node label nvidia.com/gpu.workload.config, switched by the running agent: in process
// on the FUSE simulator's two A10s under the kubelet simulator and the fake API server. The GPUs move through the
// binder (vfio-pci <-> nvidia), the kubelet sees the old resources go and the new ones come, a GPU a VM holds
// (its group open, or assigned to a pod) stays until the VM ends and is named in the condition meanwhile.
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kube_api_sim.h"
#include "passthrough_daemon.h"
#include "run_harness.h"
#include "support/fuse.h"
#include "support/holding_process.h"
#include "support/wait.h"
#include "vfio_gpu_agent/daemon/daemon.h"
#include "vfio_gpu_agent/kube/node_reporter.h"

namespace vfio_agent::daemon::testing {
namespace {

using plugin::testing::Node;
using ::testing::HasSubstr;

constexpr char kGpuA[] = "0000:3b:00.0";  // IOMMU group 33
constexpr char kGpuB[] = "0000:86:00.0";
constexpr char kA10[] = "nvidia.com/GA102GL_A10";

class ModeSwitchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!vfio_agent::testing::FuseAvailable()) GTEST_SKIP() << vfio_agent::testing::kNeedsFuse;
    if (!sim::KubeApiSim::Available()) GTEST_SKIP() << "python3 missing";
    auto node = Node::Create("a10x2-nvidia.json");
    ASSERT_TRUE(node.ok()) << node.status();
    node_ = *std::move(node);
    kubeletsim::Options kubelet;
    kubelet.pod_resources_socket = PodResourcesSocket(*node_);
    ASSERT_TRUE(node_->StartKubelet(kubelet).ok());
    auto api = sim::KubeApiSim::Start(dir_.path());
    ASSERT_TRUE(api.ok()) << api.status();
    api_ = *std::move(api);
  }
  void TearDown() override {
    if (daemon_) daemon_->Stop();
  }

  // The node as kubectl label leaves it ("" = no workload label).
  void Label(const std::string& mode, bool create = false) {
    const std::string labels = mode.empty() ? "{}" : "{\"" + std::string(kWorkloadLabel) + "\": \"" + mode + "\"}";
    ASSERT_TRUE(api_->Control((create ? "node node-a " : "relabel node-a ") + labels).ok());
  }

  void StartDaemon(Workload flag) {
    auto kubeconfig = api_->WriteKubeconfig(dir_.path() / "kubeconfig");
    ASSERT_TRUE(kubeconfig.ok()) << kubeconfig.status();
    auto reporter = kube::ConnectNodeReporter({.kubeconfig = *kubeconfig, .service_account_dir = {}, .node_name = "node-a"});
    ASSERT_TRUE(reporter.ok()) << reporter.status();
    DaemonOptions options = PassthroughDaemonOptions(*node_);
    options.serve.workload = flag;
    options.serve.vgpu_catalog_file = dir_.path() / "vgpu-catalog.txt";
    options.not_ready_interval = std::chrono::milliseconds(50);
    options.workload_label_interval = std::chrono::milliseconds(50);
    options.mode_retry = std::chrono::milliseconds(50);
    daemon_ = std::make_unique<Daemon>(options, *std::move(reporter));
    ASSERT_TRUE(daemon_->Start().ok());
  }

  bool WaitDrivers(const std::string& driver) {
    return WaitUntil([&] { return DriverOf(*node_, kGpuA) == driver && DriverOf(*node_, kGpuB) == driver; });
  }
  // The kubelet's view of the A10 resource: registered with `count` allocatable, or (count 0) gone from it.
  bool WaitA10(int count) {
    return node_->kubelet().WaitFor(
        [&](const kubeletsim::KubeletSim& kubelet) {
          auto resources = kubelet.Resources();
          auto it = resources.find(kA10);
          if (count == 0) return it == resources.end() || !it->second.registered || it->second.allocatable == 0;
          return it != resources.end() && it->second.registered && it->second.allocatable == count;
        },
        kPatience);
  }

  nlohmann::json Condition() {
    auto node = api_->Node("node-a");
    if (!node.ok()) return nlohmann::json::object();
    for (const auto& c : (*node)["status"].value("conditions", nlohmann::json::array())) {
      if (c.value("type", "") == kube::kConditionType) return c;
    }
    return nlohmann::json::object();
  }
  bool WaitCondition(const std::function<bool(const nlohmann::json&)>& holds) {
    return sim::KubeApiSim::WaitFor([&] { return holds(Condition()); });
  }
  // The notes of every event of `reason`, in the order stored.
  std::vector<std::string> Notes(const std::string& reason) {
    std::vector<std::string> notes;
    absl::StatusOr<nlohmann::json> events = api_->Events();
    if (!events.ok()) return notes;
    for (const nlohmann::json& event : *events) {
      if (event.value("reason", "") == reason) notes.push_back(event.value("note", ""));
    }
    return notes;
  }
  bool WaitNote(const std::string& reason, const std::string& part) {
    return sim::KubeApiSim::WaitFor([&] {
      for (const std::string& note : Notes(reason)) {
        if (note.find(part) != std::string::npos) return true;
      }
      return false;
    });
  }

  vfio_agent::testing::TempDir dir_{"va-mode-switch"};
  std::unique_ptr<Node> node_;
  std::unique_ptr<sim::KubeApiSim> api_;
  std::unique_ptr<Daemon> daemon_;
};

TEST_F(ModeSwitchTest, PassthroughToVgpuUnbindsTheGpusToNvidiaAndWithdrawsTheWholeGpuResource) {
  Label("vm-passthrough", true);
  StartDaemon(Workload::kVmPassthrough);
  ASSERT_TRUE(WaitDrivers("vfio-pci"));
  ASSERT_TRUE(WaitA10(2));

  Label("vm-vgpu");
  ASSERT_TRUE(WaitDrivers("nvidia")) << DriverOf(*node_, kGpuA) << " " << DriverOf(*node_, kGpuB);
  ASSERT_TRUE(WaitA10(0));
  ASSERT_TRUE(WaitNote("WorkloadModeChanged", "vm-passthrough -> vm-vgpu (node label nvidia.com/gpu.workload.config=vm-vgpu)"));
  EXPECT_TRUE(WaitNote("WorkloadModeChanged", "2 GPUs moved from vfio-pci to nvidia (0000:3b:00.0,0000:86:00.0)"));
  // No vGPU exists on these A10s yet: a ready vm-vgpu node with nothing to advertise.
  EXPECT_TRUE(WaitCondition([](const nlohmann::json& c) { return c.value("reason", "") == "NoSelectedDevices"; }))
      << Condition().dump();
  EXPECT_TRUE(Notes("GPUNotMoved").empty());
}

TEST_F(ModeSwitchTest, TheLabelWinsOverTheFlagAndVgpuToPassthroughBindsTheGpus) {
  Label("vm-vgpu", true);
  StartDaemon(Workload::kVmPassthrough);
  ASSERT_TRUE(WaitCondition([](const nlohmann::json& c) { return c.value("reason", "") == "NoSelectedDevices"; }))
      << Condition().dump();
  // vm-vgpu from the start: nothing was bound, no whole-GPU resource registered.
  EXPECT_EQ(DriverOf(*node_, kGpuA), "nvidia");
  EXPECT_EQ(DriverOf(*node_, kGpuB), "nvidia");
  EXPECT_FALSE(node_->kubelet().Resources().contains(kA10));
  EXPECT_TRUE(Notes("WorkloadModeChanged").empty()) << "the start's mode is no change";

  Label("vm-passthrough");
  ASSERT_TRUE(WaitDrivers("vfio-pci"));
  ASSERT_TRUE(WaitA10(2));
  ASSERT_TRUE(WaitNote("WorkloadModeChanged", "vm-vgpu -> vm-passthrough (node label nvidia.com/gpu.workload.config=vm-passthrough)"));
  EXPECT_TRUE(WaitCondition([](const nlohmann::json& c) { return c.value("status", "") == "True"; }))
      << Condition().dump();

  // The label removed: --workload's mode, which this already is.
  Label("");
  daemon_->ReconcileNow();
  daemon_->ReconcileNow();
  EXPECT_EQ(DriverOf(*node_, kGpuA), "vfio-pci");
  EXPECT_EQ(Notes("WorkloadModeChanged").size(), 1u);
}

TEST_F(ModeSwitchTest, AGpuWhoseGroupAVmHoldsStaysNamedInTheConditionAndMovesOnceReleased) {
  Label("vm-passthrough", true);
  StartDaemon(Workload::kVmPassthrough);
  ASSERT_TRUE(WaitDrivers("vfio-pci"));
  ASSERT_TRUE(WaitA10(2));
  auto vm = std::make_unique<vfio_agent::testing::HoldingProcess>(node_->options.paths.dev_root / "vfio" / "33");
  const std::string pid = "pid " + std::to_string(vm->pid());

  Label("vm-vgpu");
  ASSERT_TRUE(WaitUntil([&] { return DriverOf(*node_, kGpuB) == "nvidia"; }));
  ASSERT_TRUE(WaitCondition([&](const nlohmann::json& c) {
    return c.value("reason", "") == "WorkloadModeSwitchPending" &&
           c.value("message", "").find(std::string(kGpuA) + " held by " + pid) != std::string::npos;
  })) << Condition().dump();
  EXPECT_EQ(Condition().value("status", ""), "False");
  EXPECT_TRUE(WaitNote("GPUNotMoved", std::string("GPU ") + kGpuA + " stays on vfio-pci until its VM ends"));
  EXPECT_TRUE(WaitNote("WorkloadModeChanged", "1 GPUs moved from vfio-pci to nvidia (0000:86:00.0)"));
  // Passes go on while the VM runs; none moves the GPU from under it.
  daemon_->ReconcileNow();
  daemon_->ReconcileNow();
  EXPECT_EQ(DriverOf(*node_, kGpuA), "vfio-pci");

  vm.reset();  // the VM ends; nothing else tells the agent
  ASSERT_TRUE(WaitUntil([&] { return DriverOf(*node_, kGpuA) == "nvidia"; }));
  EXPECT_TRUE(WaitCondition([](const nlohmann::json& c) { return c.value("reason", "") == "NoSelectedDevices"; }))
      << Condition().dump();
  EXPECT_TRUE(WaitNote("GPUMoved", "1 GPUs moved from vfio-pci to nvidia (0000:3b:00.0)"));
}

TEST_F(ModeSwitchTest, AGpuAssignedToAPodStaysAndTheConditionNamesThePod) {
  Label("vm-passthrough", true);
  StartDaemon(Workload::kVmPassthrough);
  ASSERT_TRUE(WaitA10(2));
  auto pod = node_->kubelet().Admit({.name = "vm-a", .limits = {{kA10, 1}}, .pod_namespace = "tenant"});
  ASSERT_TRUE(pod.ok()) << pod.status();
  ASSERT_EQ(pod->devices[kA10].size(), 1u);
  const std::string held = pod->devices[kA10].front();
  const std::string free = held == kGpuA ? kGpuB : kGpuA;

  Label("vm-vgpu");
  ASSERT_TRUE(WaitUntil([&] { return DriverOf(*node_, free) == "nvidia"; }));
  ASSERT_TRUE(WaitCondition([&](const nlohmann::json& c) {
    return c.value("message", "").find(held + " held by pod tenant/vm-a") != std::string::npos;
  })) << Condition().dump();
  EXPECT_EQ(DriverOf(*node_, held), "vfio-pci");

  node_->kubelet().Release("vm-a");
  ASSERT_TRUE(WaitUntil([&] { return DriverOf(*node_, held) == "nvidia"; }));
  EXPECT_TRUE(WaitCondition([](const nlohmann::json& c) { return c.value("status", "") == "True"; }))
      << Condition().dump();
}

// The host driver refuses a GPU once it is off vfio-pci: the move is a Warning naming where it ended.
TEST_F(ModeSwitchTest, AGpuThatDoesNotEndOnNvidiaIsAWarning) {
  Label("vm-passthrough", true);
  StartDaemon(Workload::kVmPassthrough);
  ASSERT_TRUE(WaitDrivers("vfio-pci"));
  ASSERT_TRUE(node_->Control(std::string("bind-errno ") + kGpuA + " EIO").ok());  // nvidia's probe fails

  Label("vm-vgpu");
  ASSERT_TRUE(WaitUntil([&] { return DriverOf(*node_, kGpuB) == "nvidia"; }));
  ASSERT_TRUE(WaitNote("GPUNotMoved", std::string(kGpuA) + " left vfio-pci but is on no driver, not nvidia"));
  EXPECT_EQ(DriverOf(*node_, kGpuA), "");
  EXPECT_TRUE(WaitNote("WorkloadModeChanged", "1 GPUs moved from vfio-pci to nvidia (0000:86:00.0)"));
}

TEST_F(ModeSwitchTest, AnUnknownLabelValueIsAWarningAndTheModeStays) {
  // vm-vgpu from the label, --workload saying vm-passthrough: staying means neither taking the flag's mode.
  Label("vm-vgpu", true);
  StartDaemon(Workload::kVmPassthrough);
  ASSERT_TRUE(WaitCondition([](const nlohmann::json& c) { return c.value("reason", "") == "NoSelectedDevices"; }))
      << Condition().dump();

  Label("container");  // the GPU Operator's value for container workloads
  ASSERT_TRUE(WaitNote("WorkloadModeUnknown", "nvidia.com/gpu.workload.config=container is not a mode this agent serves"));
  EXPECT_THAT(Notes("WorkloadModeUnknown").front(), HasSubstr("staying in vm-vgpu"));
  daemon_->ReconcileNow();
  EXPECT_EQ(DriverOf(*node_, kGpuA), "nvidia");
  EXPECT_EQ(DriverOf(*node_, kGpuB), "nvidia");
  EXPECT_FALSE(node_->kubelet().Resources().contains(kA10));
  EXPECT_TRUE(Notes("WorkloadModeChanged").empty());
  EXPECT_EQ(Condition().value("reason", ""), "NoSelectedDevices");
}

}  // namespace
}  // namespace vfio_agent::daemon::testing
