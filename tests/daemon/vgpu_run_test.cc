// `run --workload vm-vgpu` in process: nothing is bound, the vGPUs are served, readiness is the kubelet's side
// of them, and a VM pod is admitted with the environment and device nodes KubeVirt reads. On a plain tree
// (the FUSE simulator has no mdevs yet) under the kubelet simulator.
#include <fstream>
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kubelet_sim.h"
#include "support/sysfs_tree.h"
#include "support/wait.h"
#include "vfio_gpu_agent/daemon/daemon.h"
#include "vgpu/vgpu_tree.h"

namespace vfio_agent::daemon {
namespace {

namespace vt = vfio_agent::testing::vgpu_tree;

TEST(VgpuRunTest, ServesMdevsBindsNothingAndAdmitsAVmPod) {
  constexpr char kParent[] = "0000:3b:00.0";
  constexpr char kMdevA[] = "1b7e5c3a-0f4d-4a57-9b0e-3c8f1d2a6b01";
  constexpr char kMdevB[] = "9a0c2e4f-6b8d-4f1a-8c3e-5d7f9b1a3c02";
  vfio_agent::testing::TempDir dir("va-vgpu-run");
  vfio_agent::testing::SysfsTree tree(dir.path() / "sys");
  tree.AddDevice({.bdf = kParent, .device = 0x1eb8, .numa_node = 0, .driver = "nvidia", .iommu_group = 12});
  vt::AddMdevParent(tree, kParent, {{"nvidia-222", "GRID T4-1Q", 14}});
  vt::AddMdev(tree, kMdevA, kParent, "nvidia-222", 100);
  vt::AddMdev(tree, kMdevB, kParent, "nvidia-222", 101);
  std::filesystem::create_directories(dir.path() / "dev/vfio");
  for (const char* node : {"vfio/vfio", "vfio/100", "vfio/101"}) std::ofstream(dir.path() / "dev" / node) << "";

  kubeletsim::Options kubelet_options;
  kubelet_options.dir = dir.path() / "device-plugins";
  kubelet_options.pod_resources_socket = dir.path() / "pod-resources.sock";
  kubeletsim::KubeletSim kubelet(kubelet_options);
  ASSERT_TRUE(kubelet.Start().ok());

  DaemonOptions options;
  options.serve.paths.sysfs_root = tree.root();
  options.serve.paths.dev_root = dir.path() / "dev";
  options.serve.paths.kubelet_dir = kubelet_options.dir;
  options.serve.paths.pod_resources_socket = kubelet_options.pod_resources_socket;
  options.serve.udev = false;
  options.serve.workload = Workload::kVmVgpu;
  options.serve.vgpu_catalog_file = dir.path() / "state/vgpu-catalog.txt";
  options.bind.paths = options.serve.paths;
  options.health_port = 0;
  options.metrics_port = 0;
  options.not_ready_interval = std::chrono::milliseconds(50);
  Daemon daemon(options, nullptr);
  ASSERT_TRUE(daemon.Start().ok());

  ASSERT_TRUE(kubelet.WaitFor(
      [](const kubeletsim::KubeletSim& k) {
        auto resources = k.Resources();
        auto it = resources.find("nvidia.com/GRID_T4-1Q");
        return it != resources.end() && it->second.registered && it->second.allocatable == 2;
      },
      std::chrono::seconds(30)));
  Readiness state;
  ASSERT_TRUE(vfio_agent::testing::WaitUntil([&] {
    daemon.ReconcileNow();
    state = daemon.State();
    return state.ready;
  })) << state.check_id << ": " << state.message;
  EXPECT_EQ(state.reason, "AllDevicesReady");
  EXPECT_THAT(state.message, ::testing::HasSubstr("2 vGPUs healthy, registered and allocatable"));

  absl::StatusOr<kubeletsim::AdmittedPod> pod =
      kubelet.Admit({.name = "virt-launcher-vm1", .limits = {{"nvidia.com/GRID_T4-1Q", 2}}});
  ASSERT_TRUE(pod.ok()) << pod.status();
  const ::v1beta1::ContainerAllocateResponse& response = pod->responses.at("nvidia.com/GRID_T4-1Q");
  ASSERT_EQ(response.envs_size(), 1);
  EXPECT_EQ(response.envs().at("MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-1Q"), std::string(kMdevA) + "," + kMdevB);
  ASSERT_EQ(response.devices_size(), 3);
  const char* expected[] = {"/dev/vfio/vfio", "/dev/vfio/100", "/dev/vfio/101"};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(response.devices(i).host_path(), expected[i]);
    EXPECT_EQ(response.devices(i).container_path(), expected[i]);
    EXPECT_EQ(response.devices(i).permissions(), "mrw");
  }
  EXPECT_EQ(response.mounts_size(), 0);

  // Nothing was bound or unbound: the vGPU manager keeps its GPU.
  EXPECT_EQ(std::filesystem::read_symlink(tree.DeviceDir(kParent) / "driver").filename(), "nvidia");
  daemon.Stop();
  EXPECT_EQ(std::filesystem::read_symlink(tree.DeviceDir(kParent) / "driver").filename(), "nvidia");
}

}  // namespace
}  // namespace vfio_agent::daemon
