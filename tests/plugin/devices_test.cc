#include "vfio_gpu_agent/plugin/devices.h"

#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "support/sysfs_tree.h"

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
    const PluginDevice* d = s.resources.at(resource).Find(id);
    EXPECT_NE(d, nullptr) << id;
    return d != nullptr ? *d : PluginDevice{};
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

}  // namespace
}  // namespace vfio_agent::plugin
