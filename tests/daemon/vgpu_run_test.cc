// `run --workload vm-vgpu` in process: nothing is bound, the vGPUs are served, readiness is the kubelet's side
// of them, and a VM pod is admitted with the environment and device nodes KubeVirt reads. On a plain tree
// (the FUSE simulator has no vGPUs yet) under the kubelet simulator.
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kubelet_sim.h"
#include "support/sysfs_tree.h"
#include "support/wait.h"
#include "vfio_gpu_agent/daemon/daemon.h"
#include "vgpu/vgpu_tree.h"
#include "vgpu_daemon.h"

namespace vfio_agent::daemon {
namespace {

namespace vt = vfio_agent::testing::vgpu_tree;

class VgpuRunTest : public ::testing::Test {
 protected:
  VgpuRunTest() : tree_(dir_.path() / "sys") {
    std::filesystem::create_directories(dir_.path() / "dev/vfio/devices");
    Node("vfio/vfio");
  }

  void Node(const std::string& relative) { std::ofstream(dir_.path() / "dev" / relative) << ""; }

  // The kubelet, then the daemon; returns once `resource` is registered with `count` allocatable and the
  // daemon says ready.
  void StartAndWaitReady(const std::string& resource, int count) {
    kubeletsim::Options kubelet_options;
    kubelet_options.dir = dir_.path() / "device-plugins";
    kubelet_options.pod_resources_socket = dir_.path() / "pod-resources.sock";
    kubelet_ = std::make_unique<kubeletsim::KubeletSim>(kubelet_options);
    ASSERT_TRUE(kubelet_->Start().ok());

    const DaemonOptions options =
        testing::VgpuDaemonOptions(tree_.root(), dir_.path() / "dev", kubelet_options, dir_.path() / "state");
    daemon_ = std::make_unique<Daemon>(options, nullptr);
    ASSERT_TRUE(daemon_->Start().ok());

    ASSERT_TRUE(kubelet_->WaitFor(
        [&](const kubeletsim::KubeletSim& k) {
          auto resources = k.Resources();
          auto it = resources.find(resource);
          return it != resources.end() && it->second.registered && it->second.allocatable == count;
        },
        std::chrono::seconds(30)));
    Readiness state;
    ASSERT_TRUE(vfio_agent::testing::WaitUntil([&] {
      daemon_->ReconcileNow();
      state = daemon_->State();
      return state.ready;
    })) << state.check_id << ": " << state.message;
    EXPECT_EQ(state.reason, "AllDevicesReady");
    EXPECT_THAT(state.message, ::testing::HasSubstr(std::to_string(count) + " vGPUs healthy, registered and allocatable"));
  }

  // Admits a VM pod of `count` vGPUs of `resource`; the plugin's answer, checked node for node ("mrw" each).
  void ExpectAdmitted(const std::string& resource, int count, const std::string& env_name, const std::string& env_value,
                      const std::vector<std::string>& nodes) {
    absl::StatusOr<kubeletsim::AdmittedPod> pod = kubelet_->Admit({.name = "virt-launcher-vm1", .limits = {{resource, count}}});
    ASSERT_TRUE(pod.ok()) << pod.status();
    const ::v1beta1::ContainerAllocateResponse& response = pod->responses.at(resource);
    ASSERT_EQ(response.envs_size(), 1);
    EXPECT_EQ(response.envs().at(env_name), env_value);
    std::vector<std::string> got;
    for (const auto& device : response.devices()) {
      EXPECT_EQ(device.host_path(), device.container_path());
      EXPECT_EQ(device.permissions(), "mrw");
      got.push_back(device.host_path());
    }
    EXPECT_EQ(got, nodes);
    EXPECT_EQ(response.mounts_size(), 0);
  }

  std::string DriverOf(const std::string& bdf) const {
    return std::filesystem::read_symlink(tree_.DeviceDir(bdf) / "driver").filename().string();
  }

  vfio_agent::testing::TempDir dir_{"va-vgpu-run"};
  vfio_agent::testing::SysfsTree tree_;
  std::unique_ptr<kubeletsim::KubeletSim> kubelet_;
  std::unique_ptr<Daemon> daemon_;
};

TEST_F(VgpuRunTest, ServesMdevsBindsNothingAndAdmitsAVmPod) {
  constexpr char kParent[] = "0000:3b:00.0";
  constexpr char kMdevA[] = "1b7e5c3a-0f4d-4a57-9b0e-3c8f1d2a6b01";
  constexpr char kMdevB[] = "9a0c2e4f-6b8d-4f1a-8c3e-5d7f9b1a3c02";
  tree_.AddDevice({.bdf = kParent, .device = 0x1eb8, .numa_node = 0, .driver = "nvidia", .iommu_group = 12});
  vt::AddMdevParent(tree_, kParent, {{"nvidia-222", "GRID T4-1Q", 14}});
  vt::AddMdev(tree_, kMdevA, kParent, "nvidia-222", 100);
  vt::AddMdev(tree_, kMdevB, kParent, "nvidia-222", 101);
  Node("vfio/100");
  Node("vfio/101");
  StartAndWaitReady("nvidia.com/GRID_T4-1Q", 2);
  ExpectAdmitted("nvidia.com/GRID_T4-1Q", 2, "MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-1Q",
                 std::string(kMdevA) + "," + kMdevB, {"/dev/vfio/vfio", "/dev/vfio/100", "/dev/vfio/101"});
  // Nothing was bound or unbound: the vGPU manager keeps its GPU.
  EXPECT_EQ(DriverOf(kParent), "nvidia");
  daemon_->Stop();
  EXPECT_EQ(DriverOf(kParent), "nvidia");
}

TEST_F(VgpuRunTest, ServesSriovVgpusBindsNothingAndAdmitsAVmPod) {
  constexpr char kPf[] = "0000:5e:00.0";
  constexpr char kVf[] = "0000:5e:00.4";
  tree_.AddDevice({.bdf = kPf, .device = 0x2335, .numa_node = 1, .driver = "nvidia", .iommu_group = 20});
  vt::SetCreatableTypes(tree_, kPf, "ID    : vGPU Name\n1414 : NVIDIA H200X-1-18C\n");
  tree_.AddDevice({.bdf = kVf, .device = 0x2335, .driver = "nvidia", .iommu_group = 21, .physfn = kPf});
  vt::SetVgpuType(tree_, kVf, "1414\n");
  Node("vfio/21");
  StartAndWaitReady("nvidia.com/NVIDIA_H200X-1-18C", 1);
  ExpectAdmitted("nvidia.com/NVIDIA_H200X-1-18C", 1, "PCI_RESOURCE_NVIDIA_COM_NVIDIA_H200X-1-18C", kVf,
                 {"/dev/vfio/vfio", "/dev/vfio/21"});
  EXPECT_EQ(DriverOf(kPf), "nvidia");
  EXPECT_EQ(DriverOf(kVf), "nvidia");
  daemon_->Stop();
  EXPECT_EQ(DriverOf(kVf), "nvidia");
}

}  // namespace
}  // namespace vfio_agent::daemon
