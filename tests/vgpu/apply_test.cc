// The profile applier on a plain tree: which files it writes (a plain tree does not react, so each test looks at
// the written attribute itself), and what it leaves alone.
#include "vfio_gpu_agent/vgpu/apply.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_format.h"
#include "support/holding_process.h"
#include "support/sysfs_tree.h"
#include "vgpu/vgpu_tree.h"

namespace vfio_agent::vgpu {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using testing::SysfsTree;
using testing::TempDir;
using namespace testing::vgpu_tree;

constexpr char kConfig[] = R"(version: v1
vgpu-configs:
  t4-1q-3:
    - devices: all
      vgpu-devices: {T4-1Q: 3}
  t4-2q-1:
    - devices: all
      vgpu-devices: {T4-2Q: 1}
  l40s-4q-2:
    - devices: all
      vgpu-devices: {L40S-4Q: 2}
  l40s-48q:
    - devices: all
      vgpu-devices: {L40S-48Q: 1}
)";

constexpr char kL40sCatalog[] = "ID    : vGPU Name\n1155  : NVIDIA L40S-1Q\n1157  : NVIDIA L40S-4Q\n";

std::string Read(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class ApplyTest : public ::testing::Test {
 protected:
  ApplyTest() : tree_(dir_.path() / "sys"), catalog_(dir_.path() / "state/vgpu-catalog.txt") {
    std::filesystem::create_directories(dir_.path() / "dev/vfio");
    file_ = *ParseVgpuConfig(kConfig);
  }

  absl::StatusOr<ApplyReport> Apply(const std::string& config) {
    ApplyOptions options{.paths = {}, .catalog = &catalog_, .new_uuid = [this] { return NextUuid(); }};
    options.paths.sysfs_root = tree_.root();
    options.paths.dev_root = dir_.path() / "dev";
    return ApplyVgpuConfig(options, file_, config);
  }

  std::string NextUuid() { return absl::StrFormat("00000000-0000-4000-8000-%012d", ++uuids_); }

  // A T4 (Turing: the GPU is the mdev parent) with two T4-1Q instances in groups 101 and 102.
  void AddT4WithTwoMdevs() {
    tree_.AddDevice({.bdf = "0000:3b:00.0", .device = 0x1eb8, .driver = "nvidia", .iommu_group = 33});
    AddMdevParent(tree_, "0000:3b:00.0", {{.id = "nvidia-222", .name = "GRID T4-1Q", .available = 14},
                                          {.id = "nvidia-231", .name = "GRID T4-2Q", .available = 0}});
    AddMdev(tree_, kHeldUuid, "0000:3b:00.0", "nvidia-222", 101);
    AddMdev(tree_, kFreeUuid, "0000:3b:00.0", "nvidia-222", 102);
    std::ofstream(dir_.path() / "dev/vfio/101") << "";
    std::ofstream(dir_.path() / "dev/vfio/102") << "";
  }

  std::filesystem::path TypeDir(const std::string& type_id) const {
    return tree_.DeviceDir("0000:3b:00.0") / "mdev_supported_types" / type_id;
  }

  // An L40S PF with four VFs on nvidia, each listing the catalog, none with a type.
  void AddL40s() {
    tree_.AddDevice({.bdf = "0000:86:00.0", .device = 0x26b9, .driver = "nvidia", .iommu_group = 40});
    SetCreatableTypes(tree_, "0000:86:00.0", kL40sCatalog);
    for (int i = 0; i < 4; ++i) {
      const std::string vf = "0000:86:00." + std::to_string(4 + i);
      tree_.AddDevice({.bdf = vf, .device = 0x26b9, .driver = "nvidia", .iommu_group = 41 + i, .physfn = "0000:86:00.0"});
      SetCreatableTypes(tree_, vf, kL40sCatalog);
      SetVgpuType(tree_, vf, "0\n");
    }
  }

  static constexpr char kHeldUuid[] = "1b7e5c3a-0f4d-4a57-9b0e-3c8f1d2a6b01";
  static constexpr char kFreeUuid[] = "9a0c2e4f-6b8d-4f1a-8c3e-5d7f9b1a3c02";

  TempDir dir_;
  SysfsTree tree_;
  CatalogStore catalog_;
  VgpuConfigFile file_;
  int uuids_ = 0;
};

TEST_F(ApplyTest, ConfigGpusCountNvidiaDisplayAndThreeDPhysicalFunctionsInPciOrder) {
  tree_.AddDevice({.bdf = "0000:5e:00.0", .device = 0x26b9, .class_code = 0x030200, .driver = "nvidia"});
  tree_.AddDevice({.bdf = "0000:5e:00.1", .device = 0x22ba, .class_code = 0x040300});  // the GPU's audio
  tree_.AddDevice({.bdf = "0000:5e:00.4", .device = 0x26b9, .driver = "nvidia", .physfn = "0000:5e:00.0"});
  tree_.AddDevice({.bdf = "0000:3b:00.0", .device = 0x1eb8, .class_code = 0x030000, .driver = "nvidia"});
  tree_.AddDevice({.bdf = "0000:1a:00.0", .vendor = 0x8086, .device = 0x1234, .class_code = 0x030000});
  absl::StatusOr<pci::Inventory> inventory = pci::Scan(tree_.root(), {.detail_vendor = 0x10de});
  ASSERT_TRUE(inventory.ok()) << inventory.status();
  const std::vector<ConfigGpu> gpus = ConfigGpus(*inventory);
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[0].bdf, "0000:3b:00.0");
  EXPECT_EQ(gpus[0].index, 0);
  EXPECT_EQ(gpus[1].bdf, "0000:5e:00.0");
  EXPECT_EQ(gpus[1].index, 1);
  EXPECT_EQ(gpus[1].device_id, 0x26b9);
}

TEST_F(ApplyTest, MdevOnlyTheMissingInstanceIsCreated) {
  AddT4WithTwoMdevs();
  absl::StatusOr<ApplyReport> report = Apply("t4-1q-3");
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->gpus.size(), 1u);
  const GpuApplyResult& gpu = report->gpus[0];
  EXPECT_EQ(gpu.outcome, GpuOutcome::kApplied) << gpu.error;
  EXPECT_THAT(gpu.created, ElementsAre("00000000-0000-4000-8000-000000000001"));
  EXPECT_THAT(gpu.removed, IsEmpty());
  EXPECT_EQ(Read(TypeDir("nvidia-222") / "create"), "00000000-0000-4000-8000-000000000001");
  EXPECT_EQ(Read(tree_.DeviceDir("0000:3b:00.0") / kFreeUuid / "remove"), "");
  EXPECT_EQ(report->State(), "success");
  EXPECT_TRUE(report->changed());
}

TEST_F(ApplyTest, MdevAHeldInstanceIsKeptAndNamedTheFreeOneGoes) {
  AddT4WithTwoMdevs();
  testing::HoldingProcess vm(dir_.path() / "dev/vfio/101");
  absl::StatusOr<ApplyReport> report = Apply("t4-2q-1");
  ASSERT_TRUE(report.ok()) << report.status();
  const GpuApplyResult& gpu = report->gpus.at(0);
  EXPECT_EQ(gpu.outcome, GpuOutcome::kPendingHeld) << gpu.error;
  EXPECT_THAT(gpu.removed, ElementsAre(kFreeUuid));
  EXPECT_EQ(Read(tree_.DeviceDir("0000:3b:00.0") / kFreeUuid / "remove"), "1");
  EXPECT_EQ(Read(tree_.DeviceDir("0000:3b:00.0") / kHeldUuid / "remove"), "");
  ASSERT_EQ(gpu.held.size(), 1u);
  EXPECT_THAT(gpu.held[0], HasSubstr(std::string(kHeldUuid) + " (T4-1Q): pid " + std::to_string(vm.pid())));
  EXPECT_THAT(gpu.held[0], HasSubstr("/dev/vfio/101 open"));
  // The new type needs the room (and, on a T4, the one type at a time) the held instance takes.
  EXPECT_THAT(gpu.created, IsEmpty());
  EXPECT_EQ(Read(TypeDir("nvidia-231") / "create"), "");
  EXPECT_EQ(report->State(), "pending");
}

TEST_F(ApplyTest, SriovTypesAreWrittenToFreeVfsByTheCatalogsId) {
  AddL40s();
  absl::StatusOr<ApplyReport> report = Apply("l40s-4q-2");
  ASSERT_TRUE(report.ok()) << report.status();
  const GpuApplyResult& gpu = report->gpus.at(0);
  EXPECT_EQ(gpu.outcome, GpuOutcome::kApplied) << gpu.error;
  EXPECT_THAT(gpu.created, ElementsAre("0000:86:00.4", "0000:86:00.5"));
  EXPECT_EQ(Read(tree_.DeviceDir("0000:86:00.4") / "nvidia/current_vgpu_type"), "1157");
  EXPECT_EQ(Read(tree_.DeviceDir("0000:86:00.5") / "nvidia/current_vgpu_type"), "1157");
  EXPECT_EQ(Read(tree_.DeviceDir("0000:86:00.6") / "nvidia/current_vgpu_type"), "0\n");

  // The tree now shows both typed: a second pass has nothing to do.
  absl::StatusOr<ApplyReport> again = Apply("l40s-4q-2");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->gpus.at(0).outcome, GpuOutcome::kApplied);
  EXPECT_THAT(again->gpus.at(0).created, IsEmpty());
  EXPECT_FALSE(again->changed());
}

TEST_F(ApplyTest, SriovATypeTheCardsCatalogLacksFailsTheGpuNamingItsCatalog) {
  AddL40s();
  absl::StatusOr<ApplyReport> report = Apply("l40s-48q");
  ASSERT_TRUE(report.ok()) << report.status();
  const GpuApplyResult& gpu = report->gpus.at(0);
  EXPECT_EQ(gpu.outcome, GpuOutcome::kFailed);
  EXPECT_THAT(gpu.error.message(), HasSubstr("GPU 0000:86:00.0: create L40S-48Q: not a type of card 0000:86:00.0 10de:26b9"));
  EXPECT_THAT(gpu.error.message(), HasSubstr("1157 NVIDIA L40S-4Q"));
  EXPECT_EQ(Read(tree_.DeviceDir("0000:86:00.4") / "nvidia/current_vgpu_type"), "0\n");
  EXPECT_EQ(report->State(), "failed");
}

TEST_F(ApplyTest, SriovAVfWhoseTypeCannotBeNamedLeavesItsCardAlone) {
  AddL40s();
  SetVgpuType(tree_, "0000:86:00.6", "1300\n");  // in no catalog seen
  absl::StatusOr<ApplyReport> report = Apply("l40s-4q-2");
  ASSERT_TRUE(report.ok()) << report.status();
  const GpuApplyResult& gpu = report->gpus.at(0);
  EXPECT_EQ(gpu.outcome, GpuOutcome::kFailed);
  EXPECT_THAT(gpu.error.message(), HasSubstr("vGPU type 1300 of 0000:86:00.6"));
  EXPECT_EQ(Read(tree_.DeviceDir("0000:86:00.4") / "nvidia/current_vgpu_type"), "0\n");
}

TEST_F(ApplyTest, AGpuWithoutAVgpuManagerFails) {
  tree_.AddDevice({.bdf = "0000:3b:00.0", .device = 0x2236, .driver = "nvidia", .iommu_group = 33});
  absl::StatusOr<ApplyReport> report = Apply("t4-1q-3");
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->gpus.at(0).outcome, GpuOutcome::kFailed);
  EXPECT_THAT(report->gpus.at(0).error.message(), HasSubstr("GPU 0000:3b:00.0: no vGPU manager on the GPU"));
}

TEST_F(ApplyTest, AnUnknownConfigIsTheNodesError) {
  AddL40s();
  absl::StatusOr<ApplyReport> report = Apply("no-such-config");
  EXPECT_TRUE(absl::IsNotFound(report.status())) << report.status();
}

}  // namespace
}  // namespace vfio_agent::vgpu
