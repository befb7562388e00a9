// `run --workload vm-vgpu --vgpu-config-file` in process, on the FUSE simulator's mdev node under the kubelet
// simulator and the fake API server: the node label picks the config, the agent creates its vGPUs and advertises
// them, writes nvidia.com/vgpu.config.state, keeps a vGPU a VM holds (pending) and finishes the change by itself
// once the VM lets go. The label nvidia.com/gpu.workload.config turning vm-passthrough binds the GPUs, except one
// whose vGPU a VM holds.
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kube_api_sim.h"
#include "kubelet_sim.h"
#include "sim_process.h"
#include "support/fuse.h"
#include "support/holding_process.h"
#include "support/sysfs_tree.h"
#include "support/wait.h"
#include "vfio_gpu_agent/daemon/daemon.h"
#include "vfio_gpu_agent/kube/node_reporter.h"
#include "vgpu/profile_configs.h"
#include "vgpu_daemon.h"

namespace vfio_agent::daemon {
namespace {

using ::testing::HasSubstr;

class VgpuConfigRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!vfio_agent::testing::FuseAvailable()) GTEST_SKIP() << vfio_agent::testing::kNeedsFuse;
    if (!sim::KubeApiSim::Available()) GTEST_SKIP() << "python3 missing";
    auto sysfs = sim::SimProcess::Start(sim::NodeFile("vgpu-mdev-t4-a10.json"), dir_.path() / "root");
    ASSERT_TRUE(sysfs.ok()) << sysfs.status();
    sysfs_ = *std::move(sysfs);
    auto api = sim::KubeApiSim::Start(dir_.path());
    ASSERT_TRUE(api.ok()) << api.status();
    api_ = *std::move(api);
    std::ofstream(dir_.path() / "vgpu-config.yaml") << vfio_agent::testing::kSimNodeProfileConfigs;
  }

  void Label(const std::string& config) {
    const std::string labels = config.empty() ? "{}" : "{\"" + std::string(kVgpuConfigLabel) + "\": \"" + config + "\"}";
    ASSERT_TRUE(api_->Control("node node-a " + labels).ok());
  }

  void StartDaemon(const std::string& default_config) {
    kubeletsim::Options kubelet_options;
    kubelet_options.dir = dir_.path() / "device-plugins";
    kubelet_options.pod_resources_socket = dir_.path() / "pod-resources.sock";
    kubelet_ = std::make_unique<kubeletsim::KubeletSim>(kubelet_options);
    ASSERT_TRUE(kubelet_->Start().ok());

    auto kubeconfig = api_->WriteKubeconfig(dir_.path() / "kubeconfig");
    ASSERT_TRUE(kubeconfig.ok()) << kubeconfig.status();
    auto reporter = kube::ConnectNodeReporter({.kubeconfig = *kubeconfig, .service_account_dir = {}, .node_name = "node-a"});
    ASSERT_TRUE(reporter.ok()) << reporter.status();

    DaemonOptions options =
        testing::VgpuDaemonOptions(sysfs_->sysfs_root(), sysfs_->dev_root(), kubelet_options, dir_.path() / "state");
    options.vgpu_config_file = dir_.path() / "vgpu-config.yaml";
    options.vgpu_config = default_config;
    options.vgpu_retry = std::chrono::milliseconds(100);
    // A flip of the workload label seen at once (by the poll too); binds with deadlines a loaded machine meets.
    options.workload_label_interval = label_interval_;
    options.resync_interval = resync_interval_;
    options.mode_retry = std::chrono::milliseconds(100);
    options.bind.write_timeout = absl::Seconds(30);
    options.bind.devnode_wait = absl::Seconds(30);
    daemon_ = std::make_unique<Daemon>(options, *std::move(reporter));
    ASSERT_TRUE(daemon_->Start().ok());
  }

  bool WaitAllocatable(const std::string& resource, int count) {
    return kubelet_->WaitFor(
        [&](const kubeletsim::KubeletSim& k) {
          auto resources = k.Resources();
          auto it = resources.find(resource);
          return it != resources.end() && it->second.registered && it->second.allocatable == count;
        },
        std::chrono::seconds(30));
  }

  std::string StateLabel() {
    absl::StatusOr<nlohmann::json> node = api_->Node("node-a");
    if (!node.ok()) return "";
    return (*node)["metadata"]["labels"].value(kVgpuConfigStateLabel, "");
  }

  bool WaitState(const std::string& state) {
    return sim::KubeApiSim::WaitFor([&] { return StateLabel() == state; });
  }

  // The first event of `reason`; null when there is none.
  nlohmann::json EventOf(const std::string& reason) {
    absl::StatusOr<nlohmann::json> events = api_->Events();
    if (!events.ok()) return nullptr;
    for (const nlohmann::json& event : *events) {
      if (event.value("reason", "") == reason) return event;
    }
    return nullptr;
  }

  bool WaitEvent(const std::string& reason) {
    return sim::KubeApiSim::WaitFor([&] { return !EventOf(reason).is_null(); });
  }

  // The node's GPUPassthroughReady condition message; "" until written.
  std::string ConditionMessage() {
    absl::StatusOr<nlohmann::json> node = api_->Node("node-a");
    if (!node.ok()) return "";
    for (const auto& c : (*node)["status"].value("conditions", nlohmann::json::array())) {
      if (c.value("type", "") == kube::kConditionType) return c.value("message", "");
    }
    return "";
  }

  std::string DriverOf(const std::string& bdf) {
    std::error_code error;
    const auto link = std::filesystem::read_symlink(sysfs_->sysfs_root() / "bus/pci/devices" / bdf / "driver", error);
    return error ? "" : link.filename().string();
  }

  // The number of one group node of an mdev (the T4's vGPUs are the only numbered group nodes of this node).
  std::string MdevGroup() {
    std::string group;
    for (const auto& entry : std::filesystem::directory_iterator(sysfs_->dev_root() / "vfio")) {
      const std::string name = entry.path().filename().string();
      if (name != "vfio" && name != "devices" && name != "33" && name != "77") group = name;
    }
    return group;
  }

  // How many requests to the node list/watch path (/api/v1/nodes, without a node name) the server answered.
  size_t ListAndWatchRequests() const {
    size_t count = 0;
    for (const sim::KubeApiRequest& request : api_->Log()) count += request.path == "/api/v1/nodes";
    return count;
  }

  std::chrono::milliseconds label_interval_{50};
  std::chrono::milliseconds resync_interval_{60000};
  vfio_agent::testing::TempDir dir_{"va-vgpu-config"};
  std::unique_ptr<sim::SimProcess> sysfs_;
  std::unique_ptr<sim::KubeApiSim> api_;
  std::unique_ptr<kubeletsim::KubeletSim> kubelet_;
  std::unique_ptr<Daemon> daemon_;
};

TEST_F(VgpuConfigRunTest, TheNodeLabelPicksTheConfigAndAHeldVgpuIsChangedOnceItsVmEnds) {
  Label("t4-1q-2");
  StartDaemon("t4-2q-10");  // the label wins over --vgpu-config
  ASSERT_TRUE(WaitAllocatable("nvidia.com/GRID_T4-1Q", 2));
  ASSERT_TRUE(WaitState("success")) << StateLabel();
  ASSERT_TRUE(WaitEvent("VgpuConfigApplied"));
  EXPECT_THAT(EventOf("VgpuConfigApplied").value("note", ""), HasSubstr("vGPU config 't4-1q-2' applied"));

  // A VM runs on one of the two vGPUs: the mdevs' group nodes are the only numbered ones on this node.
  std::string group;
  for (const auto& entry : std::filesystem::directory_iterator(sysfs_->dev_root() / "vfio")) {
    const std::string name = entry.path().filename().string();
    if (name != "vfio" && name != "devices") group = name;
  }
  ASSERT_FALSE(group.empty());
  auto vm = std::make_unique<vfio_agent::testing::HoldingProcess>(sysfs_->dev_root() / "vfio" / group);

  Label("t4-2q-2");
  daemon_->ReconcileNow();
  ASSERT_TRUE(WaitState("pending")) << StateLabel();
  ASSERT_TRUE(WaitEvent("VgpuConfigPending"));
  const std::string note = EventOf("VgpuConfigPending").value("note", "");
  EXPECT_THAT(note, HasSubstr("GPU 0000:3b:00.0 waits for a VM to free"));
  EXPECT_THAT(note, HasSubstr("pid " + std::to_string(vm->pid())));
  EXPECT_TRUE(std::filesystem::exists(sysfs_->dev_root() / "vfio" / group));  // never removed under the VM

  vm.reset();  // the VM ends; nothing else tells the agent
  ASSERT_TRUE(WaitState("success")) << StateLabel();
  ASSERT_TRUE(WaitAllocatable("nvidia.com/GRID_T4-2Q", 2));
}

// The pass that creates the vGPUs says so once; the converged passes after it send no second event.
TEST_F(VgpuConfigRunTest, TheChangeIsOneEventAndConvergedPassesRepeatNothing) {
  Label("t4-1q-2");
  StartDaemon("");
  ASSERT_TRUE(WaitAllocatable("nvidia.com/GRID_T4-1Q", 2));
  ASSERT_TRUE(WaitEvent("VgpuConfigApplied"));
  EXPECT_THAT(EventOf("VgpuConfigApplied").value("note", ""), HasSubstr("(2 vGPUs created, 0 removed)"));
  daemon_->ReconcileNow();
  daemon_->ReconcileNow();
  // The reporter sends events in order: once the next config's event is stored, any repeat of the first is too.
  Label("t4-2q-2");
  daemon_->ReconcileNow();
  auto applied = [&](const std::string& config) {
    absl::StatusOr<nlohmann::json> events = api_->Events();
    int count = 0;
    for (const nlohmann::json& event : events.ok() ? *events : nlohmann::json::array()) {
      if (event.value("reason", "") == "VgpuConfigApplied" &&
          event.value("note", "").find("'" + config + "' applied") != std::string::npos) {
        count += event.contains("series") ? event["series"].value("count", 1) : 1;
      }
    }
    return count;
  };
  ASSERT_TRUE(sim::KubeApiSim::WaitFor([&] { return applied("t4-2q-2") > 0; }));
  EXPECT_EQ(applied("t4-1q-2"), 1);
}

TEST_F(VgpuConfigRunTest, AFailureIsTheStateLabelAndAWarningNamingTheDeviceAndTheReason) {
  StartDaemon("t4-2q-10");  // no label: --vgpu-config; a T4 holds 8 T4-2Q
  ASSERT_TRUE(WaitState("failed")) << StateLabel();
  ASSERT_TRUE(WaitEvent("VgpuConfigFailed"));
  const nlohmann::json event = EventOf("VgpuConfigFailed");
  EXPECT_EQ(event.value("type", ""), "Warning");
  EXPECT_THAT(event.value("note", ""), HasSubstr("GPU 0000:3b:00.0: card 0000:3b:00.0 cannot hold 10x T4-2Q"));
  EXPECT_THAT(event.value("note", ""), HasSubstr("T4-2Q (nvidia-231, max_instance 8): wanted 10, possible 8"));
  for (const std::string& line : sysfs_->Log()) EXPECT_THAT(line, ::testing::Not(HasSubstr("mdev-create")));
}

// A relabel to a config the cards cannot hold (32 T4-1Q where a T4 holds 16) leaves the vGPUs the node has: the
// four T4-4Q stay, made and advertised, and nothing is removed or created.
TEST_F(VgpuConfigRunTest, AConfigThatCannotFitLeavesTheCardsAsTheyWere) {
  Label("t4-4q-4");
  StartDaemon("");
  ASSERT_TRUE(WaitAllocatable("nvidia.com/GRID_T4-4Q", 4));
  ASSERT_TRUE(WaitState("success")) << StateLabel();
  const size_t writes = sysfs_->Log().size();

  Label("t4-1q-32");
  daemon_->ReconcileNow();
  ASSERT_TRUE(WaitState("failed")) << StateLabel();
  ASSERT_TRUE(WaitEvent("VgpuConfigFailed"));
  EXPECT_THAT(EventOf("VgpuConfigFailed").value("note", ""),
              HasSubstr("T4-1Q (nvidia-230, max_instance 16): wanted 32, possible 16"));
  const std::vector<std::string> log = sysfs_->Log();
  for (size_t i = writes; i < log.size(); ++i) ADD_FAILURE() << "written for a config that cannot fit: " << log[i];
  EXPECT_TRUE(WaitAllocatable("nvidia.com/GRID_T4-4Q", 4));
}

// The node turns vm-passthrough (the workload label) while a VM runs on one of the T4's vGPUs: the A10 is bound at
// once, the T4 stays on nvidia (binding it would take its vGPUs with it) and the condition names the VM's process
// until it ends; then the T4 is bound by itself.
TEST_F(VgpuConfigRunTest, AGpuWhoseVgpuAVmHoldsStaysOnNvidiaWhenTheNodeTurnsPassthrough) {
  const std::string vgpu_labels = std::string("{\"") + kVgpuConfigLabel + "\": \"t4-1q-2\", \"" + kWorkloadLabel + "\": ";
  ASSERT_TRUE(api_->Control("node node-a " + vgpu_labels + "\"vm-vgpu\"}").ok());
  StartDaemon("");
  ASSERT_TRUE(WaitAllocatable("nvidia.com/GRID_T4-1Q", 2));
  const std::string group = MdevGroup();
  ASSERT_FALSE(group.empty());
  auto vm = std::make_unique<vfio_agent::testing::HoldingProcess>(sysfs_->dev_root() / "vfio" / group);

  ASSERT_TRUE(WaitState("success")) << StateLabel();
  ASSERT_TRUE(api_->Control("relabel node-a " + vgpu_labels + "\"vm-passthrough\", \"" + kVgpuConfigStateLabel +
                            "\": \"success\"}").ok());
  ASSERT_TRUE(vfio_agent::testing::WaitUntil([&] { return DriverOf("0000:86:00.0") == "vfio-pci"; }));
  // No vGPU config on a passthrough node: the state label goes.
  EXPECT_TRUE(sim::KubeApiSim::WaitFor([&] {
    absl::StatusOr<nlohmann::json> node = api_->Node("node-a");
    return node.ok() && !(*node)["metadata"]["labels"].contains(kVgpuConfigStateLabel);
  })) << StateLabel();
  ASSERT_TRUE(sim::KubeApiSim::WaitFor([&] {
    return ConditionMessage().find("0000:3b:00.0 stays on nvidia until its VM ends: a vGPU of it is held by pid " +
                                   std::to_string(vm->pid())) != std::string::npos;
  })) << ConditionMessage();
  ASSERT_TRUE(WaitEvent("GPUNotMoved"));
  EXPECT_THAT(EventOf("GPUNotMoved").value("note", ""), HasSubstr("GPU 0000:3b:00.0 stays on nvidia until its VM ends"));
  EXPECT_EQ(DriverOf("0000:3b:00.0"), "nvidia");
  EXPECT_TRUE(std::filesystem::exists(sysfs_->dev_root() / "vfio" / group));  // the VM's vGPU is still there

  vm.reset();  // the VM ends
  ASSERT_TRUE(vfio_agent::testing::WaitUntil([&] { return DriverOf("0000:3b:00.0") == "vfio-pci"; }));
  EXPECT_TRUE(sim::KubeApiSim::WaitFor([&] { return ConditionMessage().find("held by") == std::string::npos; }))
      << ConditionMessage();
}

// Polls of the labels and the periodic pass an hour apart: only the agent's watch of its Node can start the passes
// that act on a relabel, of the vGPU config and of the workload mode.
TEST_F(VgpuConfigRunTest, ARelabelIsActedOnAtOnceThroughTheNodeWatch) {
  label_interval_ = std::chrono::hours(1);
  resync_interval_ = std::chrono::hours(1);
  const std::string vgpu_labels = std::string("{\"") + kVgpuConfigLabel + "\": \"";
  const std::string mode = std::string("\", \"") + kWorkloadLabel + "\": \"";
  ASSERT_TRUE(api_->Control("node node-a " + vgpu_labels + "t4-1q-2" + mode + "vm-vgpu\"}").ok());
  StartDaemon("");
  ASSERT_TRUE(WaitAllocatable("nvidia.com/GRID_T4-1Q", 2));
  ASSERT_TRUE(WaitState("success")) << StateLabel();
  ASSERT_TRUE(api_->Control("relabel node-a " + vgpu_labels + "t4-2q-2" + mode + "vm-vgpu\"}").ok());
  EXPECT_TRUE(WaitAllocatable("nvidia.com/GRID_T4-2Q", 2));
  ASSERT_TRUE(api_->Control("relabel node-a " + vgpu_labels + "t4-2q-2" + mode + "vm-passthrough\"}").ok());
  EXPECT_TRUE(vfio_agent::testing::WaitUntil([&] { return DriverOf("0000:86:00.0") == "vfio-pci"; }));
}

// etcd compacted the node's history: the watch ends with 410 Gone, the agent lists the node again and watches
// from there, and the next relabel is still acted on at once.
TEST_F(VgpuConfigRunTest, AfterA410TheWatchListsAgainAndSeesTheNextRelabel) {
  label_interval_ = std::chrono::hours(1);
  resync_interval_ = std::chrono::hours(1);
  Label("t4-1q-2");
  StartDaemon("");
  ASSERT_TRUE(WaitState("success")) << StateLabel();
  ASSERT_TRUE(sim::KubeApiSim::WaitFor([&] { return ListAndWatchRequests() >= 2; }));  // a list, then its watch
  const size_t before = ListAndWatchRequests();
  ASSERT_TRUE(api_->Control("compact").ok());
  ASSERT_TRUE(sim::KubeApiSim::WaitFor([&] { return ListAndWatchRequests() >= before + 2; }));  // list, watch
  Label("t4-2q-2");
  EXPECT_TRUE(WaitAllocatable("nvidia.com/GRID_T4-2Q", 2));
}

// Not a check: the time from a relabel to the agent's first write for it, with the shipped poll intervals (30 s
// label poll, 60 s periodic pass); run by hand with --gtest_also_run_disabled_tests (tests/bench/README.md).
TEST_F(VgpuConfigRunTest, DISABLED_MeasureRelabelToAction) {
  label_interval_ = std::chrono::seconds(30);
  Label("t4-1q-2");
  StartDaemon("");
  ASSERT_TRUE(WaitState("success")) << StateLabel();
  for (int run = 0; run < 3; ++run) {
    const std::string config = run % 2 == 0 ? "t4-2q-2" : "t4-1q-2";
    const size_t writes = sysfs_->Log().size();
    const auto start = std::chrono::steady_clock::now();
    Label(config);
    ASSERT_TRUE(vfio_agent::testing::WaitUntil([&] { return sysfs_->Log().size() > writes; },
                                               std::chrono::seconds(90)));
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    std::cout << "vgpu.config relabel -> first write: " << ms.count() << " ms\n";
    ASSERT_TRUE(WaitAllocatable(config == "t4-2q-2" ? "nvidia.com/GRID_T4-2Q" : "nvidia.com/GRID_T4-1Q", 2));
  }
  for (int run = 0; run < 3; ++run) {
    const std::string mode = run % 2 == 0 ? "vm-passthrough" : "vm-vgpu";
    const size_t writes = sysfs_->Log().size();
    const auto start = std::chrono::steady_clock::now();
    ASSERT_TRUE(api_->Control("node node-a {\"" + std::string(kWorkloadLabel) + "\": \"" + mode + "\"}").ok());
    ASSERT_TRUE(vfio_agent::testing::WaitUntil([&] { return sysfs_->Log().size() > writes; },
                                               std::chrono::seconds(90)));
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    std::cout << "workload relabel to " << mode << " -> first write: " << ms.count() << " ms\n";
    ASSERT_TRUE(vfio_agent::testing::WaitUntil([&] {
      return DriverOf("0000:86:00.0") == (mode == "vm-vgpu" ? "nvidia" : "vfio-pci");
    }, std::chrono::seconds(90)));
  }
}

}  // namespace
}  // namespace vfio_agent::daemon
