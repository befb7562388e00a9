// HGX shared-NVSwitch mode of the DRA driver (--fabric-manager): the simulated 8x H200 board behind the fake
// libnvfm of tests/fabric (module ids out of PCI order, its 15 partitions), claims read from the fake API server,
// Prepare/Unprepare called by kubelet-dra-sim. What Fabric Manager holds is read from the fake's state file.
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "claim_fixture.h"
#include "driver_start.h"
#include "fabric_fixture.h"
#include "kube/api_sim_fixture.h"
#include "kube_api_sim.h"
#include "kubelet_dra_sim.h"
#include "nlohmann/json.hpp"
#include "support/sysfs_tree.h"
#include "support/wait.h"
#include "vfio_gpu_agent/dra/device_names.h"
#include "vfio_gpu_agent/dra/driver.h"
#include "vfio_gpu_agent/kube/resource_claims.h"
#include "vfio_gpu_agent/kube/resource_slices.h"

namespace vfio_agent::dra {
namespace {

using Json = nlohmann::json;
using kubeletsim::dra::KubeletDraSim;
using kubeletsim::dra::MakeClaim;
using vfio_agent::testing::FakeFmState;
using vfio_agent::testing::Module;
using namespace std::chrono_literals;

constexpr char kDriver[] = "gpu.vfio-agent.cozystack.io";
constexpr char kNode[] = "node-a";  // the node kube-api-sim serves

// What the driver tells its host (`run` makes events and metrics of it), one line a call.
class RecordingObserver final : public FabricObserver {
 public:
  void OnClaimPartitionActivated(const fabric::Partition& partition, const std::vector<std::string>& for_gpus,
                                 const std::string& claim) override {
    Add(absl::StrCat("activated P", partition.id, " [", absl::StrJoin(for_gpus, ","), "] for ", claim));
  }
  void OnPartitionActivated(const fabric::Partition& partition, const std::vector<std::string>&) override {
    Add(absl::StrCat("activated P", partition.id, " for no claim"));
  }
  void OnPartitionDeactivated(const fabric::Partition& partition, const std::string& why) override {
    Add(absl::StrCat("deactivated P", partition.id, ": ", why));
  }
  void OnActivationFailed(const std::vector<std::string>& gpus, const std::string& fm_status,
                          const std::string&) override {
    Add(absl::StrCat("failed [", absl::StrJoin(gpus, ","), "]: ", fm_status));
  }
  void OnFabricWarning(const std::string& reason, const std::string&) override { Add("warning " + reason); }
  void OnFabricStateChanged() override {
    std::lock_guard lock(mu_);
    ++state_changes_;
  }

  std::vector<std::string> Notes() const {
    std::lock_guard lock(mu_);
    return notes_;
  }
  int StateChanges() const {
    std::lock_guard lock(mu_);
    return state_changes_;
  }

 private:
  void Add(std::string note) {
    std::lock_guard lock(mu_);
    notes_.push_back(std::move(note));
  }
  mutable std::mutex mu_;
  std::vector<std::string> notes_;
  int state_changes_ = 0;
};

class DraFabricTest : public claimtest::ClaimApiTest {
 protected:
  void SetUp() override {
    ClaimApiTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    auto publisher = kube::ConnectResourceSlicePublisher(kubeconfig_, "", {.driver = kDriver, .node_name = kNode});
    ASSERT_TRUE(publisher.ok()) << publisher.status();
    publisher_ = *std::move(publisher);

    // The board's eight H200s on vfio-pci, each alone in its IOMMU group.
    testing::SysfsTree tree(dir_.path() / "sys");
    std::filesystem::create_directories(dir_.path() / "dev/vfio");
    for (size_t i = 0; i < testing::HgxGpus().size(); ++i) {
      const int group = 40 + static_cast<int>(i);
      tree.AddDevice({.bdf = testing::HgxGpus()[i], .driver = "vfio-pci", .iommu_group = group});
      std::ofstream(dir_.path() / "dev/vfio" / std::to_string(group));
    }
    std::filesystem::create_directories(dir_.path() / "proc/sys/kernel/random");
    std::ofstream(dir_.path() / "proc/sys/kernel/random/boot_id") << "boot-1\n";
    fm_ = testing::MakeFakeFm(dir_.path() / "fm");
  }

  // The driver goes before publisher_ and reader_, which it calls.
  void TearDown() override { driver_.reset(); }

  DriverOptions Options() {
    DriverOptions options = claimtest::NodeDirectories(dir_.path());
    options.node_name = kNode;
    options.get_claim = GetClaim();
    options.publish_slices = [this](std::vector<kube::SliceDevice> devices) {
      return publisher_->Publish(std::move(devices));
    };
    options.fabric.address = "unix:" + fm_.string();
    options.fabric.checkpoint = FabricCheckpoint();
    options.fabric_library = FAKE_NVFM_LIBRARY;
    options.fabric_interval = 50ms;
    options.fabric_observer = &observer_;
    return options;
  }

  void StartDriver() {
    ASSERT_NO_FATAL_FAILURE(testing::StartRegistered(Options(), &driver_, &kubelet_));
  }

  void StopDriver() {
    driver_.reset();
    ASSERT_TRUE(claimtest::Deregistered(*kubelet_));
  }

  // KubeVirt's shape: one request of one device per GPU ("gpu-0", "gpu-1", ...), as the scheduler allocated it.
  void AddClaim(const std::string& name, const std::string& uid, const std::vector<std::string>& gpus) {
    Json results = Json::array();
    for (size_t i = 0; i < gpus.size(); ++i) {
      results.push_back({{"request", absl::StrCat("gpu-", i)}, {"driver", kDriver}, {"pool", kNode},
                         {"device", DeviceName(gpus[i])}});
    }
    ASSERT_TRUE(api_->Control("claim " + claimtest::AllocatedClaim("vms", name, uid, results).dump()).ok());
  }

  // The claim's error ("" when prepared).
  std::string Prepare(const std::string& name, const std::string& uid) {
    auto response = kubelet_->Prepare(kDriver, {MakeClaim("vms", name, uid)});
    if (!response.ok()) return response.status().ToString();
    return response->claims().at(uid).error();
  }
  std::string Unprepare(const std::string& name, const std::string& uid) {
    auto response = kubelet_->Unprepare(kDriver, {MakeClaim("vms", name, uid)});
    if (!response.ok()) return response.status().ToString();
    return response->claims().at(uid).error();
  }

  FakeFmState Fm() const { return testing::SnapshotFakeFm(fm_); }
  std::filesystem::path FabricCheckpoint() const { return dir_.path() / "state" / "fabric-partitions.txt"; }
  bool FmActive(const std::set<uint32_t>& active) const {
    return testing::WaitUntil([&] { return Fm().active == active; });
  }

  std::filesystem::path CdiSpec(const std::string& uid) const {
    return dir_.path() / "cdi" / absl::StrCat(kDriver, "_claim_", uid, ".json");
  }
  std::filesystem::path Checkpoint(const std::string& uid) const {
    return dir_.path() / "plugins" / kDriver / "claims" / (uid + ".json");
  }

  // device name -> {partition<N> attribute -> value}, from the node's ResourceSlices on the API server.
  std::map<std::string, std::map<std::string, int>> SlicePartitions() const {
    std::map<std::string, std::map<std::string, int>> devices;
    auto slices = api_->Slices();
    if (!slices.ok() || !slices->is_array()) return devices;
    const std::string prefix = absl::StrCat(kDriver, "/partition");
    for (const Json& slice : *slices) {
      for (const Json& device : slice["spec"].value("devices", Json::array())) {
        auto& partitions = devices[device.value("name", "")];
        const Json attributes = device.value("attributes", Json::object());
        for (const auto& [key, value] : attributes.items()) {
          if (key.starts_with(prefix)) partitions[key.substr(key.rfind('/') + 1)] = value.value("int", -1);
        }
      }
    }
    return devices;
  }

  // device name -> "HEALTHY" or "UNHEALTHY: <reason>" as the kubelet last heard it, and "tainted" when the node's
  // slice carries the device's NoSchedule taint.
  std::map<std::string, std::string> Health() const {
    std::map<std::string, std::string> health;
    if (auto latest = kubelet_->LatestHealth(kDriver)) {
      for (const auto& device : latest->devices()) {
        health[device.device().device_name()] = ::v1alpha1::HealthStatus_Name(device.health()) +
                                                (device.message().empty() ? "" : ": " + device.message());
      }
    }
    auto slices = api_->Slices();
    if (!slices.ok() || !slices->is_array()) return health;
    for (const Json& slice : *slices) {
      for (const Json& device : slice["spec"].value("devices", Json::array())) {
        for (const Json& taint : device.value("taints", Json::array())) {
          if (taint.value("key", "").starts_with(absl::StrCat(kDriver, "/")) &&
              taint.value("effect", "") == "NoSchedule") {
            health[device.value("name", "")] += " tainted";
          }
        }
      }
    }
    return health;
  }
  // Every GPU's entry of Health() as `of(module)` says: "HEALTHY" (and untainted), or the start of an unhealthy one
  // ("UNHEALTHY: <reason>"), which must be tainted too.
  bool HealthIs(const std::function<std::string(uint32_t module)>& of) const {
    return testing::WaitUntil([&] {
      const std::map<std::string, std::string> health = Health();
      if (health.size() != 8) return false;
      for (uint32_t module = 1; module <= 8; ++module) {
        auto it = health.find(DeviceName(Module(module)));
        const std::string want = of(module);
        if (it == health.end()) return false;
        const bool ok = want == "HEALTHY" ? it->second == want
                                          : it->second.starts_with(want) && it->second.ends_with(" tainted");
        if (!ok) return false;
      }
      return true;
    });
  }

  std::filesystem::path fm_;
  RecordingObserver observer_;
  std::unique_ptr<kube::ResourceSlicePublisher> publisher_;
  std::unique_ptr<Driver> driver_;
  std::unique_ptr<KubeletDraSim> kubelet_;
};

using Partitions = std::map<std::string, int>;

TEST_F(DraFabricTest, EachGpuCarriesOnePartitionAttributePerSizeRepublishedWhenFabricManagerChanges) {
  StartDriver();
  // FM's table: P0 all eight; P1, P2 modules 1-4, 5-8; P3..P6 pairs (1,2) (3,4) (5,6) (7,8); P7..P14 one each.
  const Partitions module1 = {{"partition1", 7}, {"partition2", 3}, {"partition4", 1}, {"partition8", 0}};
  const Partitions module6 = {{"partition1", 12}, {"partition2", 5}, {"partition4", 2}, {"partition8", 0}};
  ASSERT_TRUE(testing::WaitUntil([&] {
    auto devices = SlicePartitions();
    return devices.size() == 8 && devices[DeviceName(Module(1))] == module1;
  })) << SlicePartitions().size();
  auto devices = SlicePartitions();
  EXPECT_EQ(devices[DeviceName(Module(6))], module6);
  for (uint32_t module = 1; module <= 8; ++module) {
    const Partitions& partitions = devices[DeviceName(Module(module))];
    EXPECT_EQ(partitions.size(), 4u) << module;
    // Module ids are not PCI order: the attributes follow FM's own PCI addresses.
    EXPECT_EQ(partitions.at("partition1"), static_cast<int>(6 + module)) << module;
    EXPECT_EQ(partitions.at("partition2"), static_cast<int>(3 + (module - 1) / 2)) << module;
  }

  // FM restarts with a degraded board: modules 1-4 and the pair (1,2) are no longer supported. The driver
  // reconnects and the slice follows.
  testing::UpdateFakeFm(fm_, [](FakeFmState& state) {
    state.unsupported = {1, 3};
    ++state.epoch;
  });
  ASSERT_TRUE(testing::WaitUntil([&] {
    return SlicePartitions()[DeviceName(Module(1))] == Partitions{{"partition1", 7}, {"partition8", 0}};
  })) << SlicePartitions()[DeviceName(Module(1))].size();
  EXPECT_EQ(SlicePartitions()[DeviceName(Module(6))], module6);
  EXPECT_EQ(SlicePartitions()[DeviceName(Module(3))],
            (Partitions{{"partition1", 9}, {"partition2", 4}, {"partition8", 0}}));
}

TEST_F(DraFabricTest, TwoAndEightGpuClaimsActivateTheirPartitionAndUnprepareReleasesIt) {
  StartDriver();
  AddClaim("pair", "uid-pair", {Module(4), Module(3)});
  ASSERT_EQ(Prepare("pair", "uid-pair"), "");
  EXPECT_EQ(Fm().active, std::set<uint32_t>{4});  // active before Prepare answered
  EXPECT_EQ(Json::parse(std::ifstream(Checkpoint("uid-pair")))["fabricPartitions"], Json::array({4}));

  ASSERT_EQ(Unprepare("pair", "uid-pair"), "");
  EXPECT_FALSE(std::filesystem::exists(CdiSpec("uid-pair")));
  ASSERT_TRUE(FmActive({}));

  std::vector<std::string> all;
  for (uint32_t module = 1; module <= 8; ++module) all.push_back(Module(module));
  AddClaim("eight", "uid-eight", all);
  ASSERT_EQ(Prepare("eight", "uid-eight"), "");
  EXPECT_EQ(Fm().active, std::set<uint32_t>{0});
  // A repeat answers from the checkpoint and asks FM nothing.
  const int activations = Fm().counts["activate"];
  ASSERT_EQ(Prepare("eight", "uid-eight"), "");
  EXPECT_EQ(Fm().counts["activate"], activations);
  ASSERT_EQ(Unprepare("eight", "uid-eight"), "");
  ASSERT_TRUE(FmActive({}));
  EXPECT_FALSE(std::filesystem::exists(Checkpoint("uid-eight")));
}

// --binding-conditions in shared-NVSwitch mode: the claim's partition is active before its pod is bound (the claim
// says so in status.devices), Prepare asks FM nothing more, and a claim deallocated before Prepare releases it.
TEST_F(DraFabricTest, WithBindingConditionsAClaimsPartitionIsActiveBeforePrepare) {
  auto claims = kube::ConnectResourceClaimClient(kubeconfig_, "", {.node_name = kNode, .driver = kDriver});
  ASSERT_TRUE(claims.ok()) << claims.status();
  DriverOptions options = Options();
  options.binding_conditions = true;
  options.watch_claims = [&](kube::ResourceClaimWatch::Handlers handlers) { return (*claims)->Watch(std::move(handlers)); };
  options.write_claim_status = [&](const kube::ResourceClaim& claim, const std::vector<kube::DeviceStatus>& devices) {
    return (*claims)->ApplyDeviceStatus(claim, devices);
  };
  ASSERT_NO_FATAL_FAILURE(testing::StartRegistered(options, &driver_, &kubelet_));
  ASSERT_TRUE(testing::WaitUntil([&] { auto slices = api_->Slices(); return slices.ok() && !slices->empty(); }));
  EXPECT_EQ((*api_->Slices())[0]["spec"]["devices"][0]["bindingConditions"],
            Json::array({absl::StrCat(kDriver, "/vfio-bound")}));
  auto allocate = [&](const std::string& name, const std::string& uid, const std::vector<std::string>& gpus) {
    Json results = Json::array();
    for (size_t i = 0; i < gpus.size(); ++i) {
      results.push_back({{"request", absl::StrCat("gpu-", i)}, {"driver", kDriver}, {"pool", kNode},
                         {"device", DeviceName(gpus[i])}});
    }
    const Json claim = {{"metadata", {{"namespace", "vms"}, {"name", name}, {"uid", uid}}},
                        {"spec", {{"devices", {{"requests", Json::array()}}}}}};
    ASSERT_TRUE(api_->Control("claim " + claim.dump()).ok());
    ASSERT_TRUE(api_->Control(absl::StrCat("allocate vms ", name, " ", kNode, " [] ", results.dump())).ok());
  };
  auto ready = [&](const std::string& name) {
    auto reply = api_->Control("get-claim vms " + name);
    if (!reply.ok()) return false;
    const Json claim = Json::parse(*reply);
    const Json devices = claim["status"].value("devices", Json::array());
    return !devices.empty() && devices[0]["conditions"][0]["type"] == absl::StrCat(kDriver, "/vfio-bound") &&
           devices[0]["conditions"][0]["status"] == "True";
  };
  allocate("pair", "uid-pair", {Module(4), Module(3)});
  ASSERT_TRUE(testing::WaitUntil([&] { return ready("pair"); }));
  EXPECT_EQ(Fm().active, std::set<uint32_t>{4});  // before any Prepare
  const int activations = Fm().counts["activate"];
  ASSERT_EQ(Prepare("pair", "uid-pair"), "");
  EXPECT_EQ(Fm().counts["activate"], activations);
  EXPECT_EQ(Json::parse(std::ifstream(Checkpoint("uid-pair")))["fabricPartitions"], Json::array({4}));
  ASSERT_EQ(Unprepare("pair", "uid-pair"), "");
  ASSERT_TRUE(FmActive({}));

  allocate("other", "uid-other", {Module(5), Module(6)});
  ASSERT_TRUE(testing::WaitUntil([&] { return ready("other"); }));
  ASSERT_TRUE(FmActive({5}));
  ASSERT_TRUE(api_->Control("deallocate vms other").ok());
  ASSERT_TRUE(FmActive({}));
  EXPECT_TRUE(testing::WaitUntil([&] { return !std::filesystem::exists(Checkpoint("uid-other")); }));

  // Three GPUs are no partition: the failure condition says so before the pod is bound, nothing is activated.
  allocate("three", "uid-three", {Module(1), Module(2), Module(3)});
  std::string message;
  ASSERT_TRUE(testing::WaitUntil([&] {
    auto reply = api_->Control("get-claim vms three");
    if (!reply.ok()) return false;
    const Json devices = Json::parse(*reply)["status"].value("devices", Json::array());
    if (devices.empty() || devices[0]["conditions"][0]["type"] != absl::StrCat(kDriver, "/bind-failed")) return false;
    message = devices[0]["conditions"][0].value("message", "");
    return true;
  }));
  EXPECT_NE(message.find("are no Fabric Manager partition"), std::string::npos) << message;
  EXPECT_EQ(Fm().active, std::set<uint32_t>{});
  EXPECT_FALSE(std::filesystem::exists(Checkpoint("uid-three")));
  driver_.reset();
}

TEST_F(DraFabricTest, GpusThatAreNoPartitionAreRefusedNamingThemAndTheSizes) {
  StartDriver();
  AddClaim("split", "uid-split", {Module(1), Module(3)});  // two GPUs of different pairs
  AddClaim("three", "uid-three", {Module(1), Module(2), Module(3)});
  const std::string split = Prepare("split", "uid-split");
  EXPECT_NE(split.find("claim vms/split (uid-split): the GPUs ["), std::string::npos) << split;
  EXPECT_NE(split.find(Module(1)), std::string::npos) << split;
  EXPECT_NE(split.find(Module(3)), std::string::npos) << split;
  EXPECT_NE(split.find("are no Fabric Manager partition (partition sizes: 1, 2, 4, 8)"), std::string::npos) << split;
  EXPECT_NE(split.find("matchAttribute: gpu.vfio-agent.cozystack.io/partition2"), std::string::npos) << split;
  EXPECT_NE(Prepare("three", "uid-three").find("are no Fabric Manager partition"), std::string::npos);
  for (const std::string uid : {"uid-split", "uid-three"}) {
    EXPECT_FALSE(std::filesystem::exists(CdiSpec(uid))) << uid;
    EXPECT_FALSE(std::filesystem::exists(Checkpoint(uid))) << uid;
  }
  EXPECT_EQ(Fm().counts["activate"], 0);
  EXPECT_TRUE(Fm().active.empty());
}

// A partition active for no claim of this driver (a VM the device plugin started before the node moved to DRA)
// is never deactivated under it, and a claim that would need its GPUs is refused with the reason.
TEST_F(DraFabricTest, APartitionActiveForNoClaimIsKeptAndAClaimOverlappingItRefused) {
  testing::UpdateFakeFm(fm_, [](FakeFmState& state) { state.active = {1}; });  // modules 1-4
  StartDriver();
  AddClaim("pair", "uid-pair", {Module(1), Module(2)});
  const std::string error = Prepare("pair", "uid-pair");
  EXPECT_NE(error.find("Fabric Manager partition P1 ["), std::string::npos) << error;
  EXPECT_NE(error.find("is active and its GPU"), std::string::npos) << error;
  EXPECT_FALSE(std::filesystem::exists(Checkpoint("uid-pair")));
  // A claim beside it is served, and its release leaves P1 alone.
  AddClaim("other", "uid-other", {Module(5), Module(6)});
  ASSERT_EQ(Prepare("other", "uid-other"), "");
  ASSERT_TRUE(FmActive({1, 5}));
  ASSERT_EQ(Unprepare("other", "uid-other"), "");
  ASSERT_TRUE(FmActive({1}));
  EXPECT_EQ(Fm().counts["deactivate"], 1);
}

TEST_F(DraFabricTest, AnAgentRestartWithAPreparedClaimKeepsItsPartitionActive) {
  StartDriver();
  AddClaim("pair", "uid-pair", {Module(7), Module(8)});
  ASSERT_EQ(Prepare("pair", "uid-pair"), "");
  ASSERT_EQ(Fm().active, std::set<uint32_t>{6});

  StopDriver();
  const int connects = Fm().counts["connect"];
  StartDriver();
  // The new driver has connected, read FM and swept its claims (the claim is still in the API).
  const std::string claim_path = "/apis/resource.k8s.io/v1/namespaces/vms/resourceclaims/pair";
  ASSERT_TRUE(testing::WaitUntil([&] { return api_->Count("GET", claim_path, "200") == 2; }));
  ASSERT_GT(Fm().counts["connect"], connects);
  // Passes of the fabric loop come and go (each reads FM); the claim's partition stays.
  const int reads = Fm().counts["get_supported"];
  ASSERT_TRUE(testing::WaitUntil([&] { return Fm().counts["get_supported"] >= reads + 3; }));
  EXPECT_EQ(Fm().active, std::set<uint32_t>{6});
  EXPECT_EQ(Fm().counts["deactivate"], 0);

  ASSERT_EQ(Unprepare("pair", "uid-pair"), "");
  ASSERT_TRUE(FmActive({}));
}

TEST_F(DraFabricTest, AClaimDeletedWhileTheAgentWasDownHasItsPartitionReleased) {
  StartDriver();
  AddClaim("kept", "uid-kept", {Module(1), Module(2)});
  AddClaim("gone", "uid-gone", {Module(5), Module(6), Module(7), Module(8)});
  ASSERT_EQ(Prepare("kept", "uid-kept"), "");
  ASSERT_EQ(Prepare("gone", "uid-gone"), "");
  ASSERT_EQ(Fm().active, (std::set<uint32_t>{2, 3}));

  StopDriver();
  ASSERT_TRUE(api_->Control("delete-claim vms gone").ok());
  StartDriver();
  ASSERT_TRUE(FmActive({3}));
  EXPECT_TRUE(testing::WaitUntil([&] { return !std::filesystem::exists(Checkpoint("uid-gone")); }));
  EXPECT_FALSE(std::filesystem::exists(CdiSpec("uid-gone")));
  EXPECT_TRUE(std::filesystem::exists(Checkpoint("uid-kept")));
}

// `run` turns what the driver tells it into the device plugin's events and metrics: each activation with the claim
// it is for, each release with the claim that let it go (from the checkpoint after a restart), and FM's refusals.
TEST_F(DraFabricTest, TheHostHearsEachActivationAndReleaseWithItsClaim) {
  StartDriver();
  AddClaim("pair", "uid-pair", {Module(4), Module(3)});
  ASSERT_EQ(Prepare("pair", "uid-pair"), "");
  const std::string pair = absl::StrCat(Module(3), ",", Module(4));  // PCI order
  // Told before Prepare answers.
  EXPECT_EQ(observer_.Notes(), std::vector<std::string>{"activated P4 [" + pair + "] for claim vms/pair (uid-pair)"});
  ASSERT_EQ(Unprepare("pair", "uid-pair"), "");
  EXPECT_EQ(observer_.Notes().back(), "deactivated P4: claim vms/pair (uid-pair) released its GPUs");

  testing::UpdateFakeFm(fm_, [](FakeFmState& state) { state.fail[5] = -10; });  // FM_ST_NVLINK_ERROR
  AddClaim("broken", "uid-broken", {Module(5), Module(6)});
  EXPECT_NE(Prepare("broken", "uid-broken"), "");
  EXPECT_EQ(observer_.Notes().back(), absl::StrCat("failed [", Module(5), ",", Module(6), "]: FM_ST_NVLINK_ERROR"));

  AddClaim("gone", "uid-gone", {Module(1), Module(2)});
  ASSERT_EQ(Prepare("gone", "uid-gone"), "");
  StopDriver();
  ASSERT_TRUE(api_->Control("delete-claim vms gone").ok());
  StartDriver();
  ASSERT_TRUE(FmActive({}));
  EXPECT_TRUE(testing::WaitUntil([&] {
    return observer_.Notes().back() == "deactivated P3: claim vms/gone (uid-gone) released its GPUs";
  })) << observer_.Notes().back();
}

// The device plugin's rule: a GPU Fabric Manager cannot vouch for (FM not usable, or the GPU in no supported
// partition) is Unhealthy, on the health stream and as the slice's NoSchedule taint, and healthy again with FM.
TEST_F(DraFabricTest, AGpuFabricManagerCannotVouchForIsPublishedUnhealthyAndTainted) {
  testing::UpdateFakeFm(fm_, [](FakeFmState& state) { state.mode = "not-configured"; });
  StartDriver();
  EXPECT_TRUE(HealthIs([](uint32_t) { return "UNHEALTHY: Fabric Manager at unix:"; })) << Health().begin()->second;
  const int changes = observer_.StateChanges();
  testing::UpdateFakeFm(fm_, [](FakeFmState& state) { state.mode = "shared"; });
  EXPECT_TRUE(HealthIs([](uint32_t) { return "HEALTHY"; })) << Health().begin()->second;
  EXPECT_GT(observer_.StateChanges(), changes);  // `run` looks at its readiness again

  // Every partition holding module 1 (P0, P1, the pair P3, its own P7) unsupported: module 1 alone is unusable.
  testing::UpdateFakeFm(fm_, [](FakeFmState& state) { state.unsupported = {0, 1, 3, 7}; });
  EXPECT_TRUE(HealthIs([](uint32_t module) {
    return module == 1 ? "UNHEALTHY: in no supported Fabric Manager partition" : "HEALTHY";
  })) << Health()[DeviceName(Module(1))];
  testing::UpdateFakeFm(fm_, [](FakeFmState& state) { state.unsupported.clear(); });
  EXPECT_TRUE(HealthIs([](uint32_t) { return "HEALTHY"; }));
}

// Issue 7, DRA + FM: FM restarts in resiliency mode while the driver runs and a claim is prepared. FM refuses every
// read until told: the driver tells it the claim's partition, and the GPUs are healthy again.
TEST_F(DraFabricTest, AnFmRestartInResiliencyModeIsToldThePreparedClaimsPartitionAndTheGpusRecover) {
  StartDriver();
  AddClaim("pair", "uid-pair", {Module(7), Module(8)});
  ASSERT_EQ(Prepare("pair", "uid-pair"), "");
  ASSERT_TRUE(HealthIs([](uint32_t) { return "HEALTHY"; }));
  testing::RestartFakeFm(fm_);
  ASSERT_TRUE(testing::WaitUntil([&] { return Fm().told_any; })) << "FM never told";
  EXPECT_EQ(Fm().told, std::vector<uint32_t>{6});
  EXPECT_EQ(Fm().active, std::set<uint32_t>{6});
  EXPECT_FALSE(Fm().dead);
  EXPECT_TRUE(HealthIs([](uint32_t) { return "HEALTHY"; })) << Health().begin()->second;
  ASSERT_EQ(Unprepare("pair", "uid-pair"), "");
  ASSERT_TRUE(FmActive({}));
}

// Issue 7, both restart: the driver comes up while FM is in its refusal window; it has never read this FM and tells
// it from the claims' checkpoints (their recorded partitions), even with its own FM checkpoint lost.
TEST_F(DraFabricTest, ADriverStartedDuringFmsRefusalWindowTellsItThePreparedClaimsPartitions) {
  StartDriver();
  AddClaim("pair", "uid-pair", {Module(7), Module(8)});
  AddClaim("four", "uid-four", {Module(1), Module(2), Module(3), Module(4)});
  ASSERT_EQ(Prepare("pair", "uid-pair"), "");
  ASSERT_EQ(Prepare("four", "uid-four"), "");
  StopDriver();
  testing::RestartFakeFm(fm_);
  std::filesystem::remove(FabricCheckpoint());
  StartDriver();
  ASSERT_TRUE(testing::WaitUntil([&] { return Fm().told_any; })) << "FM never told";
  EXPECT_EQ(Fm().told, (std::vector<uint32_t>{1, 6}));
  EXPECT_TRUE(HealthIs([](uint32_t) { return "HEALTHY"; })) << Health().begin()->second;
  EXPECT_EQ(Fm().active, (std::set<uint32_t>{1, 6}));
  EXPECT_EQ(Fm().counts["deactivate"], 0);
}

// Issue 11 (fabric part): Prepare activated the partition and the agent died before the claim's checkpoint was
// written (here: the checkpoint removed while the driver was down). No prepared claim holds the partition, and the
// manager's record says it was activated for that claim: the restarted driver releases it.
TEST_F(DraFabricTest, APartitionActivatedForAClaimThatWasNeverCheckpointedIsReleasedAfterARestart) {
  StartDriver();
  AddClaim("lost", "uid-lost", {Module(5), Module(6)});
  ASSERT_EQ(Prepare("lost", "uid-lost"), "");
  ASSERT_EQ(Fm().active, std::set<uint32_t>{5});
  StopDriver();
  std::filesystem::remove(Checkpoint("uid-lost"));
  std::filesystem::remove(CdiSpec("uid-lost"));
  StartDriver();
  ASSERT_TRUE(FmActive({})) << "the partition of a claim never prepared stays active";
  EXPECT_TRUE(testing::WaitUntil([&] {
    return observer_.Notes().back() == "deactivated P5: claim uid-lost (never prepared) released its GPUs";
  })) << observer_.Notes().back();
}

}  // namespace
}  // namespace vfio_agent::dra
