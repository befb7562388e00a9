#include "vfio_gpu_agent/plugin/devices.h"

#include <algorithm>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "support/sysfs_tree.h"
#include "test_devices.h"
#include "vfio_gpu_agent/plugin/agent.h"

namespace vfio_agent::plugin {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kH200[] = "nvidia.com/GH100_H200_SXM_141GB";

class SnapshotTest : public ::testing::Test {
 protected:
  SnapshotTest() : tree_(dir_.path() / "sys"), names_(nullptr, "nvidia.com", {}) {
    paths_.sysfs_root = tree_.root();
    paths_.dev_root = dir_.path() / "dev";
    std::filesystem::create_directories(paths_.dev_root / "vfio");
  }

  void GroupNode(int group) { std::ofstream(paths_.dev_root / "vfio" / std::to_string(group)) << ""; }

  DeviceSnapshot Build(const std::set<std::string>& remembered = {}) {
    absl::StatusOr<pci::Inventory> inventory = pci::Scan(paths_.sysfs_root);
    EXPECT_TRUE(inventory.ok()) << inventory.status();
    const pci::Selection selection = pci::Select(*inventory, {});
    return BuildSnapshot(paths_, *inventory, selection, names_, remembered);
  }

  static PluginDevice Device(const DeviceSnapshot& s, const std::string& resource, const std::string& id) {
    return fixtures::DeviceIn(s, resource, id);
  }

  testing::TempDir dir_;
  testing::SysfsTree tree_;
  names::NameResolver names_;
  HostPaths paths_;
};

TEST_F(SnapshotTest, VfioGpusAreHealthyWithRealNumaOnly) {
  tree_.AddDevice({.bdf = "0000:3b:00.0", .numa_node = 0, .driver = "vfio-pci", .iommu_group = 12});
  tree_.AddDevice({.bdf = "0000:5d:00.0", .numa_node = -1, .driver = "vfio-pci", .iommu_group = 13});
  GroupNode(12);
  GroupNode(13);
  DeviceSnapshot s = Build();
  ASSERT_EQ(s.resources.size(), 1u);
  const ResourceDevices& r = s.resources.at(kH200);
  EXPECT_EQ(r.env_name, "PCI_RESOURCE_NVIDIA_COM_GH100_H200_SXM_141GB");
  ASSERT_EQ(r.devices.size(), 2u);
  EXPECT_TRUE(r.devices[0].healthy) << r.devices[0].unhealthy_reason;
  EXPECT_EQ(r.devices[0].numa_node, 0);
  EXPECT_EQ(r.devices[0].iommu_group, 12);
  EXPECT_TRUE(r.devices[1].healthy) << r.devices[1].unhealthy_reason;
  EXPECT_EQ(r.devices[1].numa_node, std::nullopt);
  EXPECT_FALSE(s.iommufd);
}

TEST_F(SnapshotTest, GpuNeverOnVfioIsNotAdvertisedButAnUnboundOneStaysUnhealthy) {
  tree_.AddDevice({.bdf = "0000:3b:00.0", .driver = "nvidia", .iommu_group = 12});
  EXPECT_TRUE(Build().resources.empty());
  DeviceSnapshot s = Build({"0000:3b:00.0"});
  const PluginDevice d = Device(s, kH200, "0000:3b:00.0");
  EXPECT_FALSE(d.healthy);
  EXPECT_EQ(d.unhealthy_reason, "driver nvidia");
  EXPECT_TRUE(AdvertisedIds(s).contains("0000:3b:00.0"));
}

// Names are fixed over every selected GPU at the first build, so a GPU bound to vfio later (here one whose
// operator name collides with an advertised GPU's) renames nothing the kubelet already knows.
TEST_F(SnapshotTest, BindingAnotherGpuLaterRenamesNoResource) {
  const names::NameResolver names(nullptr, "nvidia.com", {{0x10de, 0x2335, "HOPPER"}, {0x10de, 0x2330, "HOPPER"}});
  tree_.AddDevice({.bdf = "0000:3b:00.0", .device = 0x2335, .driver = "vfio-pci", .iommu_group = 12});
  tree_.AddDevice({.bdf = "0000:5d:00.0", .device = 0x2330, .driver = "nvidia", .iommu_group = 13});
  GroupNode(12);
  GroupNode(13);
  auto build = [&](const std::set<std::string>& remembered) {
    absl::StatusOr<pci::Inventory> inventory = pci::Scan(paths_.sysfs_root);
    EXPECT_TRUE(inventory.ok()) << inventory.status();
    return BuildSnapshot(paths_, *inventory, pci::Select(*inventory, {}), names, remembered);
  };
  const DeviceSnapshot before = build({});
  ASSERT_EQ(before.resources.size(), 1u);
  const std::string name = before.resources.begin()->first;
  EXPECT_EQ(name, "nvidia.com/HOPPER_2335");

  tree_.BindDriver("0000:5d:00.0", "vfio-pci");
  const DeviceSnapshot after = build(AdvertisedIds(before));
  ASSERT_TRUE(after.resources.contains(name)) << "renamed at run time";
  EXPECT_NE(after.resources.at(name).Find("0000:3b:00.0"), nullptr);
  EXPECT_TRUE(after.resources.contains("nvidia.com/HOPPER_2330"));
  EXPECT_EQ(after.resources.size(), 2u);
}

TEST_F(SnapshotTest, MissingGroupNodeIsUnhealthy) {
  tree_.AddDevice({.bdf = "0000:3b:00.0", .driver = "vfio-pci", .iommu_group = 12});
  const PluginDevice d = Device(Build(), kH200, "0000:3b:00.0");
  EXPECT_FALSE(d.healthy);
  EXPECT_THAT(d.unhealthy_reason, HasSubstr("vfio/12"));
}

TEST_F(SnapshotTest, DeadConfigSpaceIsUnhealthy) {
  tree_.AddDevice({.bdf = "0000:3b:00.0", .driver = "vfio-pci", .iommu_group = 12});
  GroupNode(12);
  tree_.WriteAttribute("0000:3b:00.0", "config", std::string(64, '\xff'));
  const PluginDevice d = Device(Build(), kH200, "0000:3b:00.0");
  EXPECT_FALSE(d.healthy);
  EXPECT_THAT(d.unhealthy_reason, HasSubstr("0xffff"));
}

// A config read would wake a GPU vfio-pci parked in D3cold: its health is decided without one. The config
// file here reads 0xffff, so any read of it would make the device Unhealthy.
TEST_F(SnapshotTest, DeviceInD3coldIsHealthyWithoutAConfigRead) {
  tree_.AddDevice({.bdf = "0000:3b:00.0", .driver = "vfio-pci", .iommu_group = 12});
  GroupNode(12);
  tree_.WriteAttribute("0000:3b:00.0", "config", std::string(64, '\xff'));
  tree_.WriteAttribute("0000:3b:00.0", "power_state", "D3cold\n");
  EXPECT_TRUE(Device(Build(), kH200, "0000:3b:00.0").healthy);
  tree_.WriteAttribute("0000:3b:00.0", "power_state", "D0\n");
  EXPECT_FALSE(Device(Build(), kH200, "0000:3b:00.0").healthy);
}

TEST_F(SnapshotTest, ForeignEndpointInTheGroupMakesItNotViable) {
  tree_.AddDevice({.bdf = "0000:3b:00.0", .driver = "vfio-pci", .iommu_group = 12});
  tree_.AddDevice({.bdf = "0000:3b:00.1", .vendor = 0x8086, .device = 0x1572, .class_code = 0x020000,
                   .driver = "i40e", .iommu_group = 12});
  GroupNode(12);
  const PluginDevice d = Device(Build(), kH200, "0000:3b:00.0");
  EXPECT_FALSE(d.healthy);
  EXPECT_THAT(d.unhealthy_reason, HasSubstr("not viable"));
}

TEST_F(SnapshotTest, CompanionsAreNeverResourcesButBelongToTheGroup) {
  tree_.AddDevice({.bdf = "0000:01:00.0", .device = 0x2236, .class_code = 0x030200, .multifunction = true,
                   .driver = "vfio-pci", .iommu_group = 20, .consumers = {"0000:01:00.1"}});
  tree_.AddDevice({.bdf = "0000:01:00.1", .device = 0x1aef, .class_code = 0x040300, .driver = "vfio-pci",
                   .iommu_group = 20});
  GroupNode(20);
  DeviceSnapshot s = Build();
  ASSERT_EQ(s.resources.size(), 1u);
  const ResourceDevices& r = s.resources.at("nvidia.com/GA102GL_A10");
  ASSERT_EQ(r.devices.size(), 1u);
  EXPECT_TRUE(r.devices[0].healthy) << r.devices[0].unhealthy_reason;
  EXPECT_THAT(r.devices[0].group_functions, ElementsAre("0000:01:00.0", "0000:01:00.1"));
}

TEST_F(SnapshotTest, OneResourcePerModel) {
  tree_.AddDevice({.bdf = "0000:17:00.0", .device = 0x2236, .driver = "vfio-pci", .iommu_group = 1});
  tree_.AddDevice({.bdf = "0000:65:00.0", .device = 0x1eb8, .driver = "vfio-pci", .iommu_group = 2});
  GroupNode(1);
  GroupNode(2);
  DeviceSnapshot s = Build();
  ASSERT_EQ(s.resources.size(), 2u);
  EXPECT_EQ(s.resources.at("nvidia.com/GA102GL_A10").devices.at(0).id, "0000:17:00.0");
  EXPECT_EQ(s.resources.at("nvidia.com/TU104GL_TESLA_T4").devices.at(0).id, "0000:65:00.0");
}

TEST_F(SnapshotTest, CdevOnlyIommufdHostIsHealthy) {
  tree_.AddDevice({.bdf = "0000:3b:00.0", .driver = "vfio-pci", .iommu_group = 12, .vfio_cdevs = {"vfio0"}});
  std::ofstream(paths_.dev_root / "iommu") << "";
  std::filesystem::create_directories(paths_.dev_root / "vfio/devices");
  std::ofstream(paths_.dev_root / "vfio/devices/vfio0") << "";
  DeviceSnapshot s = Build();
  EXPECT_TRUE(s.iommufd);
  const PluginDevice d = Device(s, kH200, "0000:3b:00.0");
  EXPECT_TRUE(d.healthy) << d.unhealthy_reason;
  EXPECT_THAT(d.vfio_cdevs, ElementsAre("vfio0"));
}

TEST_F(SnapshotTest, GpuGoneFromSysfsDisappears) {
  tree_.AddDevice({.bdf = "0000:3b:00.0", .driver = "vfio-pci", .iommu_group = 12});
  GroupNode(12);
  DeviceSnapshot first = Build();
  std::filesystem::remove(tree_.root() / "bus/pci/devices/0000:3b:00.0");
  EXPECT_TRUE(Build(AdvertisedIds(first)).resources.empty());
}

// --- NVSwitches (--nvswitches): a resource of their own, for VMs given the whole board ---

constexpr char kNvSwitch[] = "nvidia.com/GH100_H100_NVSWITCH";
const std::vector<std::string> kSwitches = {"0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0"};

class NvSwitchSnapshotTest : public SnapshotTest {
 protected:
  NvSwitchSnapshotTest() {
    // Debian 12's pci.ids predates 10de:22a3; the name must come from whichever pci.ids the node has.
    std::ofstream(dir_.path() / "pci.ids") << "10de  NVIDIA Corporation\n\t22a3  GH100 [H100 NVSwitch]\n";
    auto db = names::LoadPciIds(dir_.path() / "pci.ids");
    EXPECT_TRUE(db.ok()) << db.status();
    db_ = *std::move(db);
  }

  // The HGX board of the simulated H200 node: one GPU, and the four switches in one IOMMU group.
  void AddBoard(const std::string& switch_driver = "vfio-pci") {
    tree_.AddDevice({.bdf = "0000:18:00.0", .numa_node = 0, .driver = "vfio-pci", .iommu_group = 11});
    GroupNode(11);
    for (const std::string& bdf : kSwitches) {
      tree_.AddDevice({.bdf = bdf, .device = 0x22a3, .class_code = 0x068000, .numa_node = 0,
                       .driver = switch_driver, .iommu_group = 40});
    }
    GroupNode(40);
  }

  DeviceSnapshot BuildWith(const names::NameResolver& names, bool nvswitches,
                           const std::set<std::string>& remembered = {}) {
    absl::StatusOr<pci::Inventory> inventory = pci::Scan(paths_.sysfs_root);
    EXPECT_TRUE(inventory.ok()) << inventory.status();
    pci::SelectionPolicy policy;
    policy.include_nvswitches = nvswitches;
    return BuildSnapshot(paths_, *inventory, pci::Select(*inventory, policy), names, remembered);
  }

  std::unique_ptr<names::PciIdsDatabase> db_;
};

TEST_F(NvSwitchSnapshotTest, SwitchesAreAResourceNamedFromPciIdsOnlyWithTheSwitch) {
  AddBoard();
  const names::NameResolver names(db_.get(), "nvidia.com", {});
  const absl::StatusOr<pci::Inventory> inventory = pci::Scan(paths_.sysfs_root);
  ASSERT_TRUE(inventory.ok()) << inventory.status();
  const std::vector<std::pair<uint16_t, uint16_t>> ids =
      AdvertisableIds(*inventory, pci::Select(*inventory, {.include_nvswitches = true}));
  EXPECT_EQ(std::count(ids.begin(), ids.end(), std::pair<uint16_t, uint16_t>{0x10de, 0x22a3}), 4);
  EXPECT_EQ(ids.size(), 5u);
  const DeviceSnapshot s = BuildWith(names, /*nvswitches=*/true);
  ASSERT_EQ(s.resources.size(), 2u);
  const ResourceDevices& switches = s.resources.at(kNvSwitch);
  EXPECT_EQ(switches.env_name, "PCI_RESOURCE_NVIDIA_COM_GH100_H100_NVSWITCH");
  EXPECT_EQ(SocketName(switches.resource_name), "kubevirt-GH100_H100_NVSWITCH.sock");
  ASSERT_EQ(switches.devices.size(), 4u);
  for (const PluginDevice& d : switches.devices) {
    EXPECT_TRUE(d.healthy) << d.id << ": " << d.unhealthy_reason;
    EXPECT_EQ(d.iommu_group, 40);
    EXPECT_THAT(d.group_functions, ::testing::ElementsAreArray(kSwitches));
  }
  EXPECT_THAT(switches.devices[0].group_peers, ElementsAre("0000:06:00.0", "0000:07:00.0", "0000:08:00.0"));
  EXPECT_THAT(switches.devices[2].group_peers, ElementsAre("0000:05:00.0", "0000:06:00.0", "0000:08:00.0"));
  // The GPUs' resource is what it was without the switches.
  EXPECT_EQ(s.resources.at(kH200).devices.size(), 1u);
  EXPECT_THAT(s.resources.at(kH200).devices[0].group_peers, ::testing::IsEmpty());

  const DeviceSnapshot gpus_only = BuildWith(names, /*nvswitches=*/false);
  EXPECT_EQ(gpus_only.resources.size(), 1u);
  EXPECT_TRUE(gpus_only.resources.contains(kH200));
}

TEST_F(NvSwitchSnapshotTest, AnOverrideNamesTheSwitchesAsItNamesAGpu) {
  AddBoard();
  const names::NameResolver names(db_.get(), "nvidia.com", {{0x10de, 0x22a3, "HGX_NVSWITCH"}});
  const DeviceSnapshot s = BuildWith(names, /*nvswitches=*/true);
  ASSERT_TRUE(s.resources.contains("nvidia.com/HGX_NVSWITCH"));
  EXPECT_EQ(s.resources.at("nvidia.com/HGX_NVSWITCH").env_name, "PCI_RESOURCE_NVIDIA_COM_HGX_NVSWITCH");
  EXPECT_FALSE(s.resources.contains(kNvSwitch));
}

// Health as for a GPU: a switch left on nvidia makes the group not viable, so its vfio-bound fellows are
// advertised Unhealthy; it is advertised itself only once it has been seen on vfio.
TEST_F(NvSwitchSnapshotTest, ASwitchOffVfioMakesTheGroupUnhealthy) {
  AddBoard();
  const names::NameResolver names(db_.get(), "nvidia.com", {});
  const DeviceSnapshot before = BuildWith(names, /*nvswitches=*/true);
  tree_.BindDriver("0000:07:00.0", "nvidia");
  const DeviceSnapshot fresh = BuildWith(names, /*nvswitches=*/true);
  EXPECT_EQ(fresh.resources.at(kNvSwitch).Find("0000:07:00.0"), nullptr);
  const PluginDevice fellow = Device(fresh, kNvSwitch, "0000:05:00.0");
  EXPECT_FALSE(fellow.healthy);
  EXPECT_THAT(fellow.unhealthy_reason, HasSubstr("IOMMU group 40 not viable"));

  const DeviceSnapshot after = BuildWith(names, /*nvswitches=*/true, AdvertisedIds(before));
  const PluginDevice unbound = Device(after, kNvSwitch, "0000:07:00.0");
  EXPECT_FALSE(unbound.healthy);
  EXPECT_EQ(unbound.unhealthy_reason, "driver nvidia");
}

}  // namespace
}  // namespace vfio_agent::plugin
