// The profile applier against the FUSE simulator, which creates, removes and retypes vGPUs as the kernel and
// NVIDIA's vGPU manager do (capacity, one type at a time, EBUSY while a VM holds the group): each test checks the
// host by discovering it again, and the simulator's log of kernel writes shows what a pass wrote.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>

#include "sim_process.h"
#include "support/fuse.h"
#include "support/holding_process.h"
#include "support/sysfs_tree.h"
#include "vgpu/profile_configs.h"
#include "vfio_gpu_agent/vgpu/apply.h"
#include "vfio_gpu_agent/vgpu/discovery.h"

namespace vfio_agent::vgpu {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

class ApplySimTest : public ::testing::Test {
 protected:
  void Start(const char* node_file) {
    if (!testing::FuseAvailable()) GTEST_SKIP() << testing::kNeedsFuse;
    auto sim = sim::SimProcess::Start(sim::NodeFile(node_file), dir_.path() / "root");
    ASSERT_TRUE(sim.ok()) << sim.status();
    sim_ = *std::move(sim);
    file_ = *ParseVgpuConfig(testing::kSimNodeProfileConfigs);
    catalog_ = std::make_unique<CatalogStore>(StateFile());
  }

  std::filesystem::path StateFile() const { return dir_.path() / "state/vgpu-catalog.txt"; }

  ApplyReport Apply(const std::string& config) {
    ApplyOptions options{.paths = {}, .catalog = catalog_.get(), .new_uuid = {}};
    options.paths.sysfs_root = sim_->sysfs_root();
    options.paths.dev_root = sim_->dev_root();
    absl::StatusOr<ApplyReport> report = ApplyVgpuConfig(options, file_, config);
    EXPECT_TRUE(report.ok()) << report.status();
    return report.ok() ? *std::move(report) : ApplyReport{};
  }

  // An agent restart: what it knew is only what it left in the state directory.
  void Restart() {
    catalog_ = std::make_unique<CatalogStore>(StateFile());
    ASSERT_TRUE(catalog_->Load().ok());
  }

  Discovery Discovered() {
    absl::StatusOr<pci::Inventory> inventory = pci::Scan(sim_->sysfs_root(), {.detail_vendor = 0x10de});
    EXPECT_TRUE(inventory.ok()) << inventory.status();
    absl::StatusOr<Discovery> found = Discover(sim_->sysfs_root(), *inventory, *catalog_);
    EXPECT_TRUE(found.ok()) << found.status();
    return *std::move(found);
  }

  // How many mdevs (or SR-IOV vGPUs) of `name` the host has on `gpu` (its own or its VFs').
  int Count(const std::string& gpu, const std::string& name) {
    const Discovery found = Discovered();
    const std::string bus = gpu.substr(0, 7);  // a GPU's VFs sit on its bus here
    int count = 0;
    for (const Mdev& mdev : found.mdevs) count += mdev.parent_bdf.starts_with(bus) && mdev.type_name == name;
    for (const SriovVgpu& vgpu : found.vgpus) count += vgpu.pf_bdf == gpu && vgpu.type_name == name;
    return count;
  }

  const GpuApplyResult& Gpu(const ApplyReport& report, const std::string& bdf) {
    auto it = std::find_if(report.gpus.begin(), report.gpus.end(), [&](const GpuApplyResult& g) { return g.bdf == bdf; });
    if (it == report.gpus.end()) ADD_FAILURE() << "no result for " << bdf;
    return it == report.gpus.end() ? none_ : *it;
  }

  testing::TempDir dir_;
  std::unique_ptr<sim::SimProcess> sim_;
  VgpuConfigFile file_;
  std::unique_ptr<CatalogStore> catalog_;
  GpuApplyResult none_;
};

TEST_F(ApplySimTest, MdevTuringAndAmpereConvergeAndASecondPassWritesNothing) {
  Start("vgpu-mdev-t4-a10.json");
  const ApplyReport report = Apply("both-cards");
  EXPECT_EQ(report.State(), "success");
  EXPECT_EQ(Gpu(report, "0000:3b:00.0").outcome, GpuOutcome::kApplied) << Gpu(report, "0000:3b:00.0").error;
  EXPECT_THAT(Gpu(report, "0000:3b:00.0").created, SizeIs(8));
  EXPECT_EQ(Gpu(report, "0000:86:00.0").outcome, GpuOutcome::kApplied) << Gpu(report, "0000:86:00.0").error;
  EXPECT_THAT(Gpu(report, "0000:86:00.0").created, SizeIs(6));
  EXPECT_THAT(sim_->Log(), Contains("sriov_numvfs 0000:86:00.0 32"));  // the A10's VFs are its mdev parents
  EXPECT_EQ(Count("0000:3b:00.0", "GRID T4-2Q"), 8);
  EXPECT_EQ(Count("0000:86:00.0", "NVIDIA A10-4Q"), 6);

  const size_t writes = sim_->Log().size();
  const ApplyReport again = Apply("both-cards");
  EXPECT_FALSE(again.changed());
  EXPECT_EQ(again.State(), "success");
  EXPECT_EQ(sim_->Log().size(), writes);
}

TEST_F(ApplySimTest, AConfigThatCannotFitWritesNothingAndNamesTheCardTheTypeAndTheCounts) {
  Start("vgpu-mdev-t4-a10.json");
  ASSERT_EQ(Apply("t4-4q-4").State(), "success");
  const size_t writes = sim_->Log().size();
  // 32 T4-1Q on a T4 that holds 16: refused before the four T4-4Q are removed (the kernel would have answered
  // EUSERS after the 16th, with the card left holding 16 of the wrong ones).
  const ApplyReport report = Apply("t4-1q-32");
  const GpuApplyResult& t4 = Gpu(report, "0000:3b:00.0");
  EXPECT_EQ(t4.outcome, GpuOutcome::kDoesNotFit) << t4.error;
  EXPECT_EQ(report.State(), "failed");
  EXPECT_FALSE(report.RetryLater());
  EXPECT_THAT(t4.error.message(), HasSubstr("card 0000:3b:00.0"));
  EXPECT_THAT(t4.error.message(), HasSubstr("T4-1Q (nvidia-230, max_instance 16): wanted 32, possible 16"));
  EXPECT_THAT(t4.created, IsEmpty());
  EXPECT_THAT(t4.removed, IsEmpty());
  EXPECT_EQ(sim_->Log().size(), writes);
  EXPECT_EQ(Count("0000:3b:00.0", "GRID T4-4Q"), 4);
  EXPECT_EQ(Count("0000:3b:00.0", "GRID T4-1Q"), 0);
}

TEST_F(ApplySimTest, OnAnEmptyCardAConfigThatCannotFitCreatesNothing) {
  Start("vgpu-mdev-t4-a10.json");
  const ApplyReport empty = Apply("t4-2q-10");
  EXPECT_EQ(Gpu(empty, "0000:3b:00.0").outcome, GpuOutcome::kDoesNotFit);
  EXPECT_THAT(Gpu(empty, "0000:3b:00.0").error.message(), HasSubstr("wanted 10, possible 8"));
  EXPECT_EQ(Count("0000:3b:00.0", "GRID T4-2Q"), 0);
}

// The check cannot know every driver rule (a T4 runs one type at a time): the kernel refuses a create mid-way,
// and the pass puts the GPU back as it found it, the removed mdevs under their own UUIDs.
TEST_F(ApplySimTest, ACreateRefusedMidwayIsUndoneAndTheRemovedVgpusComeBack) {
  Start("vgpu-mdev-t4-a10.json");
  ASSERT_EQ(Apply("t4-4q-4").State(), "success");
  std::vector<std::string> before;
  for (const Mdev& mdev : Discovered().mdevs) before.push_back(mdev.uuid);
  ASSERT_THAT(before, SizeIs(4));

  const ApplyReport report = Apply("t4-mixed");
  const GpuApplyResult& t4 = Gpu(report, "0000:3b:00.0");
  EXPECT_EQ(t4.outcome, GpuOutcome::kFailed);
  EXPECT_TRUE(t4.undone);
  EXPECT_TRUE(report.RetryLater());
  EXPECT_THAT(t4.error.message(), HasSubstr("Too many users"));  // EUSERS: the T4 runs T4-1Q now
  EXPECT_THAT(t4.error.message(), HasSubstr("undone: the GPU is as it was (2 vGPUs it created removed, 4 it removed made again)"));
  std::vector<std::string> after;
  for (const Mdev& mdev : Discovered().mdevs) {
    after.push_back(mdev.uuid);
    EXPECT_EQ(mdev.type_name, "GRID T4-4Q");
  }
  EXPECT_EQ(after, before);
}

TEST_F(ApplySimTest, SriovACreateRefusedMidwayIsUndone) {
  Start("vgpu-sriov-l40s-h200.json");
  ASSERT_EQ(Apply("h200-whole").State(), "success");
  // Nine VFs are free, but a card holds seven H200X-1-18C: the eighth is not creatable (EINVAL).
  const ApplyReport report = Apply("h200-small-9");
  for (const char* gpu : {"0000:86:00.0", "0000:af:00.0"}) {
    EXPECT_EQ(Gpu(report, gpu).outcome, GpuOutcome::kFailed) << gpu;
    EXPECT_TRUE(Gpu(report, gpu).undone) << gpu << ": " << Gpu(report, gpu).error;
    EXPECT_EQ(Count(gpu, "NVIDIA H200X-141C"), 1) << gpu;
    EXPECT_EQ(Count(gpu, "NVIDIA H200X-1-18C"), 0) << gpu;
  }
}

// A prepared DRA claim holds its vGPU before its VM opens the group (virt-launcher still pulling its image): the
// caller names it, and it is kept like one a VM holds.
TEST_F(ApplySimTest, AVgpuOfAPreparedClaimIsKeptThoughNoVmOpenedIt) {
  Start("vgpu-mdev-t4-a10.json");
  ASSERT_EQ(Apply("t4-1q-2").State(), "success");
  const Discovery before = Discovered();
  ASSERT_THAT(before.mdevs, SizeIs(2));
  const std::string claimed = before.mdevs[0].uuid;
  ApplyOptions options{.paths = {}, .catalog = catalog_.get(), .new_uuid = {},
                       .claimed = {{claimed, "DRA claim vms/vm (uid-1)"}}};
  options.paths.sysfs_root = sim_->sysfs_root();
  options.paths.dev_root = sim_->dev_root();
  absl::StatusOr<ApplyReport> report = ApplyVgpuConfig(options, file_, "t4-2q-2");
  ASSERT_TRUE(report.ok()) << report.status();
  const GpuApplyResult& t4 = Gpu(*report, "0000:3b:00.0");
  EXPECT_EQ(t4.outcome, GpuOutcome::kPendingHeld) << t4.error;
  ASSERT_THAT(t4.held, SizeIs(1));
  EXPECT_THAT(t4.held[0], HasSubstr(claimed + " (T4-1Q): DRA claim vms/vm (uid-1)"));
  for (const std::string& line : sim_->Log()) EXPECT_THAT(line, ::testing::Not(HasSubstr("mdev-remove " + claimed)));
  EXPECT_EQ(Count("0000:3b:00.0", "GRID T4-1Q"), 1);
}

TEST_F(ApplySimTest, AHeldMdevIsNeverRemovedAndTheChangeCompletesOnceItIsFreed) {
  Start("vgpu-mdev-t4-a10.json");
  ASSERT_EQ(Apply("t4-1q-2").State(), "success");
  const Discovery before = Discovered();
  ASSERT_THAT(before.mdevs, SizeIs(2));
  const Mdev& held = before.mdevs[0];
  ASSERT_TRUE(held.iommu_group.has_value());

  auto vm = std::make_unique<testing::HoldingProcess>(sim_->dev_root() / "vfio" / std::to_string(*held.iommu_group));
  const ApplyReport pending = Apply("t4-2q-2");
  const GpuApplyResult& t4 = Gpu(pending, "0000:3b:00.0");
  EXPECT_EQ(t4.outcome, GpuOutcome::kPendingHeld) << t4.error;
  EXPECT_EQ(pending.State(), "pending");
  EXPECT_THAT(t4.removed, ::testing::ElementsAre(before.mdevs[1].uuid));
  ASSERT_THAT(t4.held, SizeIs(1));
  EXPECT_THAT(t4.held[0], HasSubstr(held.uuid + " (T4-1Q): pid " + std::to_string(vm->pid())));
  EXPECT_EQ(Count("0000:3b:00.0", "GRID T4-1Q"), 1);
  EXPECT_EQ(Count("0000:3b:00.0", "GRID T4-2Q"), 0);
  // Never even tried: the kernel would have refused it (EBUSY), and a real one would have blocked the agent.
  for (const std::string& line : sim_->Log()) EXPECT_THAT(line, ::testing::Not(HasSubstr("mdev-remove " + held.uuid)));
  // Asked again while still held: the same answer, nothing written.
  const size_t writes = sim_->Log().size();
  EXPECT_EQ(Apply("t4-2q-2").State(), "pending");
  EXPECT_EQ(sim_->Log().size(), writes);

  vm.reset();  // the VM ends
  const ApplyReport freed = Apply("t4-2q-2");
  EXPECT_EQ(freed.State(), "success");
  EXPECT_THAT(Gpu(freed, "0000:3b:00.0").removed, ::testing::ElementsAre(held.uuid));
  EXPECT_EQ(Count("0000:3b:00.0", "GRID T4-1Q"), 0);
  EXPECT_EQ(Count("0000:3b:00.0", "GRID T4-2Q"), 2);
}

TEST_F(ApplySimTest, SriovARestartMidConfigConvergesAndAFullCardKeepsItsNamesFromTheStateDir) {
  Start("vgpu-sriov-l40s-h200.json");
  // The first agent got as far as three of seven per card, then stopped.
  ASSERT_EQ(Apply("h200-small-3").State(), "success");
  Restart();
  const ApplyReport report = Apply("h200-small");
  EXPECT_EQ(report.State(), "success");
  for (const char* gpu : {"0000:86:00.0", "0000:af:00.0"}) {
    EXPECT_THAT(Gpu(report, gpu).created, SizeIs(4)) << gpu;
    EXPECT_THAT(Gpu(report, gpu).removed, IsEmpty()) << gpu;
    EXPECT_EQ(Count(gpu, "NVIDIA H200X-1-18C"), 7) << gpu;
  }
  EXPECT_THAT(report.gpus, SizeIs(2));  // the L40S is no H200: the config leaves it alone
  for (const std::string& line : sim_->Log()) EXPECT_THAT(line, ::testing::Not(HasSubstr("0000:3b:")));

  // The cards are full now: their catalogs list no type, and a restarted agent names the vGPUs from the state
  // directory, so it plans nothing.
  Restart();
  const size_t writes = sim_->Log().size();
  const ApplyReport again = Apply("h200-small");
  EXPECT_EQ(again.State(), "success");
  EXPECT_FALSE(again.changed());
  EXPECT_EQ(sim_->Log().size(), writes);
}

TEST_F(ApplySimTest, SriovRetypeReturnsTheVfsAndTakesTheNewType) {
  Start("vgpu-sriov-l40s-h200.json");
  ASSERT_EQ(Apply("h200-small").State(), "success");
  const ApplyReport report = Apply("h200-whole");
  EXPECT_EQ(report.State(), "success");
  EXPECT_THAT(Gpu(report, "0000:86:00.0").removed, SizeIs(7));
  EXPECT_THAT(Gpu(report, "0000:86:00.0").created, SizeIs(1));
  EXPECT_THAT(sim_->Log(), Contains("vgpu-type 0000:86:00.4 0"));
  EXPECT_EQ(Count("0000:86:00.0", "NVIDIA H200X-1-18C"), 0);
  EXPECT_EQ(Count("0000:86:00.0", "NVIDIA H200X-141C"), 1);
  EXPECT_EQ(Count("0000:af:00.0", "NVIDIA H200X-141C"), 1);
}

TEST_F(ApplySimTest, SriovAHeldVfIsNotRetyped) {
  Start("vgpu-sriov-l40s-h200.json");
  ASSERT_EQ(Apply("h200-small").State(), "success");
  const Discovery found = Discovered();
  const SriovVgpu& vgpu = found.vgpus.front();
  absl::StatusOr<pci::Inventory> inventory = pci::Scan(sim_->sysfs_root(), {.detail_vendor = 0x10de});
  ASSERT_TRUE(inventory.ok());
  const pci::Function* vf = inventory->Find(vgpu.bdf);
  ASSERT_TRUE(vf != nullptr && vf->iommu_group.has_value());
  testing::HoldingProcess vm(sim_->dev_root() / "vfio" / std::to_string(*vf->iommu_group));
  const ApplyReport report = Apply("h200-whole");
  EXPECT_EQ(report.State(), "pending");
  const GpuApplyResult& card = Gpu(report, vgpu.pf_bdf);
  EXPECT_EQ(card.outcome, GpuOutcome::kPendingHeld);
  EXPECT_THAT(card.removed, SizeIs(6));
  EXPECT_THAT(card.created, IsEmpty());
  ASSERT_THAT(card.held, SizeIs(1));
  EXPECT_THAT(card.held[0], HasSubstr(vgpu.bdf + " (H200X-1-18C): pid " + std::to_string(vm.pid())));
  EXPECT_EQ(Count(vgpu.pf_bdf, "NVIDIA H200X-1-18C"), 1);
}

}  // namespace
}  // namespace vfio_agent::vgpu
