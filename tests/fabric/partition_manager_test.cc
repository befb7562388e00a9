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
        FabricOptions{.address = address, .fail_open = fail_open, .activation_grace = 30s},
        [nvfm] { return ConnectNvfm(nvfm); }, &recorder_, [this] { return now_; });
  }
  FakeFmState Fm() const { return vfio_agent::testing::SnapshotFakeFm(fm_); }

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

TEST_F(PartitionManagerTest, AfterAnFmRestartItReconnectsAndTellsFmWhatIsActive) {
  auto manager = Make();
  ASSERT_TRUE(manager->Reconcile(std::set<std::string>{}).ok());
  ASSERT_TRUE(manager->PrepareAllocation(Modules({7, 8})).ok());
  vfio_agent::testing::RestartFakeFm(fm_);
  EXPECT_THAT(Fm().active, IsEmpty());
  now_ += 31s;
  ASSERT_TRUE(manager->Reconcile(Modules({8})).ok());
  const FakeFmState fm = Fm();
  EXPECT_TRUE(fm.told_any);
  EXPECT_THAT(fm.told, ElementsAre(6));
  EXPECT_THAT(fm.active, ElementsAre(6));
  EXPECT_EQ(fm.counts.at("connect"), 2);
  EXPECT_EQ(manager->Status().reconnects, 1);
  EXPECT_EQ(manager->Unusable(Module(8)), "");
}

// The agent restarted while FM was initialising, so it never saw the pods' partitions active; then FM restarted and
// forgot them. The containers pod-resources lists still say which partitions serve a VM.
TEST_F(PartitionManagerTest, AfterBothRestartedFmIsToldThePartitionsOfTheHeldContainers) {
  UpdateFakeFm(fm_, [](FakeFmState& state) { state.mode = "not-configured"; state.active = {1, 5}; });
  auto manager = Make();
  const Held held(Modules({1, 2, 3, 4, 5, 6}), {Modules({1, 2, 3, 4}), Modules({5, 6})});
  EXPECT_FALSE(manager->Reconcile(held).ok());
  vfio_agent::testing::RestartFakeFm(fm_);
  UpdateFakeFm(fm_, [](FakeFmState& state) { state.mode = "shared"; });
  ASSERT_TRUE(manager->Reconcile(held).ok());
  EXPECT_THAT(Fm().told, ElementsAre(1, 5));
  EXPECT_THAT(Fm().active, ElementsAre(1, 5));
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
