#include "vfio_gpu_agent/fabric/partition_manager.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fabric_fixture.h"
#include "vfio_gpu_agent/fabric/nvfm_api.h"

namespace vfio_agent::fabric {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using vfio_agent::testing::FakeFmState;
using vfio_agent::testing::Module;
using vfio_agent::testing::UpdateFakeFm;
using namespace std::chrono_literals;

struct Recorder : FabricObserver {
  void OnPartitionActivated(const Partition& p, const std::vector<std::string>&) override { activated.push_back(p.id); }
  void OnPartitionDeactivated(const Partition& p, const std::string&) override { deactivated.push_back(p.id); }
  void OnActivationFailed(const std::vector<std::string>&, const std::string& fm_status, const std::string&) override {
    failures.push_back(fm_status);
  }
  void OnFabricWarning(const std::string& reason, const std::string&) override { warnings.push_back(reason); }
  std::vector<uint32_t> activated, deactivated;
  std::vector<std::string> failures, warnings;
};

class PartitionManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("fabric-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    fm_ = vfio_agent::testing::MakeFakeFm(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<PartitionManager> Make(bool fail_open = false, std::string address = "") {
    if (address.empty()) address = "unix:" + fm_.string();
    NvfmOptions nvfm{.address = address, .library = FAKE_NVFM_LIBRARY};
    return std::make_unique<PartitionManager>(
        FabricOptions{.address = address, .fail_open = fail_open, .activation_grace = 30s, .checkpoint = Checkpoint()},
        [nvfm] { return ConnectNvfm(nvfm); }, &recorder_, [this] { return now_; });
  }
  FakeFmState Fm() const { return vfio_agent::testing::SnapshotFakeFm(fm_); }
  std::filesystem::path Checkpoint() const { return dir_ / "state" / "fabric-partitions.txt"; }

  std::filesystem::path dir_, fm_;
  Recorder recorder_;
  std::chrono::steady_clock::time_point now_{std::chrono::hours(1)};
};

std::set<std::string> Modules(std::initializer_list<uint32_t> modules) {
  std::set<std::string> out;
  for (uint32_t module : modules) out.insert(Module(module));
  return out;
}

std::vector<std::string> Sorted(std::initializer_list<uint32_t> modules) {
  const std::set<std::string> set = Modules(modules);
  return {set.begin(), set.end()};
}

TEST_F(PartitionManagerTest, ReadsTheBoardAndVouchesForItsGpusOnly) {
  auto manager = Make();
  EXPECT_THAT(manager->Unusable(Module(1)), HasSubstr("not connected yet"));
  ASSERT_TRUE(manager->Reconcile(std::nullopt).ok());
  EXPECT_EQ(manager->Unusable(Module(1)), "");
  EXPECT_EQ(manager->Unusable("0000:05:00.0"), "in no supported Fabric Manager partition");
  const FabricStatus status = manager->Status();
  EXPECT_TRUE(status.connected);
  ASSERT_EQ(status.table.partitions().size(), 15u);
  EXPECT_EQ(status.table.Find(3)->gpus, Sorted({1, 2}));
  EXPECT_THAT(status.table.Find(3)->module_ids, ElementsAre(1, 2));
}

TEST_F(PartitionManagerTest, UnsupportedPartitionsAreLeftOut) {
  UpdateFakeFm(fm_, [](FakeFmState& state) { state.unsupported = {3}; });
  auto manager = Make();
  ASSERT_TRUE(manager->Reconcile(std::nullopt).ok());
  EXPECT_EQ(manager->Status().table.Find(3), nullptr);
  EXPECT_THAT(manager->PrepareAllocation(Modules({1, 2})).message(), HasSubstr("is no Fabric Manager partition"));
}

TEST_F(PartitionManagerTest, AllocationActivatesExactlyItsPartitionAndRepeatsAreHarmless) {
  auto manager = Make();
  ASSERT_TRUE(manager->Reconcile(std::nullopt).ok());
  ASSERT_TRUE(manager->PrepareAllocation(Modules({5, 6, 7, 8})).ok());
  EXPECT_THAT(Fm().active, ElementsAre(2));
  // The kubelet replays a cached Allocate after restarts: FM's IN_USE for an active partition is success.
  ASSERT_TRUE(manager->PrepareAllocation(Modules({5, 6, 7, 8})).ok());
  EXPECT_THAT(Fm().active, ElementsAre(2));
  EXPECT_EQ(Fm().counts["activate"], 2);
  EXPECT_THAT(recorder_.activated, ElementsAre(2, 2));
}

TEST_F(PartitionManagerTest, ASetThatIsNoPartitionIsRefusedNamingThoseThatWork) {
  auto manager = Make();
  ASSERT_TRUE(manager->Reconcile(std::nullopt).ok());
  absl::Status pair = manager->PrepareAllocation(Modules({2, 3}));
  EXPECT_EQ(pair.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(pair.message(), HasSubstr("partitions of 2 GPUs: P3 ["));
  EXPECT_THAT(pair.message(), HasSubstr("P6 ["));
  EXPECT_THAT(manager->PrepareAllocation(Modules({1, 2, 3})).message(), HasSubstr("none has 3 GPUs (sizes: 1, 2, 4, 8)"));
  EXPECT_THAT(Fm().active, IsEmpty());
  EXPECT_EQ(Fm().counts["activate"], 0);
}

TEST_F(PartitionManagerTest, AnOverlappingPartitionOfAFinishedPodIsDeactivatedFirst) {
  UpdateFakeFm(fm_, [](FakeFmState& state) { state.active = {3}; });  // modules 1,2, left by a finished pod
  auto manager = Make();
  ASSERT_TRUE(manager->Reconcile(std::nullopt).ok());
  ASSERT_TRUE(manager->PrepareAllocation(Modules({1, 2, 3, 4})).ok());
  EXPECT_THAT(Fm().active, ElementsAre(1));
  EXPECT_THAT(recorder_.deactivated, ElementsAre(3));
}

TEST_F(PartitionManagerTest, NothingIsDeactivatedUnderARunningVm) {
  UpdateFakeFm(fm_, [](FakeFmState& state) { state.active = {3}; });
  auto manager = Make();
  ASSERT_TRUE(manager->Reconcile(Modules({2})).ok());  // a VM holds module 2
  absl::Status status = manager->PrepareAllocation(Modules({1}));
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr(absl::StrCat("its GPU ", Module(2), " is held by a pod")));
  EXPECT_THAT(Fm().active, ElementsAre(3));
  EXPECT_EQ(Fm().counts["deactivate"], 0);
}

TEST_F(PartitionManagerTest, ReleasesAPartitionOnceNoPodHoldsItAndNeverWithoutPodResources) {
  auto manager = Make();
  ASSERT_TRUE(manager->Reconcile(std::set<std::string>{}).ok());
  ASSERT_TRUE(manager->PrepareAllocation(Modules({3, 4})).ok());
  // The kubelet records the assignment after our answer: within the grace an unheld partition stays.
  ASSERT_TRUE(manager->Reconcile(std::set<std::string>{}).ok());
  EXPECT_THAT(Fm().active, ElementsAre(4));
  now_ += 31s;
  ASSERT_TRUE(manager->Reconcile(Modules({3})).ok());  // the VM runs
  EXPECT_THAT(Fm().active, ElementsAre(4));
  ASSERT_TRUE(manager->Reconcile(std::nullopt).ok());  // pod-resources did not answer: no release
  EXPECT_THAT(Fm().active, ElementsAre(4));
  ASSERT_TRUE(manager->Reconcile(std::set<std::string>{}).ok());  // the VM ended
  EXPECT_THAT(Fm().active, IsEmpty());
  EXPECT_THAT(recorder_.deactivated, ElementsAre(4));
}

TEST_F(PartitionManagerTest, AtStartActivePartitionsAreAdoptedAndReleasedOnlyWhenFree) {
  UpdateFakeFm(fm_, [](FakeFmState& state) { state.active = {2, 7}; });  // modules 5-8, and module 1 alone
  auto manager = Make();
  ASSERT_TRUE(manager->Reconcile(Modules({6})).ok());
  EXPECT_THAT(Fm().active, ElementsAre(2));
  EXPECT_THAT(recorder_.deactivated, ElementsAre(7));
}

// Issue 7 (a): in resiliency mode (FABRIC_MODE_RESTART=1) a restarted FM refuses every read until it is told; the
// agent tells it from the table it kept and the held containers, and FM vouches for the GPUs again.
TEST_F(PartitionManagerTest, AfterAnFmRestartInResiliencyModeFmIsToldBeforeAnyReadAndTheGpusAreUsableAgain) {
  auto manager = Make();
  ASSERT_TRUE(manager->Reconcile(std::set<std::string>{}).ok());
  ASSERT_TRUE(manager->PrepareAllocation(Modules({7, 8})).ok());
  vfio_agent::testing::RestartFakeFm(fm_);
  EXPECT_THAT(Fm().active, IsEmpty());
  now_ += 31s;
  const Held held(Modules({7, 8}), {Modules({7, 8})});
  ASSERT_TRUE(manager->Reconcile(held).ok()) << manager->Status().error;
  const FakeFmState fm = Fm();
  EXPECT_TRUE(fm.told_any);
  EXPECT_THAT(fm.told, ElementsAre(6));
  EXPECT_THAT(fm.active, ElementsAre(6));
  EXPECT_FALSE(fm.awaiting_since_ms);
  EXPECT_FALSE(fm.dead);
  EXPECT_EQ(fm.counts.at("connect"), 2);
  EXPECT_EQ(manager->Status().reconnects, 1);
  EXPECT_EQ(manager->Unusable(Module(8)), "");
  EXPECT_EQ(manager->Unusable(Module(1)), "");
}

// Until pod-resources has answered, what serves a pod is unknown: FM is not told a guess (an empty list would end
// the VMs' partitions), and is told at the first answer.
TEST_F(PartitionManagerTest, ARestartedFmIsNotToldBeforeWhatPodsHoldIsKnown) {
  auto manager = Make();
  ASSERT_TRUE(manager->Reconcile(std::nullopt).ok());
  vfio_agent::testing::RestartFakeFm(fm_);
  absl::Status refused = manager->Reconcile(std::nullopt);
  EXPECT_THAT(refused.message(), HasSubstr("FM_ST_NOT_CONFIGURED"));
  EXPECT_THAT(manager->Unusable(Module(1)), HasSubstr("FM_ST_NOT_CONFIGURED"));
  EXPECT_FALSE(Fm().told_any);
  ASSERT_TRUE(manager->Reconcile(Held(Modules({1, 2}), {Modules({1, 2})})).ok());
  EXPECT_THAT(Fm().told, ElementsAre(3));
}

// Issue 7 (b): the agent restarts while FM is in its refusal window: the new process has never read FM, and tells
// it from the checkpoint the process before it wrote.
TEST_F(PartitionManagerTest, AnAgentStartedDuringFmsRefusalWindowTellsItFromTheCheckpoint) {
  {
    auto before = Make();
    ASSERT_TRUE(before->Reconcile(std::set<std::string>{}).ok());
    ASSERT_TRUE(before->PrepareAllocation(Modules({1, 2, 3, 4})).ok());
    ASSERT_TRUE(before->PrepareAllocation(Modules({5, 6})).ok());
  }
  ASSERT_TRUE(std::filesystem::exists(Checkpoint()));
  vfio_agent::testing::RestartFakeFm(fm_);
  auto manager = Make();
  EXPECT_FALSE(manager->Reconcile(std::nullopt).ok());  // the agent's first pass, before pod-resources answers
  const Held held(Modules({1, 2, 3, 4, 5, 6}), {Modules({1, 2, 3, 4}), Modules({5, 6})});
  ASSERT_TRUE(manager->Reconcile(held).ok()) << manager->Status().error;
  EXPECT_THAT(Fm().told, ElementsAre(1, 5));
  EXPECT_THAT(Fm().active, ElementsAre(1, 5));
  EXPECT_EQ(manager->Unusable(Module(1)), "");
  EXPECT_EQ(Fm().counts["deactivate"], 0);
}

// Without a checkpoint (first start, or the file lost) a fresh process cannot know the held containers' partitions:
// it says so instead of telling FM a list that would end the VMs' partitions.
TEST_F(PartitionManagerTest, WithoutACheckpointARestartedFmIsNotToldAGuess) {
  vfio_agent::testing::RestartFakeFm(fm_);
  auto manager = Make();
  absl::Status status = manager->Reconcile(Held(Modules({5, 6}), {Modules({5, 6})}));
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("FM_ST_NOT_CONFIGURED"));
  EXPECT_THAT(manager->Unusable(Module(5)), HasSubstr("no partition table was read or checkpointed"));
  EXPECT_FALSE(Fm().told_any);
  // Nothing held: the empty list is the truth, and FM hears it.
  ASSERT_TRUE(manager->Reconcile(std::set<std::string>{}).ok());
  EXPECT_TRUE(Fm().told_any);
  EXPECT_THAT(Fm().told, IsEmpty());
}

// Issue 7 (c): a stale 4-GPU partition active beside a pod's 2-GPU one (the 4's pod is gone, but pod-resources did
// not answer, so it was not released): FM is told only the pod's partition, never an overlapping pair.
TEST_F(PartitionManagerTest, FmIsToldExactlyTheHeldContainersPartitionsNeverAnOverlappingOne) {
  UpdateFakeFm(fm_, [](FakeFmState& state) {
    state.resiliency = false;  // FM answers at once after its restart: only the list told is in question
    state.active = {1};        // modules 1-4, left by a finished pod
  });
  auto manager = Make();
  ASSERT_TRUE(manager->Reconcile(std::nullopt).ok());
  ASSERT_TRUE(manager->Status().table.Find(1)->active);
  vfio_agent::testing::RestartFakeFm(fm_);
  UpdateFakeFm(fm_, [](FakeFmState& state) { state.active = {1}; });  // still in FM's mind after its restart
  const Held held(Modules({1, 2}), {Modules({1, 2})});  // a VM holds modules 1 and 2: partition 3
  ASSERT_TRUE(manager->Reconcile(held).ok()) << manager->Status().error;
  EXPECT_TRUE(Fm().told_any);
  EXPECT_THAT(Fm().told, ElementsAre(3));
}

// Issue 7 (d): FM's isActive is 1 for an active partition; any other value is not taken as active (and so
// nothing deactivates it, and it is never told as active).
TEST_F(PartitionManagerTest, OnlyIsActiveOneMeansActive) {
  UpdateFakeFm(fm_, [](FakeFmState& state) { state.is_active = {{3, 2}, {5, 1}}; });
  auto manager = Make();
  ASSERT_TRUE(manager->Reconcile(std::nullopt).ok());
  EXPECT_FALSE(manager->Status().table.Find(3)->active);
  EXPECT_TRUE(manager->Status().table.Find(5)->active);
  ASSERT_TRUE(manager->Reconcile(std::set<std::string>{}).ok());
  EXPECT_EQ(Fm().counts["deactivate"], 1);  // P5 only
}

// The fake as FM is: a restarted FM that is not told within its timeout (60 s; here none) exits, and from then on
// refuses connections; an agent that never tells sees FM gone.
TEST_F(PartitionManagerTest, AnFmNeverToldExitsAndRefusesConnections) {
  auto manager = Make();
  ASSERT_TRUE(manager->Reconcile(std::nullopt).ok());
  UpdateFakeFm(fm_, [](FakeFmState& state) { state.restart_timeout_ms = 0; });
  vfio_agent::testing::RestartFakeFm(fm_);
  EXPECT_TRUE(Fm().dead);
  absl::Status status = manager->Reconcile(std::set<std::string>{});
  EXPECT_THAT(status.message(), HasSubstr("FM_ST_CONNECTION_NOT_VALID"));
  EXPECT_THAT(manager->Unusable(Module(1)), HasSubstr("not usable"));
  // systemd starts FM again; this time it is told at once.
  UpdateFakeFm(fm_, [](FakeFmState& state) { state.restart_timeout_ms = 60000; });
  vfio_agent::testing::RestartFakeFm(fm_);
  ASSERT_TRUE(manager->Reconcile(std::set<std::string>{}).ok());
  EXPECT_TRUE(Fm().told_any);
  EXPECT_FALSE(Fm().dead);
}

// The owner given to PrepareAllocation is checkpointed before FM is asked, read back by a new process, and dropped
// once the partition is released (or FM reports it inactive).
TEST_F(PartitionManagerTest, AnActivationsOwnerIsCheckpointedUntilThePartitionIsReleased) {
  {
    auto before = Make();
    ASSERT_TRUE(before->Reconcile(std::set<std::string>{}).ok());
    ASSERT_TRUE(before->PrepareAllocation(Modules({3, 4}), "claim-a").ok());
    ASSERT_TRUE(before->PrepareAllocation(Modules({7, 8}), "claim-b").ok());
    EXPECT_EQ(before->Owners(), (std::map<uint32_t, std::string>{{4, "claim-a"}, {6, "claim-b"}}));
  }
  UpdateFakeFm(fm_, [](FakeFmState& state) { state.active.erase(6); });  // gone while no agent ran
  auto manager = Make();
  EXPECT_EQ(manager->Owners(), (std::map<uint32_t, std::string>{{4, "claim-a"}, {6, "claim-b"}}));
  ASSERT_TRUE(manager->Reconcile(std::nullopt).ok());
  EXPECT_EQ(manager->Owners(), (std::map<uint32_t, std::string>{{4, "claim-a"}}));
  ASSERT_TRUE(manager->Reconcile(std::set<std::string>{}).ok());
  EXPECT_THAT(Fm().active, IsEmpty());
  EXPECT_THAT(manager->Owners(), IsEmpty());
  EXPECT_THAT(Make()->Owners(), IsEmpty());
}

TEST_F(PartitionManagerTest, AfterAnFmRestartWithNothingHeldFmIsToldTheEmptyList) {
  auto manager = Make();
  ASSERT_TRUE(manager->Reconcile(std::set<std::string>{}).ok());
  vfio_agent::testing::RestartFakeFm(fm_);
  ASSERT_TRUE(manager->Reconcile(std::set<std::string>{}).ok());
  EXPECT_TRUE(Fm().told_any);
  EXPECT_THAT(Fm().told, IsEmpty());
}

TEST_F(PartitionManagerTest, FmStillInitialisingMakesEveryGpuUnusableUntilItIsReady) {
  UpdateFakeFm(fm_, [](FakeFmState& state) { state.mode = "not-configured"; });
  auto manager = Make();
  EXPECT_FALSE(manager->Reconcile(std::nullopt).ok());
  EXPECT_THAT(manager->Unusable(Module(1)), HasSubstr("FM_ST_NOT_CONFIGURED (Fabric Manager is still initialising)"));
  absl::Status refused = manager->PrepareAllocation(Modules({1}));
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(refused.message(), HasSubstr("error 802"));
  const uint64_t generation = manager->Status().generation;
  UpdateFakeFm(fm_, [](FakeFmState& state) { state.mode = "shared"; });
  ASSERT_TRUE(manager->Reconcile(std::nullopt).ok());
  EXPECT_EQ(manager->Unusable(Module(1)), "");
  EXPECT_GT(manager->Status().generation, generation);
}

TEST_F(PartitionManagerTest, WrongModeAndVersionMismatchAreNamed) {
  UpdateFakeFm(fm_, [](FakeFmState& state) { state.mode = "not-supported"; });
  auto manager = Make();
  EXPECT_FALSE(manager->Reconcile(std::nullopt).ok());
  EXPECT_THAT(manager->Unusable(Module(1)), HasSubstr("FABRIC_MODE=1"));
  UpdateFakeFm(fm_, [](FakeFmState& state) { state.mode = "version-mismatch"; });
  EXPECT_FALSE(manager->Reconcile(std::nullopt).ok());
  EXPECT_THAT(manager->Unusable(Module(1)), HasSubstr("FM_ST_VERSION_MISMATCH"));
}

TEST_F(PartitionManagerTest, AnActivationFailureFailsTheAllocationWithFmsStatus) {
  UpdateFakeFm(fm_, [](FakeFmState& state) { state.fail[4] = nvfm::kNvlinkError; });
  auto manager = Make();
  ASSERT_TRUE(manager->Reconcile(std::nullopt).ok());
  absl::Status status = manager->PrepareAllocation(Modules({3, 4}));
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("fmActivateFabricPartition(4): FM_ST_NVLINK_ERROR"));
  EXPECT_THAT(recorder_.failures, ElementsAre("FM_ST_NVLINK_ERROR"));
  EXPECT_THAT(Fm().active, IsEmpty());
}

TEST_F(PartitionManagerTest, FailOpenAdvertisesAndActivatesEachGpuAlone) {
  UpdateFakeFm(fm_, [](FakeFmState& state) { state.mode = "not-configured"; });
  auto manager = Make(/*fail_open=*/true);
  EXPECT_FALSE(manager->Reconcile(std::nullopt).ok());
  EXPECT_EQ(manager->Unusable(Module(1)), "");
  EXPECT_TRUE(manager->PrepareAllocation(Modules({1})).ok());
  UpdateFakeFm(fm_, [](FakeFmState& state) { state.mode = "shared"; });
  ASSERT_TRUE(manager->Reconcile(std::nullopt).ok());
  ASSERT_TRUE(manager->PrepareAllocation(Modules({2, 3})).ok());
  EXPECT_THAT(Fm().active, ElementsAre(8, 9));  // modules 2 and 3 alone
}

TEST_F(PartitionManagerTest, NoFmAtTheAddressOrNoLibraryIsAClearError) {
  auto manager = Make(false, "unix:" + (dir_ / "absent").string());
  absl::Status status = manager->Reconcile(std::nullopt);
  EXPECT_THAT(status.message(), HasSubstr("FM_ST_CONNECTION_NOT_VALID"));
  EXPECT_THAT(manager->Unusable(Module(1)), HasSubstr("not usable"));
  absl::StatusOr<std::unique_ptr<FmClient>> missing =
      ConnectNvfm({.address = "unix:" + fm_.string(), .library = dir_ / "libnvfm.so.1"});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(missing.status().message(), HasSubstr((dir_ / "libnvfm.so.1").string()));
}

TEST_F(PartitionManagerTest, PreferredNamesASizeNoPartitionHas) {
  auto manager = Make();
  ASSERT_TRUE(manager->Reconcile(std::nullopt).ok());
  const std::set<std::string> all = Modules({1, 2, 3, 4, 5, 6, 7, 8});
  EXPECT_EQ(*manager->Preferred(all, {}, 4, {}), Sorted({1, 2, 3, 4}));
  EXPECT_FALSE(manager->Preferred(all, {}, 3, {}));
  EXPECT_THAT(recorder_.warnings, ElementsAre("NoFreePartition"));
}

TEST(FmAddressTest, UnixAndTcpForms) {
  EXPECT_TRUE(ParseFmAddress("unix:/run/nvidia-fabricmanager/socket")->unix_socket);
  EXPECT_EQ(ParseFmAddress("/run/fm.sock")->info, "/run/fm.sock");
  EXPECT_EQ(ParseFmAddress("127.0.0.1")->info, "127.0.0.1:6666");
  EXPECT_FALSE(ParseFmAddress("127.0.0.1:6666")->unix_socket);
  EXPECT_FALSE(ParseFmAddress("").ok());
  EXPECT_FALSE(ParseFmAddress("unix:").ok());
}

}  // namespace
}  // namespace vfio_agent::fabric
