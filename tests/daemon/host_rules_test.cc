// Host rules the daemon relies on, checked where the binder and the plugin meet.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sim_process.h"
#include "support/sysfs_tree.h"
#include "vfio_gpu_agent/binding/binder.h"
#include "vfio_gpu_agent/daemon/daemon.h"
#include "vfio_gpu_agent/plugin/devices.h"

namespace vfio_agent::daemon {
namespace {

// A host with iommufd and no legacy group nodes: /dev/iommu and /dev/vfio/devices/vfioN only. The
// simulated kernel binds for real; the agent looks at a dev root of that shape (the sim's own dev tree
// always has group nodes).
TEST(HostRulesTest, IommufdOnlyHostBindSucceedsAndThePluginAgrees) {
  vfio_agent::testing::TempDir dir("va-iommufd");
  auto sim = sim::SimProcess::Start(sim::NodeFile("a10x2-nvidia.json"), dir.path() / "node");
  ASSERT_TRUE(sim.ok()) << sim.status();
  const auto dev = dir.path() / "dev";
  std::filesystem::create_directories(dev / "vfio/devices");
  std::ofstream(dev / "iommu") << "";
  std::ofstream(dev / "vfio/vfio") << "";
  // Every cdev name the kernel may give (lowest free index).
  for (int i = 0; i < 8; ++i) std::ofstream(dev / "vfio/devices" / ("vfio" + std::to_string(i))) << "";

  binding::BinderOptions options;
  options.targets = binding::Targets::EverySelected();
  options.paths.sysfs_root = (*sim)->sysfs_root();
  options.paths.dev_root = dev;
  options.devnode_wait = absl::Seconds(5);
  auto report = binding::Bind(options);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_FALSE(report->devices.empty());
  for (const auto& device : report->devices) {
    EXPECT_EQ(device.outcome, binding::Outcome::kBound) << device.bdf << ": " << device.reason;
  }
  EXPECT_TRUE(report->ok());
  EXPECT_FALSE(std::filesystem::exists(dev / "vfio" / std::to_string(*report->devices.front().iommu_group)));

  auto inventory = pci::Scan(options.paths.sysfs_root);
  ASSERT_TRUE(inventory.ok());
  const pci::Selection selection = pci::Select(*inventory, options.policy);
  const names::NameResolver names(nullptr, "nvidia.com", {});
  const plugin::DeviceSnapshot snapshot = plugin::BuildSnapshot(options.paths, *inventory, selection, names, {});
  ASSERT_TRUE(snapshot.iommufd);
  int devices = 0;
  for (const auto& [name, resource] : snapshot.resources) {
    for (const auto& device : resource.devices) {
      ++devices;
      EXPECT_TRUE(device.healthy) << device.id << ": " << device.unhealthy_reason;
    }
  }
  EXPECT_EQ(devices, 2);
}

// Without /dev/iommu a missing group node is still a failed bind: the cdevs alone open nothing.
TEST(HostRulesTest, CdevsWithoutIommufdAreNotADevnode) {
  vfio_agent::testing::TempDir dir("va-iommufd");
  auto sim = sim::SimProcess::Start(sim::NodeFile("a10x2-nvidia.json"), dir.path() / "node");
  ASSERT_TRUE(sim.ok()) << sim.status();
  const auto dev = dir.path() / "dev";
  std::filesystem::create_directories(dev / "vfio/devices");
  for (int i = 0; i < 8; ++i) std::ofstream(dev / "vfio/devices" / ("vfio" + std::to_string(i))) << "";
  binding::BinderOptions options;
  options.targets = binding::Targets::EverySelected();
  options.paths.sysfs_root = (*sim)->sysfs_root();
  options.paths.dev_root = dev;
  options.devnode_wait = absl::Milliseconds(100);
  auto report = binding::Bind(options);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_FALSE(report->devices.empty());
  EXPECT_EQ(report->devices.front().outcome, binding::Outcome::kFailed);
  EXPECT_THAT(report->devices.front().reason, ::testing::HasSubstr("appeared within"));
}

TEST(HostRulesTest, ForeignPluginSocketIsOneThatAnswers) {
  vfio_agent::testing::TempDir dir("va-coexist");
  const std::string ours = "nvidia.com/GA102GL_A10";
  // A socket file nobody listens on (ours, left by a crash) is not foreign.
  {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    const std::string path = (dir.path() / plugin::SocketName(ours)).string();
    std::strncpy(address.sun_path, path.c_str(), sizeof address.sun_path - 1);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    ::close(fd);
  }
  EXPECT_TRUE(ForeignPluginSockets(dir.path(), {ours}).empty());
  std::filesystem::remove(dir.path() / plugin::SocketName(ours));
  auto listen_on = [&](const std::string& name) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    const std::string path = (dir.path() / name).string();
    std::strncpy(address.sun_path, path.c_str(), sizeof address.sun_path - 1);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    EXPECT_EQ(::listen(fd, 4), 0);
    return fd;
  };
  const int other = listen_on("kubevirt-SOMETHING_ELSE.sock");  // not one of our names
  EXPECT_TRUE(ForeignPluginSockets(dir.path(), {ours}).empty());
  const int sandbox = listen_on(plugin::SocketName(ours));
  const int nvidia = listen_on("nvidia-gpu.sock");
  EXPECT_THAT(ForeignPluginSockets(dir.path(), {ours}),
              ::testing::ElementsAre((dir.path() / plugin::SocketName(ours)).string(),
                                     (dir.path() / "nvidia-gpu.sock").string()));
  for (int fd : {other, sandbox, nvidia}) ::close(fd);
}

}  // namespace
}  // namespace vfio_agent::daemon
