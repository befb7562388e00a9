// The node's model and its one scan: both frontends' device lists are views of the same node::Snapshot.
#include "vfio_gpu_agent/node/snapshot.h"

#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "support/sysfs_tree.h"
#include "vfio_gpu_agent/dra/devices.h"
#include "vfio_gpu_agent/node/source.h"
#include "vfio_gpu_agent/plugin/devices.h"
#include "vfio_gpu_agent/plugin/frontend.h"

namespace vfio_agent::node {
namespace {

using ::testing::ElementsAre;

constexpr char kH200[] = "nvidia.com/GH100_H200_SXM_141GB";

class NodeTest : public ::testing::Test {
 protected:
  NodeTest() : tree_(dir_.path() / "sys"), names_(nullptr, "nvidia.com", {}) {
    paths_.sysfs_root = tree_.root();
    paths_.dev_root = dir_.path() / "dev";
    std::filesystem::create_directories(paths_.dev_root / "vfio");
  }

  void GroupNode(int group) { std::ofstream(paths_.dev_root / "vfio" / std::to_string(group)) << ""; }

  testing::TempDir dir_;
  testing::SysfsTree tree_;
  names::NameResolver names_;
  HostPaths paths_;
};

TEST_F(NodeTest, EveryGpuIsInTheModelWhateverItsDriverAndBothFrontendsReadIt) {
  tree_.AddDevice({.bdf = "0000:3b:00.0", .numa_node = 1, .driver = "vfio-pci", .iommu_group = 12});
  tree_.AddDevice({.bdf = "0000:5d:00.0", .driver = "nvidia", .iommu_group = 13});
  GroupNode(12);
  absl::StatusOr<pci::Inventory> inventory = pci::Scan(paths_.sysfs_root);
  ASSERT_TRUE(inventory.ok()) << inventory.status();
  const pci::Selection selection = pci::Select(*inventory, {});
  const Snapshot node = Build(paths_, *inventory, selection, names_, nullptr);

  ASSERT_EQ(node.devices.size(), 2u);
  const Device* bound = node.Find("0000:3b:00.0");
  ASSERT_NE(bound, nullptr);
  EXPECT_EQ(bound->kind, Kind::kGpu);
  EXPECT_EQ(bound->resource_name, kH200);
  EXPECT_TRUE(bound->healthy()) << bound->unhealthy_reason;
  EXPECT_EQ(bound->numa_node, 1);
  EXPECT_EQ(bound->iommu_group, 12);
  EXPECT_THAT(bound->pcie_root, ::testing::StartsWith("pci"));
  EXPECT_EQ(node.Find("0000:5d:00.0")->unhealthy_reason, "driver nvidia");

  // The device plugin advertises what has been on vfio; the DRA driver every GPU; same names, same health.
  const plugin::DeviceSnapshot served = plugin::WholeDevicesOf(node, {});
  ASSERT_EQ(served.resources.size(), 1u);
  EXPECT_EQ(served.resources.at(kH200).devices.size(), 1u);
  const std::vector<dra::GpuDevice> published = dra::GpusOf(node, *inventory, nullptr, "gpu.example.com", {});
  ASSERT_EQ(published.size(), 2u);
  EXPECT_EQ(published[0].bdf, "0000:3b:00.0");
  EXPECT_TRUE(published[0].healthy());
  EXPECT_EQ(published[0].slice.attributes.at("gpu.example.com/resourceName").text, "GH100_H200_SXM_141GB");
  EXPECT_EQ(published[0].slice.attributes.at("resource.kubernetes.io/pcieRoot").text, bound->pcie_root);
  EXPECT_EQ(published[1].unhealthy_reason, "driver nvidia");
}

// What `validate` and the daemon judge the node by (ServedOf) is what the device plugin serves of the same model:
// validate's rule (a GPU counts once on vfio) is the plugin's with nothing remembered, the daemon's (every selected
// GPU) the plugin's once it has seen each on vfio; the model's health, reasons and names come through unchanged.
TEST_F(NodeTest, ServedOfIsWhatTheDevicePluginServesOfTheSameModel) {
  tree_.AddDevice({.bdf = "0000:3b:00.0", .driver = "vfio-pci", .iommu_group = 12});
  tree_.AddDevice({.bdf = "0000:5d:00.0", .driver = "vfio-pci", .iommu_group = 13});  // no /dev/vfio/13
  tree_.AddDevice({.bdf = "0000:86:00.0", .device = 0x2236, .driver = "nvidia", .iommu_group = 14});
  GroupNode(12);
  absl::StatusOr<pci::Inventory> inventory = pci::Scan(paths_.sysfs_root);
  ASSERT_TRUE(inventory.ok()) << inventory.status();
  const pci::Selection selection = pci::Select(*inventory, {});
  const Snapshot node = Build(paths_, *inventory, selection, names_, nullptr);

  const ServedDevices on_vfio = ServedOf(node, WholeDevices::kOnVfio);
  ASSERT_EQ(on_vfio.size(), 2u);
  EXPECT_EQ(on_vfio[0], (ServedDevice{.resource_name = kH200, .id = "0000:3b:00.0", .healthy = true}));
  EXPECT_EQ(on_vfio[1].id, "0000:5d:00.0");
  EXPECT_FALSE(on_vfio[1].healthy);
  EXPECT_EQ(on_vfio[1].unhealthy_reason, node.Find("0000:5d:00.0")->unhealthy_reason);
  EXPECT_EQ(on_vfio, plugin::ServedOf(plugin::WholeDevicesOf(node, {})));

  const ServedDevices every = ServedOf(node, WholeDevices::kEverySelected);
  ASSERT_EQ(every.size(), 3u);
  EXPECT_EQ(every, plugin::ServedOf(plugin::WholeDevicesOf(
                       node, std::set<std::string>(selection.gpus.begin(), selection.gpus.end()))));
  std::map<std::string, ServedDevices> by_resource = ByResource(every);
  ASSERT_EQ(by_resource.size(), 2u);
  EXPECT_EQ(by_resource.at(kH200).size(), 2u);
  by_resource.erase(kH200);
  const ServedDevices& other = by_resource.begin()->second;
  ASSERT_EQ(other.size(), 1u);
  EXPECT_EQ(other[0].id, "0000:86:00.0");
  EXPECT_EQ(other[0].unhealthy_reason, "driver nvidia");
}

TEST_F(NodeTest, BindOnPrepareJudgesAGpuOnItsHostDriverByWhetherAClaimCouldBindIt) {
  tree_.AddDevice({.bdf = "0000:3b:00.0", .driver = "nvidia", .iommu_group = 12});
  absl::StatusOr<pci::Inventory> inventory = pci::Scan(paths_.sysfs_root);
  ASSERT_TRUE(inventory.ok());
  const pci::Selection selection = pci::Select(*inventory, {});
  EXPECT_EQ(Build(paths_, *inventory, selection, names_, nullptr).devices.at(0).unhealthy_reason, "driver nvidia");
  EXPECT_TRUE(Build(paths_, *inventory, selection, names_, nullptr, {.bind_on_prepare = true}).devices.at(0).healthy());
}

class FakeFabric : public Fabric {
 public:
  std::string Unusable(const std::string& bdf) const override {
    return bdf == "0000:5d:00.0" ? "not in any Fabric Manager partition" : "";
  }
  std::vector<std::string> Partitions(const std::string& bdf) const override {
    return bdf == "0000:3b:00.0" ? std::vector<std::string>{"0", "3"} : std::vector<std::string>{};
  }
};

TEST_F(NodeTest, FabricManagerSaysWhichPartitionsHoldAGpuAndWhichItDoesNotVouchFor) {
  tree_.AddDevice({.bdf = "0000:3b:00.0", .driver = "vfio-pci", .iommu_group = 12});
  tree_.AddDevice({.bdf = "0000:5d:00.0", .driver = "vfio-pci", .iommu_group = 13});
  GroupNode(12);
  GroupNode(13);
  absl::StatusOr<pci::Inventory> inventory = pci::Scan(paths_.sysfs_root);
  ASSERT_TRUE(inventory.ok());
  const FakeFabric fabric;
  const Snapshot node = Build(paths_, *inventory, pci::Select(*inventory, {}), names_, nullptr, {.fabric = &fabric});
  EXPECT_THAT(node.Find("0000:3b:00.0")->partitions, ElementsAre("0", "3"));
  EXPECT_TRUE(node.Find("0000:3b:00.0")->healthy());
  EXPECT_EQ(node.Find("0000:5d:00.0")->unhealthy_reason, "not in any Fabric Manager partition");
}

TEST_F(NodeTest, SourceScansSysfsOnceAndHandsEverySubscriberTheSameState) {
  tree_.AddDevice({.bdf = "0000:3b:00.0", .driver = "vfio-pci", .iommu_group = 12});
  GroupNode(12);
  Source source({.paths = paths_});
  std::vector<std::shared_ptr<const State>> seen_a, seen_b;
  source.Subscribe([&](const std::shared_ptr<const State>& state) { seen_a.push_back(state); });
  source.Subscribe([&](const std::shared_ptr<const State>& state) { seen_b.push_back(state); });
  EXPECT_EQ(source.Current(), nullptr);

  const uint64_t scans_before = pci::ScansStarted();
  absl::StatusOr<std::shared_ptr<const State>> state = source.Rescan();
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(pci::ScansStarted() - scans_before, 1u);
  EXPECT_EQ((*state)->generation, 1u);
  ASSERT_EQ(seen_a.size(), 1u);
  EXPECT_EQ(seen_a[0], *state);
  EXPECT_EQ(seen_b[0], *state);
  EXPECT_EQ(source.Current(), *state);
  EXPECT_EQ((*state)->snapshot.devices.at(0).resource_name, kH200);
}

TEST_F(NodeTest, SourceReportsAnUnreadableSysfsAndKeepsTheLastState) {
  Source source({.paths = {.sysfs_root = dir_.path() / "missing"}});
  int calls = 0;
  source.Subscribe([&](const std::shared_ptr<const State>&) { ++calls; });
  EXPECT_FALSE(source.Rescan().ok());
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(source.Current(), nullptr);
}

}  // namespace
}  // namespace vfio_agent::node
