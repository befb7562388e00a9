#include "vfio_gpu_agent/binding/plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace vfio_agent::binding {
namespace {

using ::testing::HasSubstr;

pci::Function Fn(std::string bdf, uint16_t vendor, uint16_t device, uint32_t class_code, std::optional<int> group,
                 std::string driver) {
  pci::Function fn;
  fn.bdf = std::move(bdf);
  fn.vendor_id = vendor;
  fn.device_id = device;
  fn.subsystem_vendor_id = vendor;
  fn.subsystem_device_id = 0x1482;
  fn.class_code = class_code;
  fn.header_type = (class_code >> 8) == 0x0604 ? 1 : 0;
  fn.iommu_group = group;
  fn.driver = std::move(driver);
  return fn;
}

Plan PlanFor(std::vector<pci::Function> functions, const TargetDriverChooser& chooser,
             pci::SelectionPolicy policy = {}) {
  const bool iommu = std::any_of(functions.begin(), functions.end(), [](const auto& f) { return f.iommu_group; });
  pci::Inventory inventory = pci::MakeInventory(std::move(functions), {}, iommu);
  return MakePlan(inventory, pci::Select(inventory, policy), chooser);
}

const TargetDriverChooser kVfioOnly(VariantTable{}, {"nvidia", "vfio-pci"});

TEST(ModaliasTest, MatchesKernelFormat) {
  pci::Function fn = Fn("0000:3b:00.0", 0x10de, 0x2342, 0x030200, 1, "nvidia");
  fn.subsystem_device_id = 0x16eb;
  EXPECT_EQ(Modalias(fn), "pci:v000010DEd00002342sv000010DEsd000016EBbc03sc02i00");
}

TEST(SameDriverTest, DashAndUnderscoreAreEqual) {
  EXPECT_TRUE(SameDriver("vfio_pci", "vfio-pci"));
  EXPECT_TRUE(SameDriver("nvgrace-gpu-vfio-pci", "nvgrace_gpu_vfio_pci"));
  EXPECT_FALSE(SameDriver("vfio-pci", "nvidia"));
}

TEST(VariantTableTest, FewestWildcardsWins) {
  VariantTable table = VariantTable::Parse(
      "alias pci:v000010DEd*sv*sd*bc03sc*i* nvidia\n"
      "alias vfio_pci:v000010DEd*sv*sd*bc*sc*i* generic_nvidia_vfio_pci\n"
      "alias vfio_pci:v000010DEd00002342sv*sd*bc*sc*i* nvgrace_gpu_vfio_pci\n"
      "alias vfio_pci:v000015B3d0000101Esv*sd*bc*sc*i* mlx5_vfio_pci\n");
  EXPECT_EQ(table.size(), 3u);
  EXPECT_EQ(table.BestVariant("pci:v000010DEd00002342sv000010DEsd000016EBbc03sc02i00"), "nvgrace_gpu_vfio_pci");
  EXPECT_EQ(table.BestVariant("pci:v000010DEd00002335sv000010DEsd000018BEbc03sc02i00"), "generic_nvidia_vfio_pci");
  EXPECT_EQ(table.BestVariant("pci:v00008086d00001572sv00008086sd00000001bc02sc00i00"), std::nullopt);
}

TEST(ChooserTest, VariantUsesRegisteredDirectoryName) {
  VariantTable table = VariantTable::Parse("alias vfio_pci:v000010DEd00002342sv*sd*bc*sc*i* nvgrace_gpu_vfio_pci\n");
  TargetDriverChooser registered(table, {"nvgrace-gpu-vfio-pci", "vfio-pci"});
  TargetDriverChooser missing(table, {"vfio-pci"});
  const pci::Function gh200 = Fn("0009:01:00.0", 0x10de, 0x2342, 0x030200, 9, "nvidia");
  const pci::Function h100 = Fn("0000:3b:00.0", 0x10de, 0x2330, 0x030200, 1, "nvidia");

  TargetDriverChooser::Choice choice = registered.Choose(gh200);
  EXPECT_EQ(choice.driver, "nvgrace-gpu-vfio-pci");
  EXPECT_EQ(choice.module, "nvgrace_gpu_vfio_pci");
  EXPECT_TRUE(choice.registered);

  choice = missing.Choose(gh200);
  EXPECT_EQ(choice.driver, "nvgrace_gpu_vfio_pci");
  EXPECT_FALSE(choice.registered);

  choice = missing.Choose(h100);
  EXPECT_EQ(choice.driver, "vfio-pci");
  EXPECT_EQ(choice.module, "vfio_pci");
  EXPECT_TRUE(choice.registered);
}

TEST(MakePlanTest, WholeGroupMovesAndBridgeStays) {
  Plan plan = PlanFor({Fn("0000:00:01.0", 0x8086, 0x1901, 0x060400, 12, "pcieport"),
                       Fn("0000:01:00.0", 0x10de, 0x1eb1, 0x030000, 12, "nvidia"),
                       Fn("0000:01:00.1", 0x10de, 0x10f8, 0x040300, 12, "snd_hda_intel"),
                       Fn("0000:01:00.2", 0x10de, 0x1ad8, 0x0c0330, 12, "xhci_hcd")},
                      kVfioOnly);
  ASSERT_EQ(plan.groups.size(), 1u);
  const PlannedGroup& group = plan.groups[0];
  EXPECT_EQ(group.id, 12);
  EXPECT_FALSE(group.blocked);
  EXPECT_TRUE(group.NeedsWrites());
  ASSERT_EQ(group.functions.size(), 4u);
  EXPECT_EQ(group.functions[0].action, Action::kStays);
  EXPECT_EQ(group.functions[0].role, pci::Role::kBridge);
  for (size_t i = 1; i < 4; ++i) {
    EXPECT_EQ(group.functions[i].action, Action::kBind) << group.functions[i].bdf;
    EXPECT_EQ(group.functions[i].target_driver, "vfio-pci");
  }
  EXPECT_EQ(group.functions[1].role, pci::Role::kGpu);
  EXPECT_EQ(group.functions[2].role, pci::Role::kCompanion);
}

TEST(MakePlanTest, ForeignEndpointOnItsDriverBlocksTheGroup) {
  Plan plan = PlanFor({Fn("0000:3b:00.0", 0x10de, 0x2236, 0x030200, 30, "nvidia"),
                       Fn("0000:3c:00.0", 0x8086, 0x1572, 0x020000, 30, "i40e"),
                       Fn("0000:86:00.0", 0x10de, 0x2236, 0x030200, 31, "nvidia")},
                      kVfioOnly);
  ASSERT_EQ(plan.groups.size(), 2u);
  EXPECT_TRUE(plan.groups[0].blocked);
  EXPECT_THAT(plan.groups[0].reason, HasSubstr("0000:3c:00.0 8086:1572 bound to i40e"));
  EXPECT_EQ(plan.Find("0000:3b:00.0")->action, Action::kBlocked);
  EXPECT_EQ(plan.Find("0000:3c:00.0")->action, Action::kBlocked);
  EXPECT_FALSE(plan.groups[1].blocked);
  EXPECT_EQ(plan.Find("0000:86:00.0")->action, Action::kBind);
  EXPECT_THAT(FormatPlan(plan), HasSubstr("group 30: BLOCKED"));
}

TEST(MakePlanTest, UnboundForeignEndpointDoesNotBlock) {
  Plan plan = PlanFor({Fn("0000:3b:00.0", 0x10de, 0x2236, 0x030200, 30, "nvidia"),
                       Fn("0000:3c:00.0", 0x8086, 0x1572, 0x020000, 30, "")},
                      kVfioOnly);
  ASSERT_EQ(plan.groups.size(), 1u);
  EXPECT_FALSE(plan.groups[0].blocked);
  EXPECT_EQ(plan.Find("0000:3c:00.0")->action, Action::kStays);
  EXPECT_EQ(plan.Find("0000:3b:00.0")->action, Action::kBind);
}

TEST(MakePlanTest, NoIommuGroupIsBlockedWithoutId) {
  Plan plan = PlanFor({Fn("0000:3b:00.0", 0x10de, 0x1eb8, 0x030200, std::nullopt, "nvidia")}, kVfioOnly);
  ASSERT_EQ(plan.groups.size(), 1u);
  EXPECT_FALSE(plan.groups[0].id.has_value());
  EXPECT_TRUE(plan.groups[0].blocked);
  EXPECT_EQ(plan.groups[0].functions[0].action, Action::kBlocked);
  EXPECT_THAT(plan.groups[0].functions[0].reason, HasSubstr("no IOMMU group"));
}

TEST(MakePlanTest, AlreadyOnVfioNeedsNoWritesAndIsNotMovedToAVariant) {
  VariantTable table = VariantTable::Parse("alias vfio_pci:v000010DEd00002236sv*sd*bc*sc*i* a10_vfio_pci\n");
  TargetDriverChooser chooser(table, {"vfio-pci", "a10_vfio_pci"});
  Plan plan = PlanFor({Fn("0000:3b:00.0", 0x10de, 0x2236, 0x030200, 33, "vfio-pci")}, chooser);
  ASSERT_EQ(plan.groups.size(), 1u);
  EXPECT_FALSE(plan.groups[0].NeedsWrites());
  const PlannedFunction& fn = plan.groups[0].functions[0];
  EXPECT_EQ(fn.action, Action::kAlreadyBound);
  EXPECT_EQ(fn.target_driver, "vfio-pci");
  EXPECT_THAT(fn.reason, HasSubstr("best vfio driver is a10_vfio_pci"));
}

TEST(MakePlanTest, UnregisteredTargetIsNoted) {
  TargetDriverChooser chooser(VariantTable{}, {"nvidia"});
  Plan plan = PlanFor({Fn("0000:3b:00.0", 0x10de, 0x2236, 0x030200, 33, "nvidia")}, chooser);
  const PlannedFunction* fn = plan.Find("0000:3b:00.0");
  ASSERT_NE(fn, nullptr);
  EXPECT_EQ(fn->action, Action::kBind);
  EXPECT_FALSE(fn->target_registered);
  EXPECT_THAT(fn->reason, HasSubstr("module vfio_pci will be loaded"));
}

TEST(MakePlanTest, NvSwitchesOnlyWhenAsked) {
  std::vector<pci::Function> functions = {Fn("0000:05:00.0", 0x10de, 0x22a3, 0x068000, 40, "nvidia"),
                                          Fn("0000:18:00.0", 0x10de, 0x2335, 0x030200, 11, "nvidia")};
  Plan without = PlanFor(functions, kVfioOnly);
  EXPECT_EQ(without.Find("0000:05:00.0"), nullptr);
  pci::SelectionPolicy policy;
  policy.include_nvswitches = true;
  Plan with = PlanFor(functions, kVfioOnly, policy);
  ASSERT_NE(with.Find("0000:05:00.0"), nullptr);
  EXPECT_EQ(with.Find("0000:05:00.0")->role, pci::Role::kNvSwitch);
  EXPECT_EQ(with.Find("0000:05:00.0")->action, Action::kBind);
}

TEST(RestrictPlanTest, KeepsWholeGroupsOfTheNamedDevices) {
  Plan plan = PlanFor({Fn("0000:01:00.0", 0x10de, 0x1eb1, 0x030000, 12, "nvidia"),
                       Fn("0000:01:00.1", 0x10de, 0x10f8, 0x040300, 12, "snd_hda_intel"),
                       Fn("0000:86:00.0", 0x10de, 0x2236, 0x030200, 31, "nvidia")},
                      kVfioOnly);
  absl::StatusOr<Plan> only = RestrictPlan(plan, {"01:00.0"});
  ASSERT_TRUE(only.ok()) << only.status();
  ASSERT_EQ(only->groups.size(), 1u);
  EXPECT_EQ(only->groups[0].functions.size(), 2u);

  absl::StatusOr<Plan> unknown = RestrictPlan(plan, {"0000:99:00.0"});
  EXPECT_FALSE(unknown.ok());
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("0000:99:00.0"));
  // No BDF is no group: "every selected device" is never implied by an empty list (issue 31, defect 1).
  EXPECT_TRUE(RestrictPlan(plan, {})->groups.empty());
}

}  // namespace
}  // namespace vfio_agent::binding
