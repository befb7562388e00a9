#include "vfio_gpu_agent/pci/selection.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "support/sysfs_tree.h"

namespace vfio_agent::pci {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using vfio_agent::testing::FakePciDevice;
using vfio_agent::testing::SysfsTree;
using vfio_agent::testing::TempDir;

constexpr uint16_t kIntel = 0x8086;

TEST(ClassPrefixTest, ParsesTwoFourAndSixDigitPrefixes) {
  auto prefixes = ParseClassPrefixes("03, 0302,0x030200");
  ASSERT_TRUE(prefixes.ok()) << prefixes.status();
  ASSERT_EQ(prefixes->size(), 3u);
  EXPECT_EQ((*prefixes)[0].value, 0x030000u);
  EXPECT_EQ((*prefixes)[0].bits, 8);
  EXPECT_EQ((*prefixes)[1].value, 0x030200u);
  EXPECT_EQ((*prefixes)[1].bits, 16);
  EXPECT_EQ((*prefixes)[2].value, 0x030200u);
  EXPECT_EQ((*prefixes)[2].bits, 24);
}

TEST(ClassPrefixTest, RejectsMalformedLists) {
  for (const char* text : {"", "3", "030", "03000", "0300000", "zz", "0300,", "0300;0302", "-300"}) {
    EXPECT_FALSE(ParseClassPrefixes(text).ok()) << text;
  }
}

TEST(ClassPrefixTest, MatchesOnTheTopBitsOnly) {
  const ClassPrefix display{0x030000, 8};
  const ClassPrefix three_d{0x030200, 16};
  const ClassPrefix exact{0x030200, 24};
  EXPECT_TRUE(display.Matches(0x030000));
  EXPECT_TRUE(display.Matches(0x038000));
  EXPECT_FALSE(display.Matches(0x040300));
  EXPECT_TRUE(three_d.Matches(0x030200));
  EXPECT_TRUE(three_d.Matches(0x030201)) << "prog-if must not matter for a 16-bit prefix";
  EXPECT_FALSE(three_d.Matches(0x030000));
  EXPECT_TRUE(exact.Matches(0x030200));
  EXPECT_FALSE(exact.Matches(0x030201));
}

TEST(DriverTest, VfioAndViableDrivers) {
  EXPECT_TRUE(IsVfioDriver("vfio-pci"));
  EXPECT_TRUE(IsVfioDriver("nvgrace_gpu_vfio_pci"));
  EXPECT_TRUE(IsVfioDriver("mlx5_vfio_pci"));
  EXPECT_FALSE(IsVfioDriver("nvidia"));
  EXPECT_FALSE(IsVfioDriver("vfio"));
  EXPECT_FALSE(IsVfioDriver("vfio-pci-old"));
  EXPECT_FALSE(IsVfioDriver(""));
  EXPECT_TRUE(IsViableDriver(""));
  EXPECT_TRUE(IsViableDriver("pci-stub"));
  EXPECT_TRUE(IsViableDriver("vfio-pci"));
  EXPECT_FALSE(IsViableDriver("nouveau"));
  EXPECT_FALSE(IsViableDriver("snd_hda_intel"));
}

class SelectionTest : public ::testing::Test {
 protected:
  Selection ScanAndSelect(const SelectionPolicy& policy = {}) {
    auto scanned = Scan(tree_.root());
    EXPECT_TRUE(scanned.ok()) << scanned.status();
    if (scanned.ok()) inventory_ = std::move(*scanned);
    return Select(inventory_, policy);
  }

  TempDir dir_;
  SysfsTree tree_{dir_.path()};
  Inventory inventory_ = MakeInventory({}, {}, false);
};

TEST_F(SelectionTest, SelectsVgaAnd3dControllersOfTheVendorOnly) {
  tree_.AddDevice({.bdf = "0000:01:00.0", .class_code = kClassVgaController, .iommu_group = 1});
  tree_.AddDevice({.bdf = "0000:02:00.0", .class_code = kClass3dController, .iommu_group = 2});
  tree_.AddDevice({.bdf = "0000:03:00.0", .class_code = 0x038000, .iommu_group = 3});
  tree_.AddDevice({.bdf = "0000:04:00.0", .vendor = 0x1002, .class_code = kClassVgaController, .iommu_group = 4});
  Selection selection = ScanAndSelect();
  EXPECT_THAT(selection.gpus, ElementsAre("0000:01:00.0", "0000:02:00.0"));
  EXPECT_THAT(selection.unisolated, IsEmpty());
  ASSERT_EQ(selection.groups.size(), 2u);
  EXPECT_EQ(selection.groups[0].id, 1);
  EXPECT_EQ(selection.groups[1].id, 2);
  EXPECT_EQ(selection.RoleOf("0000:01:00.0"), Role::kGpu);
  EXPECT_EQ(selection.RoleOf("0000:03:00.0"), Role::kForeign);
}

TEST_F(SelectionTest, PolicyCanSelectOtherVendorsAndClasses) {
  tree_.AddDevice({.bdf = "0000:00:03.0", .vendor = 0x1af4, .class_code = 0x020000, .iommu_group = 0});
  tree_.AddDevice({.bdf = "0000:01:00.0", .class_code = kClass3dController, .iommu_group = 1});
  SelectionPolicy policy{.vendor_id = 0x1af4, .classes = *ParseClassPrefixes("02")};
  Selection selection = ScanAndSelect(policy);
  EXPECT_THAT(selection.gpus, ElementsAre("0000:00:03.0"));
}

TEST_F(SelectionTest, VirtualFunctionsAreSkipped) {
  tree_.AddDevice({.bdf = "0000:3b:00.0", .iommu_group = 1});
  tree_.AddDevice({.bdf = "0000:3b:00.4", .iommu_group = 2, .physfn = "0000:3b:00.0"});
  Selection selection = ScanAndSelect();
  EXPECT_THAT(selection.gpus, ElementsAre("0000:3b:00.0"));
  ASSERT_EQ(selection.groups.size(), 1u);
}

TEST_F(SelectionTest, CompanionsTravelWithTheirGpu) {
  const std::vector<std::string> companions = {"0000:0a:00.1", "0000:0a:00.2", "0000:0a:00.3"};
  tree_.AddDevice({.bdf = "0000:0a:00.1", .device = 0x1aeb, .class_code = kClassHdAudio, .driver = "vfio-pci",
                   .iommu_group = 9});
  tree_.AddDevice({.bdf = "0000:0a:00.2", .device = 0x1aec, .class_code = kClassUsb, .iommu_group = 9});
  tree_.AddDevice({.bdf = "0000:0a:00.3", .device = 0x1aed, .class_code = kClassUcsi, .driver = "pci-stub",
                   .iommu_group = 9});
  tree_.AddDevice({.bdf = "0000:0a:00.0", .device = 0x1e04, .class_code = kClassVgaController,
                   .multifunction = true, .driver = "vfio-pci", .iommu_group = 9, .consumers = companions});
  Selection selection = ScanAndSelect();
  EXPECT_THAT(selection.gpus, ElementsAre("0000:0a:00.0"));
  EXPECT_EQ(selection.companions, companions);
  ASSERT_EQ(selection.groups.size(), 1u);
  const GroupAssessment& group = selection.groups[0];
  EXPECT_EQ(group.id, 9);
  EXPECT_TRUE(group.viable);
  EXPECT_TRUE(group.usable);
  EXPECT_THAT(group.blockers, IsEmpty());
  ASSERT_EQ(group.members.size(), 4u);
  EXPECT_EQ(group.members[0].role, Role::kGpu);
  for (size_t i = 1; i < 4; ++i) EXPECT_EQ(group.members[i].role, Role::kCompanion) << group.members[i].bdf;
  EXPECT_EQ(selection.RoleOf("0000:0a:00.2"), Role::kCompanion);
  EXPECT_EQ(selection.GroupOf(*inventory_.Find("0000:0a:00.2")), &group);
}

TEST_F(SelectionTest, CompanionOnAHostDriverMakesTheGroupNotViableButStillUsable) {
  tree_.AddDevice({.bdf = "0000:0a:00.0", .class_code = kClassVgaController, .driver = "vfio-pci",
                   .iommu_group = 9});
  tree_.AddDevice({.bdf = "0000:0a:00.1", .class_code = kClassHdAudio, .driver = "snd_hda_intel",
                   .iommu_group = 9});
  Selection selection = ScanAndSelect();
  ASSERT_EQ(selection.groups.size(), 1u);
  EXPECT_FALSE(selection.groups[0].viable);
  EXPECT_TRUE(selection.groups[0].usable);
  EXPECT_THAT(selection.groups[0].blockers, IsEmpty());
}

TEST_F(SelectionTest, GpuOnNvidiaDriverIsNotViableYet) {
  tree_.AddDevice({.bdf = "0000:0a:00.0", .driver = "nvidia", .iommu_group = 9});
  Selection selection = ScanAndSelect();
  ASSERT_EQ(selection.groups.size(), 1u);
  EXPECT_FALSE(selection.groups[0].viable);
  EXPECT_TRUE(selection.groups[0].usable);
}

TEST_F(SelectionTest, NvSwitchesOnlyWhenAsked) {
  tree_.AddDevice({.bdf = "0000:05:00.0", .device = 0x22a3, .class_code = kClassBridgeOther, .iommu_group = 5});
  tree_.AddDevice({.bdf = "0000:18:00.0", .iommu_group = 18});
  EXPECT_THAT(ScanAndSelect().gpus, ElementsAre("0000:18:00.0"));

  Selection selection = ScanAndSelect({.include_nvswitches = true});
  EXPECT_THAT(selection.gpus, ElementsAre("0000:05:00.0", "0000:18:00.0"));
  EXPECT_EQ(selection.RoleOf("0000:05:00.0"), Role::kNvSwitch);
  EXPECT_EQ(selection.RoleOf("0000:18:00.0"), Role::kGpu);
  ASSERT_EQ(selection.groups.size(), 2u);
  EXPECT_EQ(selection.groups[0].members[0].role, Role::kNvSwitch);
}

TEST_F(SelectionTest, ForeignEndpointOnAnotherDriverBlocksTheGroup) {
  tree_.AddDevice({.bdf = "0000:3b:00.0", .driver = "vfio-pci", .iommu_group = 30});
  tree_.AddDevice({.bdf = "0000:3b:00.2", .vendor = kIntel, .device = 0x1572, .class_code = 0x020000,
                   .driver = "i40e", .iommu_group = 30});
  Selection selection = ScanAndSelect();
  ASSERT_EQ(selection.groups.size(), 1u);
  const GroupAssessment& group = selection.groups[0];
  EXPECT_FALSE(group.viable);
  EXPECT_FALSE(group.usable);
  EXPECT_THAT(group.blockers, ElementsAre("0000:3b:00.2 8086:1572 bound to i40e"));
  EXPECT_EQ(group.members[1].role, Role::kForeign);
  EXPECT_THAT(selection.companions, IsEmpty());
}

TEST_F(SelectionTest, ForeignEndpointUnboundOrOnVfioDoesNotBlock) {
  tree_.AddDevice({.bdf = "0000:3b:00.0", .driver = "vfio-pci", .iommu_group = 30});
  tree_.AddDevice({.bdf = "0000:3b:00.2", .vendor = kIntel, .class_code = 0x020000, .iommu_group = 30});
  tree_.AddDevice({.bdf = "0000:3b:00.3", .vendor = kIntel, .class_code = 0x020000, .driver = "vfio-pci",
                   .iommu_group = 30});
  Selection selection = ScanAndSelect();
  ASSERT_EQ(selection.groups.size(), 1u);
  EXPECT_TRUE(selection.groups[0].viable);
  EXPECT_TRUE(selection.groups[0].usable);
}

TEST_F(SelectionTest, BridgeInTheGroupStaysViable) {
  tree_.AddDevice({.bdf = "0000:00:01.0", .vendor = kIntel, .class_code = 0x060400, .header_type = 1,
                   .driver = "pcieport", .iommu_group = 2});
  tree_.AddDevice({.bdf = "0000:01:00.0", .driver = "vfio-pci", .iommu_group = 2, .parent = "0000:00:01.0"});
  Selection selection = ScanAndSelect();
  ASSERT_EQ(selection.groups.size(), 1u);
  const GroupAssessment& group = selection.groups[0];
  EXPECT_TRUE(group.viable);
  EXPECT_TRUE(group.usable);
  ASSERT_EQ(group.members.size(), 2u);
  EXPECT_EQ(group.members[0].role, Role::kBridge);
  EXPECT_EQ(selection.RoleOf("0000:00:01.0"), Role::kBridge);
}

TEST_F(SelectionTest, UnreadableGroupMemberBlocksTheGroup) {
  tree_.AddDevice({.bdf = "0000:01:00.0", .driver = "vfio-pci", .iommu_group = 2});
  tree_.AddDevice({.bdf = "0000:01:00.1", .iommu_group = 2});
  tree_.WriteAttribute("0000:01:00.1", "vendor", "bogus\n");
  Selection selection = ScanAndSelect();
  ASSERT_EQ(selection.groups.size(), 1u);
  EXPECT_FALSE(selection.groups[0].viable);
  EXPECT_FALSE(selection.groups[0].usable);
  ASSERT_EQ(selection.groups[0].blockers.size(), 1u);
  EXPECT_THAT(selection.groups[0].blockers[0], ::testing::StartsWith("0000:01:00.1 "));
}

TEST_F(SelectionTest, IommuOffLeavesSelectedFunctionsUnisolated) {
  tree_.AddDevice({.bdf = "0000:01:00.0", .driver = "nvidia"});
  tree_.AddDevice({.bdf = "0000:02:00.0", .driver = "nvidia"});
  Selection selection = ScanAndSelect();
  EXPECT_FALSE(inventory_.iommu_enabled());
  EXPECT_THAT(selection.gpus, ElementsAre("0000:01:00.0", "0000:02:00.0"));
  EXPECT_THAT(selection.unisolated, ElementsAre("0000:01:00.0", "0000:02:00.0"));
  EXPECT_THAT(selection.groups, IsEmpty());
  EXPECT_EQ(selection.GroupOf(*inventory_.Find("0000:01:00.0")), nullptr);
}

TEST(RoleNameTest, NamesEveryRole) {
  EXPECT_STREQ(RoleName(Role::kGpu), "gpu");
  EXPECT_STREQ(RoleName(Role::kCompanion), "companion");
  EXPECT_STREQ(RoleName(Role::kNvSwitch), "nvswitch");
  EXPECT_STREQ(RoleName(Role::kBridge), "bridge");
  EXPECT_STREQ(RoleName(Role::kForeign), "foreign");
}

}  // namespace
}  // namespace vfio_agent::pci
