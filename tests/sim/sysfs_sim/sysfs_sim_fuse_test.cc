// sysfs-sim through a real FUSE mount: layout on every shipped node, the kernel's bind/unbind/probe
// semantics and errnos, fault injection, the control file and the log, and the tools that read it.
#include <fcntl.h>
#include <sys/inotify.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "node_spec.h"
#include "sim_process.h"
#include "support/fuse.h"
#include "support/holding_process.h"

namespace vfio_agent::sim {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using namespace std::chrono_literals;

// One write(2) as the agent does it (O_WRONLY, no O_TRUNC); 0 or the errno of open/write.
int WriteAttr(const fs::path& path, const std::string& data) {
  int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  int err = write(fd, data.data(), data.size()) < 0 ? errno : 0;
  close(fd);
  return err;
}

std::string ReadAttr(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string LinkName(const fs::path& path) {
  std::error_code ec;
  fs::path target = fs::read_symlink(path, ec);
  return ec ? "" : target.filename().string();
}

std::string Shell(const std::string& command) {
  std::string out;
  if (FILE* p = popen(command.c_str(), "r")) {
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    pclose(p);
  }
  return out;
}

class SysfsSimTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!vfio_agent::testing::FuseAvailable()) GTEST_SKIP() << vfio_agent::testing::kNeedsFuse;
  }
  void Start(const std::string& node) {
    static std::atomic<int> counter = 0;
    root_ = fs::path(::testing::TempDir()) / ("sysfs_sim_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
    auto sim = SimProcess::Start(NodeFile(node), root_);
    ASSERT_TRUE(sim.ok()) << sim.status();
    sim_ = *std::move(sim);
  }
  void TearDown() override {
    sim_.reset();
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  fs::path Sys() const { return sim_->sysfs_root(); }
  fs::path Dev(const std::string& bdf) const { return Sys() / "bus/pci/devices" / bdf; }
  fs::path DevRoot() const { return sim_->dev_root(); }

  fs::path root_;
  std::unique_ptr<SimProcess> sim_;
};

TEST_F(SysfsSimTest, EveryShippedNodeMountsWithTheKernelLayout) {
  for (const auto& entry : fs::directory_iterator(NodesDir())) {
    SCOPED_TRACE(entry.path().filename().string());
    auto node = LoadNode(entry.path());
    ASSERT_TRUE(node.ok()) << node.status();
    Start(entry.path().filename().string());
    std::set<std::string> listed;
    for (const auto& d : fs::directory_iterator(Sys() / "bus/pci/devices")) {
      EXPECT_TRUE(d.is_symlink());
      EXPECT_TRUE(d.is_directory());  // follows the link into devices/
      listed.insert(d.path().filename().string());
    }
    EXPECT_EQ(listed.size(), node->devices.size());
    for (const auto& spec : node->devices) {
      const fs::path dev = Dev(spec.bdf);
      char vendor[16];
      snprintf(vendor, sizeof vendor, "0x%04x\n", spec.vendor);
      EXPECT_EQ(ReadAttr(dev / "vendor"), vendor);
      EXPECT_EQ(ReadAttr(dev / "numa_node"), std::to_string(spec.numa_node) + "\n");
      EXPECT_EQ(ReadAttr(dev / "driver_override"), "(null)\n");
      EXPECT_EQ(LinkName(dev / "driver"), spec.driver);
      EXPECT_EQ(LinkName(dev / "iommu_group"), spec.iommu_group >= 0 ? std::to_string(spec.iommu_group) : "");
      const std::string config = ReadAttr(dev / "config");
      ASSERT_GE(config.size(), 64u);
      EXPECT_EQ(static_cast<uint8_t>(config[0]) | static_cast<uint8_t>(config[1]) << 8, spec.vendor);
      EXPECT_EQ(static_cast<uint8_t>(config[0x0e]), spec.header_type);
      if (!spec.parent.empty()) {
        EXPECT_EQ(fs::canonical(dev).parent_path(), fs::canonical(Dev(spec.parent)));
      }
      if (spec.iommu_group >= 0) {
        EXPECT_TRUE(fs::exists(Sys() / "kernel/iommu_groups" / std::to_string(spec.iommu_group) / "devices" / spec.bdf));
      }
      for (const auto& consumer : spec.consumers) EXPECT_TRUE(fs::exists(dev / ("consumer:pci:" + consumer)));
    }
    const bool vfio_loaded = std::any_of(node->drivers.begin(), node->drivers.end(),
                                         [](const std::string& d) { return d.find("vfio") != std::string::npos; });
    EXPECT_EQ(fs::exists(DevRoot() / "vfio/vfio"), vfio_loaded);
    if (!node->iommu) {
      EXPECT_TRUE(fs::is_empty(Sys() / "kernel/iommu_groups"));
    }
    size_t entries = 0;
    for (auto it = fs::recursive_directory_iterator(Sys()); it != fs::recursive_directory_iterator(); ++it) ++entries;
    EXPECT_GT(entries, 20 * node->devices.size());
    auto stopped = sim_->Stop();
    ASSERT_TRUE(stopped.ok()) << stopped.status();
    EXPECT_EQ(*stopped, 0);
    EXPECT_FALSE(fs::exists(Sys() / "bus"));  // unmounted
  }
}

TEST_F(SysfsSimTest, HgxBoardHasGpusBehindSwitchPortsOnTwoNumaNodes) {
  Start("hgx-h200-8gpu.json");
  int gpus = 0, nvswitches = 0, numa1 = 0;
  for (const auto& d : fs::directory_iterator(Sys() / "bus/pci/devices")) {
    const std::string cls = ReadAttr(d.path() / "class");
    gpus += cls == "0x030200\n";
    nvswitches += cls == "0x068000\n";
    numa1 += cls == "0x030200\n" && ReadAttr(d.path() / "numa_node") == "1\n";
  }
  EXPECT_EQ(gpus, 8);
  EXPECT_EQ(nvswitches, 4);
  EXPECT_EQ(numa1, 4);
  EXPECT_EQ(fs::read_symlink(Dev("0000:3b:00.0")), "../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0");
  for (int i = 0; i < 8; ++i) EXPECT_TRUE(fs::exists(DevRoot() / ("nvidia" + std::to_string(i))));
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(fs::exists(DevRoot() / ("nvidia-nvswitch" + std::to_string(i))));
  EXPECT_TRUE(fs::exists(DevRoot() / "nvidiactl"));
}

TEST_F(SysfsSimTest, OverrideUnbindBindCycleMovesLinksAndDevNodes) {
  Start("a10x2-nvidia.json");
  const std::string bdf = "0000:3b:00.0";
  EXPECT_EQ(WriteAttr(Dev(bdf) / "driver_override", "vfio-pci\n"), 0);
  EXPECT_EQ(ReadAttr(Dev(bdf) / "driver_override"), "vfio-pci\n");
  EXPECT_EQ(WriteAttr(Dev(bdf) / "driver/unbind", bdf), 0);
  EXPECT_FALSE(fs::exists(Dev(bdf) / "driver"));
  EXPECT_FALSE(fs::exists(Sys() / "bus/pci/drivers/nvidia" / bdf));
  EXPECT_FALSE(fs::exists(DevRoot() / "nvidia0"));
  EXPECT_TRUE(fs::exists(DevRoot() / "nvidia1"));
  EXPECT_EQ(WriteAttr(Sys() / "bus/pci/drivers/vfio-pci/bind", bdf + "\n"), 0);
  EXPECT_EQ(LinkName(Dev(bdf) / "driver"), "vfio-pci");
  EXPECT_TRUE(fs::is_symlink(Sys() / "bus/pci/drivers/vfio-pci" / bdf));
  EXPECT_TRUE(fs::exists(DevRoot() / "vfio/33"));
  EXPECT_TRUE(fs::exists(DevRoot() / "vfio/devices/vfio0"));
  EXPECT_EQ(ReadAttr(Dev(bdf) / "vfio-dev/vfio0/dev"), "511:0\n");
  EXPECT_EQ(WriteAttr(Sys() / "bus/pci/drivers/vfio-pci/unbind", bdf), 0);
  EXPECT_FALSE(fs::exists(DevRoot() / "vfio/33"));
  EXPECT_FALSE(fs::exists(Dev(bdf) / "vfio-dev"));
  EXPECT_EQ(WriteAttr(Dev(bdf) / "driver_override", "\n"), 0);
  EXPECT_EQ(WriteAttr(Sys() / "bus/pci/drivers_probe", bdf), 0);
  EXPECT_EQ(LinkName(Dev(bdf) / "driver"), "nvidia");
  EXPECT_TRUE(fs::exists(DevRoot() / "nvidia0"));
  EXPECT_THAT(sim_->Log(), ElementsAre("override 0000:3b:00.0 vfio-pci", "unbind 0000:3b:00.0 nvidia",
                                       "bind 0000:3b:00.0 vfio-pci", "unbind 0000:3b:00.0 vfio-pci",
                                       "override 0000:3b:00.0 (null)", "probe 0000:3b:00.0 nvidia"));
}

TEST_F(SysfsSimTest, DriversProbeSucceedsEvenWhenVfioRefusesTheDevice) {
  Start("iommu-off.json");
  const std::string bdf = "0000:3b:00.0";
  EXPECT_FALSE(fs::exists(Dev(bdf) / "iommu_group"));
  // vfio is loaded (its container node exists) but, without an IOMMU, no group can appear.
  EXPECT_TRUE(fs::exists(DevRoot() / "vfio/vfio"));
  ASSERT_EQ(WriteAttr(Dev(bdf) / "driver_override", "vfio-pci"), 0);
  ASSERT_EQ(WriteAttr(Sys() / "bus/pci/drivers/nvidia/unbind", bdf), 0);
  EXPECT_EQ(WriteAttr(Sys() / "bus/pci/drivers_probe", bdf), 0);
  EXPECT_FALSE(fs::exists(Dev(bdf) / "driver"));
  EXPECT_EQ(WriteAttr(Sys() / "bus/pci/drivers/vfio-pci/bind", bdf), EINVAL);
  ASSERT_EQ(WriteAttr(Dev(bdf) / "driver_override", "\n"), 0);
  EXPECT_EQ(WriteAttr(Sys() / "bus/pci/drivers_probe", bdf), 0);
  EXPECT_EQ(LinkName(Dev(bdf) / "driver"), "nvidia");
}

TEST_F(SysfsSimTest, WritesFailWithTheKernelsErrnos) {
  Start("a10x2-nvidia.json");
  const std::string bdf = "0000:3b:00.0";
  const fs::path drivers = Sys() / "bus/pci/drivers";
  EXPECT_EQ(WriteAttr(drivers / "nvidia/bind", bdf), EBUSY);                // already bound
  EXPECT_EQ(WriteAttr(drivers / "nvidia/bind", "0000:ff:00.0"), ENODEV);    // unknown device
  EXPECT_EQ(WriteAttr(drivers / "vfio-pci/unbind", bdf), ENODEV);          // not bound to vfio-pci
  EXPECT_EQ(WriteAttr(drivers / "vfio-pci/bind", bdf), ENODEV);            // vfio-pci matches only by override
  EXPECT_EQ(WriteAttr(Sys() / "bus/pci/drivers_probe", "0000:ff:00.0"), ENODEV);
  EXPECT_EQ(WriteAttr(drivers / "nouveau/bind", bdf), ENOENT);             // driver not loaded
  EXPECT_EQ(WriteAttr(Dev(bdf) / "vendor", "0x1234"), EACCES);
  EXPECT_EQ(WriteAttr(Dev(bdf) / "remove", "yes"), EINVAL);
  ASSERT_EQ(WriteAttr(Dev(bdf) / "driver_override", "vfio-pci"), 0);
  ASSERT_EQ(WriteAttr(drivers / "nvidia/unbind", bdf), 0);
  EXPECT_EQ(WriteAttr(drivers / "nvidia/bind", bdf), ENODEV);              // override names another driver
  ASSERT_TRUE(sim_->Control("bind-errno " + bdf + " EBUSY").ok());
  EXPECT_EQ(WriteAttr(drivers / "vfio-pci/bind", bdf), EBUSY);
  EXPECT_EQ(WriteAttr(Sys() / "bus/pci/drivers_probe", bdf), 0);
  EXPECT_FALSE(fs::exists(Dev(bdf) / "driver"));
  ASSERT_TRUE(sim_->Control("bind-errno " + bdf + " 0").ok());
  EXPECT_EQ(WriteAttr(drivers / "vfio-pci/bind", bdf), 0);
  EXPECT_TRUE(fs::exists(DevRoot() / "vfio/33"));
}

TEST_F(SysfsSimTest, BlockedUnbindBlocksOnlyItsWriter) {
  Start("hgx-h200-8gpu.json");
  const fs::path unbind = Sys() / "bus/pci/drivers/nvidia/unbind";
  ASSERT_TRUE(sim_->Control("unbind-delay 0000:18:00.0 -1").ok());
  auto blocked = std::async(std::launch::async, [&] { return WriteAttr(unbind, "0000:18:00.0"); });
  // The writer has reached the simulator (a condition, not a sleep: on a loaded machine it may take a while).
  const auto give_up = std::chrono::steady_clock::now() + 30s;
  auto logged = [&] {
    const std::vector<std::string> log = sim_->Log();
    return std::find(log.begin(), log.end(), "unbind-wait 0000:18:00.0 nvidia") != log.end();
  };
  while (!logged() && std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(5ms);
  ASSERT_TRUE(logged());
  EXPECT_EQ(blocked.wait_for(0ms), std::future_status::timeout);
  // Same attribute, another device: not serialised behind the blocked writer, which stays blocked until the
  // release below, so finishing at all (the limit is generous) proves it.
  auto other = std::async(std::launch::async, [&] { return WriteAttr(unbind, "0000:2a:00.0"); });
  ASSERT_EQ(other.wait_for(30s), std::future_status::ready);
  EXPECT_EQ(other.get(), 0);
  EXPECT_EQ(LinkName(Dev("0000:18:00.0") / "driver"), "nvidia");  // still bound while its remove() waits
  EXPECT_EQ(ReadAttr(Dev("0000:18:00.0") / "vendor"), "0x10de\n");
  ASSERT_TRUE(sim_->Control("release 0000:18:00.0").ok());
  ASSERT_EQ(blocked.wait_for(30s), std::future_status::ready);
  EXPECT_EQ(blocked.get(), 0);
  EXPECT_FALSE(fs::exists(Dev("0000:18:00.0") / "driver"));

  ASSERT_TRUE(sim_->Control("unbind-delay 0000:3b:00.0 150").ok());
  const auto t1 = std::chrono::steady_clock::now();
  EXPECT_EQ(WriteAttr(unbind, "0000:3b:00.0"), 0);
  EXPECT_GE(std::chrono::steady_clock::now() - t1, 150ms);
}

TEST_F(SysfsSimTest, SurpriseRemovalEndsABlockedUnbind) {
  Start("hgx-h200-8gpu.json");
  ASSERT_TRUE(sim_->Control("unbind-delay 0000:3b:00.0 -1").ok());
  auto blocked = std::async(std::launch::async,
                            [&] { return WriteAttr(Sys() / "bus/pci/drivers/nvidia/unbind", "0000:3b:00.0"); });
  EXPECT_EQ(blocked.wait_for(200ms), std::future_status::timeout);
  ASSERT_TRUE(sim_->Control("remove 0000:3b:00.0").ok());
  ASSERT_EQ(blocked.wait_for(30s), std::future_status::ready);
  EXPECT_EQ(blocked.get(), 0);
  EXPECT_FALSE(fs::exists(Dev("0000:3b:00.0")));
  EXPECT_EQ(WriteAttr(Sys() / "bus/pci/drivers/vfio-pci/bind", "0000:3b:00.0"), ENODEV);
}

TEST_F(SysfsSimTest, RemoveAndRescan) {
  Start("workstation-gpu-audio-usb.json");
  ASSERT_EQ(WriteAttr(Dev("0000:01:00.0") / "driver_override", "vfio-pci"), 0);
  EXPECT_EQ(WriteAttr(Dev("0000:00:01.0") / "remove", "1"), 0);  // the bridge takes its subtree along
  for (const char* bdf : {"0000:00:01.0", "0000:01:00.0", "0000:01:00.1", "0000:01:00.2", "0000:01:00.3"}) {
    EXPECT_FALSE(fs::exists(Dev(bdf))) << bdf;
  }
  EXPECT_FALSE(fs::exists(Sys() / "kernel/iommu_groups/12"));
  EXPECT_FALSE(fs::exists(DevRoot() / "nvidia0"));
  EXPECT_EQ(WriteAttr(Sys() / "bus/pci/rescan", "1"), 0);
  EXPECT_EQ(LinkName(Dev("0000:01:00.0") / "driver"), "nvidia");
  EXPECT_EQ(LinkName(Dev("0000:01:00.1") / "driver"), "snd_hda_intel");
  EXPECT_EQ(ReadAttr(Dev("0000:01:00.0") / "driver_override"), "(null)\n");
  EXPECT_TRUE(fs::exists(Dev("0000:01:00.0") / "consumer:pci:0000:01:00.1"));
  ASSERT_TRUE(sim_->Control("remove 0000:01:00.2").ok());
  EXPECT_FALSE(fs::exists(Dev("0000:01:00.2")));
  ASSERT_TRUE(sim_->Control("rescan").ok());
  EXPECT_EQ(LinkName(Dev("0000:01:00.2") / "driver"), "xhci_hcd");
  EXPECT_THAT(sim_->Log(), ElementsAre("override 0000:01:00.0 vfio-pci", "remove 0000:00:01.0", "rescan"));
}

TEST_F(SysfsSimTest, ControlCommandsActAsAnExternalActorAndStayOutOfTheLog) {
  Start("gpu-foreign-nic.json");
  ASSERT_TRUE(sim_->Control("set-driver 0000:3b:00.0 vfio-pci").ok());
  EXPECT_EQ(LinkName(Dev("0000:3b:00.0") / "driver"), "vfio-pci");
  EXPECT_TRUE(fs::exists(DevRoot() / "vfio/30"));
  ASSERT_TRUE(sim_->Control("set-driver 0000:3b:00.0 none").ok());
  EXPECT_FALSE(fs::exists(Dev("0000:3b:00.0") / "driver"));
  EXPECT_FALSE(fs::exists(DevRoot() / "vfio/30"));
  ASSERT_TRUE(sim_->Control("dead 0000:3c:00.0 1").ok());
  EXPECT_EQ(ReadAttr(Dev("0000:3c:00.0") / "config").substr(0, 4), "\xff\xff\xff\xff");
  EXPECT_EQ(ReadAttr(Dev("0000:3c:00.0") / "vendor"), "0x8086\n");  // cached by the kernel, not re-read
  ASSERT_TRUE(sim_->Control("dead 0000:3c:00.0 0").ok());
  EXPECT_EQ(ReadAttr(Dev("0000:3c:00.0") / "config").substr(0, 2), "\x86\x80");
  for (const char* bad : {"frobnicate", "set-driver 0000:3b:00.0 nouveau", "dead 0000:3c:00.0",
                          "bind-errno 0000:3b:00.0 EWHATEVER", "unbind-delay 0000:99:00.0 10"}) {
    absl::Status st = sim_->Control(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << bad << ": " << st;
  }
  EXPECT_THAT(sim_->Log(), IsEmpty());
}

TEST_F(SysfsSimTest, DevTreeChangesAreSeenByInotify) {
  Start("a10-t4-mixed.json");
  for (const char* g : {"33", "47", "120", "150"}) EXPECT_TRUE(fs::exists(DevRoot() / "vfio" / g)) << g;
  int fd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  ASSERT_GE(fd, 0);
  ASSERT_GE(inotify_add_watch(fd, (DevRoot() / "vfio").c_str(), IN_CREATE | IN_DELETE), 0);
  ASSERT_EQ(WriteAttr(Sys() / "bus/pci/drivers/vfio-pci/unbind", "0000:af:00.0"), 0);
  ASSERT_EQ(WriteAttr(Sys() / "bus/pci/drivers_probe", "0000:af:00.0"), 0);  // override unset: nvidia again
  EXPECT_EQ(LinkName(Dev("0000:af:00.0") / "driver"), "nvidia");
  pollfd pfd{fd, POLLIN, 0};
  ASSERT_EQ(poll(&pfd, 1, 2000), 1);
  alignas(inotify_event) char buf[4096];
  ssize_t n = read(fd, buf, sizeof buf);
  ASSERT_GT(n, 0);
  const auto* event = reinterpret_cast<const inotify_event*>(buf);
  EXPECT_TRUE(event->mask & IN_DELETE);
  EXPECT_STREQ(event->name, "120");
  close(fd);
}

TEST_F(SysfsSimTest, ShellToolsWorkOnTheMount) {
  Start("gpu-behind-bridge.json");
  const std::string dev = Dev("0000:5e:00.0").string();
  EXPECT_THAT(Shell("ls -l " + Sys().string() + "/bus/pci/devices/"),
              ::testing::HasSubstr("0000:5e:00.0 -> ../../../devices/pci0000:5d/0000:5d:00.0/0000:5e:00.0"));
  EXPECT_EQ(Shell("readlink " + dev + "/iommu_group"), "../../../../kernel/iommu_groups/40\n");
  EXPECT_EQ(Shell("cat " + dev + "/device " + dev + "/subsystem_vendor"), "0x20b5\n0x10de\n");
  EXPECT_EQ(Shell("ls " + Sys().string() + "/kernel/iommu_groups/40/devices"), "0000:5d:00.0\n0000:5e:00.0\n");
  // A shell redirect opens with O_TRUNC; that must work as on sysfs.
  EXPECT_EQ(Shell("echo vfio-pci > " + dev + "/driver_override && cat " + dev + "/driver_override"), "vfio-pci\n");
}

TEST_F(SysfsSimTest, MdevsAreCreatedAndRemovedThroughTheirSysfsFiles) {
  Start("vgpu-mdev-t4-a10.json");
  const std::string uuid = "5b8f8c11-3a4d-4e0f-9c77-0f1e2d3c4b5a";
  const fs::path type = Dev("0000:3b:00.0") / "mdev_supported_types/nvidia-234";  // GRID T4-16Q: one per card
  EXPECT_EQ(fs::canonical(Sys() / "class/mdev_bus/0000:3b:00.0"), fs::canonical(Dev("0000:3b:00.0")));
  EXPECT_EQ(ReadAttr(type / "name"), "GRID T4-16Q\n");
  EXPECT_EQ(ReadAttr(type / "available_instances"), "1\n");
  EXPECT_EQ(WriteAttr(type / "create", "not-a-uuid"), EINVAL);
  ASSERT_EQ(WriteAttr(type / "create", uuid + "\n"), 0);
  const fs::path mdev = Sys() / "bus/mdev/devices" / uuid;
  ASSERT_TRUE(fs::is_symlink(mdev));
  EXPECT_EQ(fs::canonical(mdev).parent_path(), fs::canonical(Dev("0000:3b:00.0")));  // the parent BDF from the link
  EXPECT_EQ(ReadAttr(mdev / "mdev_type/name"), "GRID T4-16Q\n");
  EXPECT_EQ(LinkName(mdev / "iommu_group"), "78");
  EXPECT_EQ(LinkName(mdev / "driver"), "nvidia-vgpu-vfio");
  EXPECT_TRUE(fs::exists(Sys() / "kernel/iommu_groups/78/devices" / uuid));
  EXPECT_TRUE(fs::exists(DevRoot() / "vfio/78"));
  EXPECT_EQ(ReadAttr(type / "available_instances"), "0\n");
  EXPECT_EQ(WriteAttr(type / "create", uuid), EEXIST);
  EXPECT_EQ(WriteAttr(type / "create", "5b8f8c11-3a4d-4e0f-9c77-0f1e2d3c4b5b"), EUSERS);
  {
    vfio_agent::testing::HoldingProcess vm(DevRoot() / "vfio/78");
    EXPECT_EQ(WriteAttr(mdev / "remove", "1"), EBUSY);
  }
  EXPECT_EQ(WriteAttr(mdev / "remove", "1"), 0);
  EXPECT_FALSE(fs::exists(mdev));
  EXPECT_FALSE(fs::exists(DevRoot() / "vfio/78"));
  EXPECT_EQ(ReadAttr(type / "available_instances"), "1\n");
  // The parent's driver leaving removes its mdevs, as mdev_unregister_parent() does.
  ASSERT_EQ(WriteAttr(type / "create", uuid), 0);
  ASSERT_EQ(WriteAttr(Sys() / "bus/pci/drivers/nvidia/unbind", "0000:3b:00.0"), 0);
  EXPECT_FALSE(fs::exists(mdev));
  EXPECT_FALSE(fs::exists(Sys() / "class/mdev_bus/0000:3b:00.0"));
  EXPECT_FALSE(fs::exists(DevRoot() / "vfio/78"));
  EXPECT_THAT(sim_->Log(), ElementsAre("mdev-create 0000:3b:00.0 nvidia-234 not-a-uuid EINVAL",
                                       "mdev-create 0000:3b:00.0 nvidia-234 " + uuid,
                                       "mdev-create 0000:3b:00.0 nvidia-234 " + uuid + " EEXIST",
                                       "mdev-create 0000:3b:00.0 nvidia-234 5b8f8c11-3a4d-4e0f-9c77-0f1e2d3c4b5b EUSERS",
                                       "mdev-remove " + uuid + " EBUSY", "mdev-remove " + uuid,
                                       "mdev-create 0000:3b:00.0 nvidia-234 " + uuid, "unbind 0000:3b:00.0 nvidia"));
}

TEST_F(SysfsSimTest, AmpereVfsComeAndGoWithSriovNumvfs) {
  Start("vgpu-mdev-t4-a10.json");
  const fs::path numvfs = Dev("0000:86:00.0") / "sriov_numvfs";
  EXPECT_EQ(ReadAttr(Dev("0000:86:00.0") / "sriov_totalvfs"), "32\n");
  EXPECT_EQ(WriteAttr(numvfs, "64"), ERANGE);
  ASSERT_EQ(WriteAttr(numvfs, "2\n"), 0);
  EXPECT_EQ(WriteAttr(numvfs, "3"), EBUSY);
  for (const char* vf : {"0000:86:00.4", "0000:86:00.5"}) {
    EXPECT_EQ(fs::canonical(Dev(vf) / "physfn"), fs::canonical(Dev("0000:86:00.0")));
    EXPECT_EQ(LinkName(Dev(vf) / "driver"), "nvidia");
    EXPECT_TRUE(fs::exists(Sys() / "class/mdev_bus" / vf));
  }
  EXPECT_EQ(fs::canonical(Dev("0000:86:00.0") / "virtfn1"), fs::canonical(Dev("0000:86:00.5")));
  const std::string uuid = "5b8f8c11-3a4d-4e0f-9c77-0f1e2d3c4b5a";
  ASSERT_EQ(WriteAttr(Dev("0000:86:00.5") / "mdev_supported_types/nvidia-595/create", uuid), 0);
  EXPECT_EQ(ReadAttr(Dev("0000:86:00.4") / "mdev_supported_types/nvidia-595/available_instances"), "0\n");
  EXPECT_TRUE(fs::exists(DevRoot() / "vfio/80"));
  ASSERT_EQ(WriteAttr(numvfs, "0"), 0);
  EXPECT_FALSE(fs::exists(Dev("0000:86:00.4")));
  EXPECT_FALSE(fs::exists(Sys() / "bus/mdev/devices" / uuid));
  EXPECT_FALSE(fs::exists(DevRoot() / "vfio/80"));
  EXPECT_EQ(ReadAttr(numvfs), "0\n");
}

TEST_F(SysfsSimTest, SriovVgpuTypesAreSetThroughCurrentVgpuType) {
  Start("vgpu-sriov-l40s-h200.json");
  ASSERT_EQ(WriteAttr(Dev("0000:af:00.0") / "sriov_numvfs", "2"), 0);
  const fs::path vf0 = Dev("0000:af:00.4"), vf1 = Dev("0000:af:00.5");
  const std::string header = "ID    : vGPU Name\n";
  EXPECT_THAT(ReadAttr(vf0 / "nvidia/creatable_vgpu_types"), ::testing::HasSubstr("1428  : NVIDIA H200X-141C\n"));
  EXPECT_EQ(ReadAttr(vf0 / "nvidia/current_vgpu_type"), "0\n");
  EXPECT_FALSE(fs::exists(DevRoot() / "vfio/91"));
  ASSERT_EQ(WriteAttr(vf0 / "nvidia/current_vgpu_type", "1428"), 0);  // the whole card
  EXPECT_EQ(ReadAttr(vf0 / "nvidia/current_vgpu_type"), "1428\n");
  for (const fs::path& f : {Dev("0000:af:00.0"), vf0, vf1}) EXPECT_EQ(ReadAttr(f / "nvidia/creatable_vgpu_types"), header);
  EXPECT_TRUE(fs::exists(DevRoot() / "vfio/91"));
  EXPECT_EQ(ReadAttr(vf0 / "vfio-dev/vfio0/dev"), "511:0\n");
  EXPECT_EQ(WriteAttr(vf1 / "nvidia/current_vgpu_type", "1428"), EINVAL);
  {
    vfio_agent::testing::HoldingProcess vm(DevRoot() / "vfio/91");
    EXPECT_EQ(WriteAttr(vf0 / "nvidia/current_vgpu_type", "0"), EBUSY);
  }
  // A shell redirect (open with O_TRUNC, a trailing newline) works as on sysfs.
  EXPECT_EQ(Shell("echo 0 > " + (vf0 / "nvidia/current_vgpu_type").string() + " && cat " +
                  (vf0 / "nvidia/current_vgpu_type").string()),
            "0\n");
  EXPECT_FALSE(fs::exists(DevRoot() / "vfio/91"));
  EXPECT_THAT(ReadAttr(vf1 / "nvidia/creatable_vgpu_types"), ::testing::HasSubstr("1428  : NVIDIA H200X-141C\n"));
}

}  // namespace
}  // namespace vfio_agent::sim
