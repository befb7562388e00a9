#include "vfio_gpu_agent/vgpu/discovery.h"

#include <algorithm>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "support/sysfs_tree.h"
#include "vgpu/vgpu_tree.h"

namespace vfio_agent::vgpu {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using testing::FakePciDevice;
using testing::SysfsTree;
using testing::TempDir;
using namespace testing::vgpu_tree;

constexpr char kUuidA[] = "1b7e5c3a-0f4d-4a57-9b0e-3c8f1d2a6b01";
constexpr char kUuidB[] = "9a0c2e4f-6b8d-4f1a-8c3e-5d7f9b1a3c02";

constexpr char kL40sCatalog[] =
    "ID    : vGPU Name\n"
    "1155  : NVIDIA L40S-1Q\n"
    "1156:NVIDIA L40S-2Q\n"
    "   1157   :   NVIDIA L40S-4Q   \n";

class DiscoveryTest : public ::testing::Test {
 protected:
  DiscoveryTest() : tree_(dir_.path() / "sys") {}

  absl::StatusOr<Discovery> Run(CatalogStore& catalog) {
    absl::StatusOr<pci::Inventory> inventory = pci::Scan(tree_.root(), {.detail_vendor = 0x10de});
    EXPECT_TRUE(inventory.ok()) << inventory.status();
    return Discover(tree_.root(), *inventory, catalog);
  }

  // An L40S (10de:26b9) PF on nvidia with `vfs` VFs at functions 4.., each in its own group from `group`.
  void AddCard(const std::string& bus, int vfs, int group, const std::string& pf_catalog = kL40sCatalog) {
    const std::string pf = "0000:" + bus + ":00.0";
    tree_.AddDevice({.bdf = pf, .device = 0x26b9, .numa_node = 1, .driver = "nvidia", .iommu_group = group});
    SetCreatableTypes(tree_, pf, pf_catalog);
    for (int i = 0; i < vfs; ++i) {
      const std::string vf = "0000:" + bus + ":00." + std::to_string(4 + i);
      tree_.AddDevice({.bdf = vf, .device = 0x26b9, .driver = "nvidia", .iommu_group = group + 1 + i, .physfn = pf});
      SetVgpuType(tree_, vf, "0\n");
      SetCreatableTypes(tree_, vf, pf_catalog);
    }
  }

  std::filesystem::path StateFile() const { return dir_.path() / "state/vgpu-catalog.txt"; }

  // A scan by an agent that then stops: what it read of the catalogs is left in the state file.
  void ScanOnceKeepingState() {
    CatalogStore catalog(StateFile());
    ASSERT_TRUE(catalog.Load().ok());
    ASSERT_TRUE(Run(catalog).ok());
  }

  // A scan by an agent started afresh, which knows only the state file.
  Discovery RunAfterRestart() {
    CatalogStore catalog(StateFile());
    EXPECT_TRUE(catalog.Load().ok());
    return Checked(Run(catalog));
  }

  // A scan with a catalog kept in memory only.
  Discovery Scan() {
    CatalogStore catalog("");
    return Checked(Run(catalog));
  }

  // A scan that fails (the roots cannot be listed) fails the test.
  static Discovery Checked(absl::StatusOr<Discovery> found) {
    EXPECT_TRUE(found.ok()) << found.status();
    return found.ok() ? *std::move(found) : Discovery{};
  }

  static std::vector<std::string> TypeNames(const Discovery& found) {
    std::vector<std::string> names;
    for (const SriovVgpu& vgpu : found.vgpus) names.push_back(vgpu.type_name);
    return names;
  }

  static void ExpectClean(const Discovery& found, Framework framework) {
    EXPECT_THAT(found.errors, IsEmpty());
    ASSERT_TRUE(found.framework.ok()) << found.framework.status();
    EXPECT_EQ(*found.framework, framework);
  }

  // What a full card shows: every function's catalog is its header alone.
  void FillCard(const std::string& bus, int vfs) {
    SetCreatableTypes(tree_, "0000:" + bus + ":00.0", "ID    : vGPU Name\n");
    for (int i = 0; i < vfs; ++i) SetCreatableTypes(tree_, "0000:" + bus + ":00." + std::to_string(4 + i), "ID    : vGPU Name\n");
  }

  TempDir dir_;
  SysfsTree tree_;
};

TEST(ParseCreatableTypesTest, SkipsTheHeaderAndToleratesSpacingAroundTheColon) {
  EXPECT_EQ(ParseCreatableTypes(kL40sCatalog),
            (std::map<int, std::string>{{1155, "NVIDIA L40S-1Q"}, {1156, "NVIDIA L40S-2Q"}, {1157, "NVIDIA L40S-4Q"}}));
  EXPECT_THAT(ParseCreatableTypes("ID    : vGPU Name\n"), IsEmpty());
  EXPECT_THAT(ParseCreatableTypes("x12 : A\n12a : B\n : C\n13 :\n"), IsEmpty());
}

TEST(IsMdevUuidTest, AcceptsOnlyTheKernelsForm) {
  EXPECT_TRUE(IsMdevUuid(kUuidA));
  EXPECT_TRUE(IsMdevUuid("1B7E5C3A-0F4D-4A57-9B0E-3C8F1D2A6B01"));
  EXPECT_FALSE(IsMdevUuid("1b7e5c3a0f4d4a579b0e3c8f1d2a6b01"));
  EXPECT_FALSE(IsMdevUuid("0000:3b:00.0"));
  EXPECT_FALSE(IsMdevUuid("1b7e5c3a-0f4d-4a57-9b0e-3c8f1d2a6b0g"));
}

TEST_F(DiscoveryTest, NoVgpusIsFrameworkNone) {
  tree_.AddDevice({.bdf = "0000:3b:00.0", .device = 0x1eb8, .driver = "vfio-pci", .iommu_group = 12});
  const Discovery found = Scan();
  ExpectClean(found, Framework::kNone);
  EXPECT_THAT(found.mdevs, IsEmpty());
  EXPECT_THAT(found.vgpus, IsEmpty());
}

TEST_F(DiscoveryTest, MdevParentsTypesAndInstances) {
  tree_.AddDevice({.bdf = "0000:3b:00.0", .device = 0x1eb8, .driver = "nvidia", .iommu_group = 12});
  AddMdevParent(tree_, "0000:3b:00.0", {{"nvidia-222", "GRID T4-1Q", 14}, {"nvidia-223", "GRID T4-2Q", 0}});
  AddMdev(tree_, kUuidB, "0000:3b:00.0", "nvidia-222", 101);
  AddMdev(tree_, kUuidA, "0000:3b:00.0", "nvidia-222", 100);
  const Discovery found = Scan();
  ExpectClean(found, Framework::kMdev);
  ASSERT_EQ(found.parents.size(), 1u);
  EXPECT_EQ(found.parents[0].bdf, "0000:3b:00.0");
  ASSERT_EQ(found.parents[0].types.size(), 2u);
  EXPECT_EQ(found.parents[0].types[0].id, "nvidia-222");
  EXPECT_EQ(found.parents[0].types[0].name, "GRID T4-1Q");
  EXPECT_EQ(found.parents[0].types[0].available_instances, 14);
  EXPECT_EQ(found.parents[0].types[1].name, "GRID T4-2Q");
  EXPECT_EQ(found.parents[0].types[1].available_instances, 0);
  ASSERT_EQ(found.mdevs.size(), 2u);
  EXPECT_EQ(found.mdevs[0].uuid, kUuidA);
  EXPECT_EQ(found.mdevs[0].parent_bdf, "0000:3b:00.0");
  EXPECT_EQ(found.mdevs[0].type_id, "nvidia-222");
  EXPECT_EQ(found.mdevs[0].type_name, "GRID T4-1Q");
  EXPECT_EQ(found.mdevs[0].iommu_group, 100);
  EXPECT_EQ(found.mdevs[1].uuid, kUuidB);
  EXPECT_EQ(found.mdevs[1].iommu_group, 101);
}

TEST_F(DiscoveryTest, ABrokenMdevIsAnErrorOfThatMdevOnly) {
  tree_.AddDevice({.bdf = "0000:3b:00.0", .device = 0x1eb8, .driver = "nvidia", .iommu_group = 12});
  AddMdevParent(tree_, "0000:3b:00.0", {{"nvidia-222", "GRID T4-1Q", 14}});
  AddMdev(tree_, kUuidA, "0000:3b:00.0", "nvidia-222", 100);
  AddMdev(tree_, kUuidB, "0000:3b:00.0", "nvidia-222", 101);
  std::filesystem::remove(tree_.DeviceDir("0000:3b:00.0") / kUuidB / "mdev_type");
  const Discovery found = Scan();
  ASSERT_EQ(found.mdevs.size(), 1u);
  EXPECT_EQ(found.mdevs[0].uuid, kUuidA);
  ASSERT_EQ(found.errors.size(), 1u);
  EXPECT_EQ(found.errors[0].device, kUuidB);
  EXPECT_THAT(std::string(found.errors[0].status.message()), HasSubstr(std::string(kUuidB) + "/mdev_type"));
}

TEST_F(DiscoveryTest, SriovVgpuIsANvidiaVfWithANonZeroTypeNamedFromItsCard) {
  AddCard("3b", 4, 20);
  SetVgpuType(tree_, "0000:3b:00.4", "1156\n");
  SetVgpuType(tree_, "0000:3b:00.5", "");                 // empty: no vGPU
  std::filesystem::remove(tree_.DeviceDir("0000:3b:00.6") / "nvidia/current_vgpu_type");  // missing: no vGPU
  SetVgpuType(tree_, "0000:3b:00.7", "1155");
  const Discovery found = Scan();
  ExpectClean(found, Framework::kSriov);
  ASSERT_EQ(found.vgpus.size(), 2u);
  EXPECT_EQ(found.vgpus[0].bdf, "0000:3b:00.4");
  EXPECT_EQ(found.vgpus[0].pf_bdf, "0000:3b:00.0");
  EXPECT_EQ(found.vgpus[0].type_id, 1156);
  EXPECT_EQ(found.vgpus[0].type_name, "NVIDIA L40S-2Q");
  EXPECT_EQ(found.vgpus[1].bdf, "0000:3b:00.7");
  EXPECT_EQ(found.vgpus[1].type_name, "NVIDIA L40S-1Q");
  EXPECT_THAT(found.unresolved, IsEmpty());
}

TEST_F(DiscoveryTest, OnlyNvidiaDriverVfsOfVendor10deCount) {
  AddCard("3b", 2, 20);
  SetVgpuType(tree_, "0000:3b:00.4", "1155");
  SetVgpuType(tree_, "0000:3b:00.5", "1155");
  tree_.BindDriver("0000:3b:00.5", "vfio-pci");
  tree_.AddDevice({.bdf = "0000:5e:00.0", .vendor = 0x15b3, .device = 0x101d, .class_code = 0x020000,
                   .driver = "mlx5_core", .iommu_group = 40});
  tree_.AddDevice({.bdf = "0000:5e:00.2", .vendor = 0x15b3, .device = 0x101e, .class_code = 0x020000,
                   .driver = "nvidia", .iommu_group = 41, .physfn = "0000:5e:00.0"});
  SetVgpuType(tree_, "0000:5e:00.2", "1155");
  const Discovery found = Scan();
  ASSERT_EQ(found.vgpus.size(), 1u);
  EXPECT_EQ(found.vgpus[0].bdf, "0000:3b:00.4");
}

TEST_F(DiscoveryTest, AnUnreadableTypeIsAnErrorOfThatVfOnly) {
  AddCard("3b", 2, 20);
  SetVgpuType(tree_, "0000:3b:00.4", "banana\n");
  SetVgpuType(tree_, "0000:3b:00.5", "1157");
  const Discovery found = Scan();
  ASSERT_EQ(found.vgpus.size(), 1u);
  EXPECT_EQ(found.vgpus[0].type_name, "NVIDIA L40S-4Q");
  ASSERT_EQ(found.errors.size(), 1u);
  EXPECT_EQ(found.errors[0].device, "0000:3b:00.4");
  EXPECT_EQ(found.errors[0].path, tree_.root() / "bus/pci/devices/0000:3b:00.4/nvidia/current_vgpu_type");
}

TEST_F(DiscoveryTest, TypeIdsAreResolvedPerCard) {
  AddCard("3b", 1, 20);
  AddCard("5e", 1, 30, "ID : vGPU Name\n1155 : NVIDIA L40S-48Q\n");
  SetVgpuType(tree_, "0000:3b:00.4", "1155");
  SetVgpuType(tree_, "0000:5e:00.4", "1155");
  const Discovery found = Scan();
  EXPECT_THAT(TypeNames(found), ElementsAre("NVIDIA L40S-1Q", "NVIDIA L40S-48Q"));
}

TEST_F(DiscoveryTest, AFullCardStillResolvesFromThePersistedCatalog) {
  SetDriverVersion(tree_, "570.124.03");
  AddCard("3b", 2, 20);
  ScanOnceKeepingState();  // the agent saw the catalog before the card filled
  SetVgpuType(tree_, "0000:3b:00.4", "1157");
  SetVgpuType(tree_, "0000:3b:00.5", "1156");
  FillCard("3b", 2);
  const Discovery found = RunAfterRestart();
  EXPECT_THAT(found.errors, IsEmpty());
  EXPECT_THAT(found.unresolved, IsEmpty());
  EXPECT_THAT(TypeNames(found), ElementsAre("NVIDIA L40S-4Q", "NVIDIA L40S-2Q"));
}

TEST_F(DiscoveryTest, ANewDriverVersionDoesNotReuseNamesAndTheVfIsReportedNotNamed) {
  SetDriverVersion(tree_, "570.124.03");
  AddCard("3b", 1, 20);
  ScanOnceKeepingState();
  SetDriverVersion(tree_, "580.65.06");
  SetVgpuType(tree_, "0000:3b:00.4", "1155");
  FillCard("3b", 1);
  const Discovery found = RunAfterRestart();
  EXPECT_THAT(found.vgpus, IsEmpty());
  ASSERT_EQ(found.unresolved.size(), 1u);
  EXPECT_EQ(found.unresolved[0].bdf, "0000:3b:00.4");
  EXPECT_EQ(found.unresolved[0].pf_bdf, "0000:3b:00.0");
  EXPECT_EQ(found.unresolved[0].type_id, 1155);
  EXPECT_THAT(found.unresolved[0].reason, HasSubstr("0000:3b:00.0 10de:26b9 580.65.06"));
  // The stale map is gone from the file too: a later downgrade does not bring back names read under 580.
  CatalogStore reread(StateFile());
  ASSERT_TRUE(reread.Load().ok());
  EXPECT_EQ(reread.Lookup({"0000:3b:00.0", 0x10de, 0x26b9, "570.124.03"}, 1155), std::nullopt);
  // Still a vGPU node: an unresolved VF is an SR-IOV vGPU whose name is unknown.
  EXPECT_EQ(*found.framework, Framework::kSriov);
}

TEST_F(DiscoveryTest, AVfOfACardNeverSeenWithACatalogIsUnresolved) {
  AddCard("3b", 1, 20);
  SetVgpuType(tree_, "0000:3b:00.4", "1155");
  FillCard("3b", 1);
  const Discovery found = Scan();
  EXPECT_THAT(found.vgpus, IsEmpty());
  ASSERT_EQ(found.unresolved.size(), 1u);
  EXPECT_THAT(found.unresolved[0].reason, HasSubstr("vGPU type 1155 of 0000:3b:00.4"));
}

TEST_F(DiscoveryTest, BothFrameworksOnOneNodeAreRefusedNamingDevices) {
  tree_.AddDevice({.bdf = "0000:17:00.0", .device = 0x1eb8, .driver = "nvidia", .iommu_group = 12});
  AddMdevParent(tree_, "0000:17:00.0", {{"nvidia-222", "GRID T4-1Q", 16}});
  AddCard("3b", 1, 20);
  SetVgpuType(tree_, "0000:3b:00.4", "1155");
  const Discovery found = Scan();
  ASSERT_FALSE(found.framework.ok());
  EXPECT_EQ(found.framework.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(found.framework.status().message()), HasSubstr("mdev parents 0000:17:00.0"));
  EXPECT_THAT(std::string(found.framework.status().message()), HasSubstr("SR-IOV vGPUs (nvidia/current_vgpu_type set) 0000:3b:00.4"));
}

TEST_F(DiscoveryTest, SriovVfsWithoutATypeBesideMdevsAreNotMixed) {
  // Ampere after sriov-manage -e: the VFs are the mdev parents and carry no current_vgpu_type.
  tree_.AddDevice({.bdf = "0000:3b:00.0", .device = 0x2236, .driver = "nvidia", .iommu_group = 20});
  tree_.AddDevice({.bdf = "0000:3b:00.4", .device = 0x2236, .driver = "nvidia", .iommu_group = 21,
                   .physfn = "0000:3b:00.0"});
  AddMdevParent(tree_, "0000:3b:00.4", {{"nvidia-592", "NVIDIA A10-4Q", 1}});
  AddMdev(tree_, kUuidA, "0000:3b:00.4", "nvidia-592", 200);
  const Discovery found = Scan();
  ExpectClean(found, Framework::kMdev);
  ASSERT_EQ(found.mdevs.size(), 1u);
  EXPECT_EQ(found.mdevs[0].parent_bdf, "0000:3b:00.4");
}

TEST(CatalogStoreTest, SavesAtomicallyAndLoadsBack) {
  TempDir dir;
  const std::filesystem::path file = dir.path() / "state/vgpu-catalog.txt";
  const CardKey key{"0000:3b:00.0", 0x10de, 0x26b9, ""};
  CatalogStore store(file);
  EXPECT_TRUE(store.Merge(key, {{1155, "NVIDIA L40S-1Q"}, {1157, "NVIDIA L40S-4Q"}}));
  EXPECT_FALSE(store.Merge(key, {{1155, "NVIDIA L40S-1Q"}}));  // nothing new
  ASSERT_TRUE(store.Save().ok());
  std::vector<std::string> entries;
  for (const auto& entry : std::filesystem::directory_iterator(file.parent_path())) {
    entries.push_back(entry.path().filename().string());
  }
  std::sort(entries.begin(), entries.end());
  // No temporary file left behind; the lock file stays (the catalog itself is replaced by rename).
  EXPECT_THAT(entries, ElementsAre("vgpu-catalog.txt", "vgpu-catalog.txt.lock"));
  CatalogStore loaded(file);
  ASSERT_TRUE(loaded.Load().ok());
  EXPECT_EQ(loaded.Lookup(key, 1157), "NVIDIA L40S-4Q");
  EXPECT_EQ(loaded.Lookup({"0000:5e:00.0", 0x10de, 0x26b9, ""}, 1157), std::nullopt);
}

TEST(CatalogStoreTest, TwoStoresOfOneFileKeepWhatTheOtherSaved) {
  TempDir dir;
  const std::filesystem::path file = dir.path() / "state/vgpu-catalog.txt";
  const CardKey l40s{"0000:3b:00.0", 0x10de, 0x26b9, "550.54.14"};
  const CardKey h200{"0000:86:00.0", 0x10de, 0x2335, "550.54.14"};
  CatalogStore plugin(file), applier(file);
  // The applier saw the L40S while it was empty; the plugin only ever sees it full, but saves another card.
  applier.Merge(l40s, {{1157, "NVIDIA L40S-4Q"}});
  ASSERT_TRUE(applier.Save().ok());
  plugin.Merge(h200, {{1414, "NVIDIA H200X-1-18C"}});
  ASSERT_TRUE(plugin.Save().ok());
  EXPECT_EQ(plugin.Lookup(l40s, 1157), "NVIDIA L40S-4Q");
  CatalogStore restarted(file);
  ASSERT_TRUE(restarted.Load().ok());
  EXPECT_EQ(restarted.Lookup(l40s, 1157), "NVIDIA L40S-4Q");
  EXPECT_EQ(restarted.Lookup(h200, 1414), "NVIDIA H200X-1-18C");
  ASSERT_TRUE(applier.Refresh().ok());
  EXPECT_EQ(applier.Lookup(h200, 1414), "NVIDIA H200X-1-18C");
  // A card this store knows under a new driver version does not take the old version's names back.
  const CardKey l40s_new{"0000:3b:00.0", 0x10de, 0x26b9, "570.10"};
  applier.Merge(l40s_new, {{2001, "NVIDIA L40S-4Q"}});
  ASSERT_TRUE(applier.Refresh().ok());
  EXPECT_EQ(applier.Lookup(l40s, 1157), std::nullopt);
}

TEST(CatalogStoreTest, AMalformedFileIsAnErrorNamingPathAndLine) {
  TempDir dir;
  const std::filesystem::path file = dir.path() / "vgpu-catalog.txt";
  Write(file, "# header\n0000:3b:00.0 10de:26b9 - 1155 NVIDIA L40S-1Q\n0000:3b:00.0 nonsense\n");
  CatalogStore store(file);
  absl::Status status = store.Load();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(status.message()), HasSubstr(file.string() + " line 3"));
  EXPECT_EQ(store.Lookup({"0000:3b:00.0", 0x10de, 0x26b9, ""}, 1155), std::nullopt);
}

}  // namespace
}  // namespace vfio_agent::vgpu
