// --binding-conditions end to end: the driver publishes its GPUs with binding conditions to the fake API server,
// whose `allocate` copies them into a claim as the scheduler does and labels it as the claim router does; the
// driver's claim watch sees it, binds the claim's IOMMU groups on the FUSE sysfs simulator before any Prepare, and
// writes the claim's status.devices condition; kubelet-dra-sim's Prepare then finds the work done.
#include <chrono>
#include <fstream>
#include <map>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "driver_start.h"
#include "kube/api_sim_fixture.h"
#include "kubelet_dra_sim.h"
#include "nlohmann/json.hpp"
#include "sim_process.h"
#include "support/fuse.h"
#include "support/holding_process.h"
#include "support/wait.h"
#include "vfio_gpu_agent/common/fs.h"
#include "vfio_gpu_agent/dra/device_names.h"
#include "vfio_gpu_agent/dra/driver.h"
#include "vfio_gpu_agent/kube/resource_claims.h"
#include "vfio_gpu_agent/kube/resource_slices.h"

namespace vfio_agent::dra {
namespace {

using Json = nlohmann::json;
using kubeletsim::dra::KubeletDraSim;
using kubeletsim::dra::MakeClaim;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr char kDriverName[] = "gpu.vfio-agent.cozystack.io";
constexpr char kNode[] = "node-a";
constexpr char kBound[] = "gpu.vfio-agent.cozystack.io/vfio-bound";
constexpr char kFailed[] = "gpu.vfio-agent.cozystack.io/bind-failed";
constexpr char kQuadro[] = "0000:01:00.0";
const std::map<std::string, std::string> kQuadroGroup = {{"0000:01:00.0", "nvidia"},
                                                        {"0000:01:00.1", "snd_hda_intel"},
                                                        {"0000:01:00.2", "xhci_hcd"},
                                                        {"0000:01:00.3", "nvidia-gpu"}};
constexpr char kA10First[] = "0000:3b:00.0";
constexpr char kA10Second[] = "0000:86:00.0";

class BindingConditionsTest : public kube::testing::KubeApiSimTest {
 protected:
  void SetUp() override {
    KubeApiSimTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (!vfio_agent::testing::FuseAvailable()) GTEST_SKIP() << vfio_agent::testing::kNeedsFuse;
    Connect();
  }

  void Connect() {
    auto kubeconfig = api_->WriteKubeconfig(dir_.path() / "kubeconfig");
    ASSERT_TRUE(kubeconfig.ok()) << kubeconfig.status();
    auto reader = kube::ConnectResourceClaimReader({.kubeconfig = *kubeconfig});
    ASSERT_TRUE(reader.ok()) << reader.status();
    reader_ = *std::move(reader);
    auto publisher = kube::ConnectResourceSlicePublisher(*kubeconfig, "", {.driver = kDriverName, .node_name = kNode});
    ASSERT_TRUE(publisher.ok()) << publisher.status();
    publisher_ = *std::move(publisher);
    auto claims = kube::ConnectResourceClaimClient(*kubeconfig, "", {.node_name = kNode, .driver = kDriverName});
    ASSERT_TRUE(claims.ok()) << claims.status();
    claims_ = *std::move(claims);
  }

  void TearDown() override {
    driver_.reset();
    kubelet_.reset();
  }

  void StartHost(const std::filesystem::path& node, const std::vector<std::string>& before = {}) {
    std::filesystem::create_directories(dir_.path() / "root");
    auto sim = sim::SimProcess::Start(node, dir_.path() / "root");
    ASSERT_TRUE(sim.ok()) << sim.status();
    sim_ = *std::move(sim);
    for (const std::string& command : before) ASSERT_TRUE(sim_->Control(command).ok()) << command;
  }

  DriverOptions Options() {
    DriverOptions options{.registry_dir = dir_.path() / "plugins_registry",
                          .plugins_dir = dir_.path() / "plugins",
                          .cdi_dir = dir_.path() / "cdi"};
    options.paths.sysfs_root = sim_->sysfs_root();
    options.paths.dev_root = sim_->dev_root();
    options.paths.proc_root = "/proc";
    options.paths.modules_root = dir_.path() / "modules";
    options.node_name = kNode;
    options.get_claim = [this](const std::string& ns, const std::string& name) { return reader_->Get(ns, name, 20s); };
    options.publish_slices = [this](std::vector<kube::SliceDevice> devices) {
      return publisher_->Publish(std::move(devices));
    };
    options.bind_on_prepare = true;
    options.binding_conditions = true;
    options.watch_claims = [this](kube::ResourceClaimWatch::Handlers handlers) {
      return claims_->Watch(std::move(handlers));
    };
    options.write_claim_status = [this](const kube::ResourceClaim& claim,
                                        const std::vector<kube::DeviceStatus>& devices) {
      return claims_->ApplyDeviceStatus(claim, devices);
    };
    options.on_binding = [this](const BindingOutcome& outcome) {
      std::lock_guard lock(mu_);
      outcomes_.push_back(outcome);
    };
    return options;
  }

  void StartAgent() {
    ASSERT_NO_FATAL_FAILURE(testing::StartRegistered(Options(), &driver_, &kubelet_));
    // The scheduler allocates from the slices: wait until they say what the driver publishes.
    ASSERT_TRUE(vfio_agent::testing::WaitUntil([&] {
      auto slices = api_->Slices();
      return slices.ok() && !slices->empty();
    }));
  }

  // A claim of one request per GPU, allocated on node-a as the scheduler does it (results with the slices' binding
  // conditions), labelled for node-a by the router.
  void Allocate(const std::string& uid, const std::vector<std::string>& gpus) {
    const Json claim = {{"metadata", {{"namespace", "vms"}, {"name", "claim-" + uid}, {"uid", uid}}},
                        {"spec", {{"devices", {{"requests", Json::array()}}}}}};
    ASSERT_TRUE(api_->Control("claim " + claim.dump()).ok());
    Json results = Json::array();
    for (const std::string& bdf : gpus) {
      results.push_back({{"request", absl::StrCat("gpu", results.size())}, {"driver", kDriverName}, {"pool", kNode},
                         {"device", DeviceName(bdf)}});
    }
    const Json reserved = Json::array({{{"resource", "pods"}, {"name", "pod-" + uid}, {"uid", "pod-" + uid}}});
    auto done = api_->Control(absl::StrCat("allocate vms claim-", uid, " ", kNode, " ", reserved.dump(), " ",
                                           results.dump()));
    ASSERT_TRUE(done.ok()) << done.status();
  }

  Json Claim(const std::string& uid) {
    auto reply = api_->Control(absl::StrCat("get-claim vms claim-", uid));
    return reply.ok() ? Json::parse(*reply) : Json();
  }
  // The claim's condition `type` for `bdf`'s device, or null.
  Json Condition(const std::string& uid, const std::string& bdf, const std::string& type) {
    const Json claim = Claim(uid);
    if (!claim.is_object() || !claim.contains("status")) return nullptr;
    for (const Json& entry : claim["status"].value("devices", Json::array())) {
      if (entry.value("device", "") != DeviceName(bdf)) continue;
      for (const Json& condition : entry.value("conditions", Json::array())) {
        if (condition.value("type", "") == type) return condition;
      }
    }
    return nullptr;
  }
  bool ConditionTrue(const std::string& uid, const std::string& bdf, const std::string& type) {
    const Json condition = Condition(uid, bdf, type);
    return condition.is_object() && condition.value("status", "") == "True";
  }

  std::string Prepare(const std::string& uid) {
    auto response = kubelet_->Prepare(kDriverName, {MakeClaim("vms", "claim-" + uid, uid)});
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? response->claims().at(uid).error() : "call failed";
  }
  std::string Unprepare(const std::string& uid) {
    auto response = kubelet_->Unprepare(kDriverName, {MakeClaim("vms", "claim-" + uid, uid)});
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? response->claims().at(uid).error() : "call failed";
  }

  std::string DriverOf(const std::string& bdf) const {
    return fs::ReadLinkBasename(sim_->sysfs_root() / "bus/pci/devices" / bdf / "driver").value_or("");
  }
  void ExpectOn(const std::map<std::string, std::string>& drivers) const {
    for (const auto& [bdf, driver] : drivers) EXPECT_EQ(DriverOf(bdf), driver) << bdf;
  }
  std::filesystem::path Checkpoint(const std::string& uid) const {
    return dir_.path() / "plugins" / kDriverName / "claims" / (uid + ".json");
  }
  std::filesystem::path CdiSpec(const std::string& uid) const {
    return dir_.path() / "cdi" / absl::StrCat(kDriverName, "_claim_", uid, ".json");
  }
  std::vector<BindingOutcome> Outcomes() {
    std::lock_guard lock(mu_);
    return outcomes_;
  }

  std::unique_ptr<sim::SimProcess> sim_;
  std::unique_ptr<kube::ResourceClaimReader> reader_;
  std::unique_ptr<kube::ResourceSlicePublisher> publisher_;
  std::unique_ptr<kube::ResourceClaimClient> claims_;
  std::unique_ptr<KubeletDraSim> kubelet_;
  std::unique_ptr<Driver> driver_;
  std::mutex mu_;
  std::vector<BindingOutcome> outcomes_;
};

TEST_F(BindingConditionsTest, AFreeGpuIsBoundBeforePrepareAndPrepareFindsItDone) {
  StartHost(sim::NodeFile("workstation-gpu-audio-usb.json"));
  StartAgent();
  const Json slice = api_->Slices()->at(0);
  EXPECT_EQ(slice["spec"]["devices"][0]["bindingConditions"], Json::array({kBound}));
  EXPECT_EQ(slice["spec"]["devices"][0]["bindingFailureConditions"], Json::array({kFailed}));
  ExpectOn(kQuadroGroup);

  Allocate("uid-1", {kQuadro});
  ASSERT_TRUE(vfio_agent::testing::WaitUntil([&] { return ConditionTrue("uid-1", kQuadro, kBound); }));
  for (const auto& [bdf, driver] : kQuadroGroup) EXPECT_EQ(DriverOf(bdf), "vfio-pci") << bdf;
  const Json condition = Condition("uid-1", kQuadro, kBound);
  EXPECT_EQ(condition["reason"], "Ready");
  EXPECT_THAT(condition["message"].get<std::string>(), HasSubstr("0000:01:00.0 and the rest of their IOMMU groups"));
  EXPECT_EQ(condition["observedGeneration"], 1);
  const Json record = Json::parse(fs::ReadTrimmed(Checkpoint("uid-1")).value_or("{}"));
  EXPECT_TRUE(record.value("boundBeforePrepare", false)) << record.dump();
  EXPECT_FALSE(record.value("pending", false));
  EXPECT_EQ(record["driversBeforeBind"], Json(kQuadroGroup));
  EXPECT_FALSE(std::filesystem::exists(CdiSpec("uid-1")));
  ASSERT_TRUE(vfio_agent::testing::WaitUntil([&] { return Outcomes().size() == 1; }));
  EXPECT_TRUE(Outcomes()[0].ok);
  EXPECT_GT(Outcomes()[0].waited.count(), 0);

  // Prepare writes the files and moves nothing.
  const size_t writes = sim_->Log().size();
  ASSERT_EQ(Prepare("uid-1"), "");
  EXPECT_EQ(sim_->Log().size(), writes);
  EXPECT_TRUE(std::filesystem::exists(CdiSpec("uid-1")));
  const Json prepared = Json::parse(fs::ReadTrimmed(Checkpoint("uid-1")).value_or("{}"));
  EXPECT_FALSE(prepared.value("boundBeforePrepare", false)) << prepared.dump();
  EXPECT_EQ(prepared["driversBeforeBind"], Json(kQuadroGroup));  // Unprepare still knows where each goes back
  ASSERT_EQ(Unprepare("uid-1"), "");
  ExpectOn(kQuadroGroup);
  EXPECT_FALSE(std::filesystem::exists(Checkpoint("uid-1")));
}

// The scheduler gives the pod elsewhere when the failure condition is True: the GPU stays on its host driver,
// untouched, and the condition names the process holding it.
TEST_F(BindingConditionsTest, AHeldGpuGetsTheFailureConditionNamingTheHolderAndStaysOnItsDriver) {
  StartHost(sim::NodeFile("workstation-gpu-audio-usb.json"), {absl::StrCat("unbind-delay ", kQuadro, " -1")});
  vfio_agent::testing::HoldingProcess cuda_app(sim_->dev_root() / "nvidia0");
  StartAgent();
  Allocate("uid-1", {kQuadro});
  ASSERT_TRUE(vfio_agent::testing::WaitUntil([&] { return ConditionTrue("uid-1", kQuadro, kFailed); }, 60s));
  const Json condition = Condition("uid-1", kQuadro, kFailed);
  EXPECT_EQ(condition["reason"], "BindFailed");
  EXPECT_THAT(condition["message"].get<std::string>(), HasSubstr(absl::StrCat("pid ", cuda_app.pid())));
  EXPECT_TRUE(Condition("uid-1", kQuadro, kBound).is_null());
  // The GPU's own unbind is still held in the kernel (the agent gave up on it after its write timeout); the rest
  // of its group was never written to.
  EXPECT_NE(DriverOf(kQuadro), "vfio-pci");
  ExpectOn({{"0000:01:00.1", "snd_hda_intel"}, {"0000:01:00.2", "xhci_hcd"}, {"0000:01:00.3", "nvidia-gpu"}});
  EXPECT_THAT(sim_->Log(), ::testing::Not(::testing::Contains(HasSubstr("vfio-pci 0000:01:00.1"))));
  EXPECT_FALSE(std::filesystem::exists(Checkpoint("uid-1")));
  ASSERT_TRUE(vfio_agent::testing::WaitUntil([&] { return Outcomes().size() == 1; }));
  EXPECT_FALSE(Outcomes()[0].ok);
  // The scheduler deallocates; nothing is left to undo and nothing is tried again.
  const size_t writes = sim_->Log().size();
  ASSERT_TRUE(api_->Control("deallocate vms claim-uid-1").ok());
  EXPECT_EQ(sim_->Log().size(), writes);
  ASSERT_TRUE(sim_->Control(absl::StrCat("release ", kQuadro)).ok());
}

// Deallocated (the scheduler gave up, the pod was deleted) or deleted before any Prepare: the GPUs go back.
TEST_F(BindingConditionsTest, DeallocationOrDeletionBeforePrepareUndoesTheBind) {
  StartHost(sim::NodeFile("a10x2-nvidia.json"));
  StartAgent();
  Allocate("uid-1", {kA10First});
  Allocate("uid-2", {kA10Second});
  ASSERT_TRUE(vfio_agent::testing::WaitUntil([&] {
    return ConditionTrue("uid-1", kA10First, kBound) && ConditionTrue("uid-2", kA10Second, kBound);
  }));
  ExpectOn({{kA10First, "vfio-pci"}, {kA10Second, "vfio-pci"}});
  ASSERT_TRUE(api_->Control("deallocate vms claim-uid-1").ok());
  ASSERT_TRUE(api_->Control("delete-claim vms claim-uid-2").ok());
  EXPECT_TRUE(vfio_agent::testing::WaitUntil([&] {
    return !std::filesystem::exists(Checkpoint("uid-1")) && !std::filesystem::exists(Checkpoint("uid-2"));
  }));
  ExpectOn({{kA10First, "nvidia"}, {kA10Second, "nvidia"}});
}

// A claim bound ahead of Prepare holds its IOMMU group from then on: the group's other GPU is published group-held
// before any Prepare (the scheduler could otherwise give it to another pod's claim while this pod waits for its
// condition), and is free again once the scheduler gives the allocation up (issue 31, defect 4).
TEST_F(BindingConditionsTest, AGpuBoundBeforePrepareHoldsItsGroupInTheSlicesUntilDeallocated) {
  Json node = Json::parse(fs::ReadTrimmed(sim::NodeFile("a10x2-nvidia.json")).value_or("{}"));
  for (Json& device : node["devices"]) device["iommu_group"] = 33;
  std::ofstream(dir_.path() / "shared-group.json") << node.dump();
  StartHost(dir_.path() / "shared-group.json");
  StartAgent();
  // "key=value:effect" of the device's taints in the node's slices.
  auto taints = [&](const std::string& bdf) {
    std::string text;
    auto slices = api_->Slices();
    if (!slices.ok() || !slices->is_array()) return std::string("no slices");
    for (const Json& slice : *slices) {
      for (const Json& device : slice["spec"].value("devices", Json::array())) {
        if (device.value("name", "") != DeviceName(bdf)) continue;
        for (const Json& taint : device.value("taints", Json::array())) {
          absl::StrAppend(&text, text.empty() ? "" : ",", taint.value("key", ""), "=", taint.value("value", ""), ":",
                          taint.value("effect", ""));
        }
      }
    }
    return text;
  };
  EXPECT_EQ(taints(kA10Second), "");
  Allocate("uid-1", {kA10First});
  ASSERT_TRUE(vfio_agent::testing::WaitUntil([&] { return ConditionTrue("uid-1", kA10First, kBound); }));
  EXPECT_TRUE(vfio_agent::testing::WaitUntil(
      [&] { return taints(kA10Second) == "gpu.vfio-agent.cozystack.io/group-held=33:NoSchedule"; }))
      << taints(kA10Second);
  // The claim's own GPU is never held against it (a rescan mid-bind may see its group half bound: a health taint).
  EXPECT_EQ(taints(kA10First).find("group-held"), std::string::npos) << taints(kA10First);
  ASSERT_TRUE(api_->Control("deallocate vms claim-uid-1").ok());
  EXPECT_TRUE(vfio_agent::testing::WaitUntil([&] { return taints(kA10Second).empty(); })) << taints(kA10Second);
  ExpectOn({{kA10First, "nvidia"}, {kA10Second, "nvidia"}});
}

// An agent restarted between the bind and Prepare keeps the bind (Prepare still moves nothing), and one restarted
// after the claim was deallocated meanwhile undoes it from the checkpoint.
TEST_F(BindingConditionsTest, AnAgentRestartBetweenBindAndPrepareKeepsOrUndoesTheBindFromTheCheckpoint) {
  StartHost(sim::NodeFile("a10x2-nvidia.json"));
  StartAgent();
  Allocate("uid-1", {kA10First});
  Allocate("uid-2", {kA10Second});
  ASSERT_TRUE(vfio_agent::testing::WaitUntil([&] {
    return ConditionTrue("uid-1", kA10First, kBound) && ConditionTrue("uid-2", kA10Second, kBound);
  }));
  driver_.reset();
  ASSERT_TRUE(kubelet_->WaitFor([](const KubeletDraSim& k) { return k.Plugins().empty(); }, 30s));
  ASSERT_TRUE(api_->Control("deallocate vms claim-uid-2").ok());
  StartAgent();
  EXPECT_TRUE(vfio_agent::testing::WaitUntil([&] { return !std::filesystem::exists(Checkpoint("uid-2")); }));
  EXPECT_EQ(DriverOf(kA10Second), "nvidia");
  EXPECT_EQ(DriverOf(kA10First), "vfio-pci");
  const size_t writes = sim_->Log().size();
  ASSERT_EQ(Prepare("uid-1"), "");
  EXPECT_EQ(sim_->Log().size(), writes);
  ASSERT_EQ(Unprepare("uid-1"), "");
  ExpectOn({{kA10First, "nvidia"}, {kA10Second, "nvidia"}});
}

// An agent killed inside the bind leaves the pending record: the next start returns what it names, and the claim,
// still allocated and unanswered, is bound again.
TEST_F(BindingConditionsTest, AnAgentKilledInsideTheBindUndoesItAtStartAndBindsAgain) {
  StartHost(sim::NodeFile("workstation-gpu-audio-usb.json"),
            {"set-driver 0000:01:00.0 vfio-pci", "set-driver 0000:01:00.1 vfio-pci"});  // where the bind had got to
  const Json pending = {{"bootID", fs::ReadTrimmed("/proc/sys/kernel/random/boot_id").value_or("")},
                        {"namespace", "vms"},
                        {"name", "claim-uid-1"},
                        {"uid", "uid-1"},
                        {"cdiSpec", ""},
                        {"metadataDir", ""},
                        {"devices", Json::array({{{"request", "gpu0"}, {"pool", kNode},
                                                  {"device", DeviceName(kQuadro)}, {"bdf", kQuadro}}})},
                        {"driversBeforeBind", kQuadroGroup},
                        {"pending", true},
                        {"boundBeforePrepare", true}};
  std::filesystem::create_directories(Checkpoint("uid-1").parent_path());
  std::ofstream(Checkpoint("uid-1")) << pending.dump();
  ASSERT_NO_FATAL_FAILURE(testing::StartRegistered(Options(), &driver_, &kubelet_));
  ExpectOn(kQuadroGroup);  // undone before the driver serves
  ASSERT_TRUE(vfio_agent::testing::WaitUntil([&] { auto slices = api_->Slices(); return slices.ok() && !slices->empty(); }));
  Allocate("uid-1", {kQuadro});
  ASSERT_TRUE(vfio_agent::testing::WaitUntil([&] { return ConditionTrue("uid-1", kQuadro, kBound); }));
  for (const auto& [bdf, driver] : kQuadroGroup) EXPECT_EQ(DriverOf(bdf), "vfio-pci") << bdf;
  const Json record = Json::parse(fs::ReadTrimmed(Checkpoint("uid-1")).value_or("{}"));
  EXPECT_EQ(record["driversBeforeBind"], Json(kQuadroGroup));
  ASSERT_TRUE(api_->Control("delete-claim vms claim-uid-1").ok());
  EXPECT_TRUE(vfio_agent::testing::WaitUntil([&] { return !std::filesystem::exists(Checkpoint("uid-1")); }));
  ExpectOn(kQuadroGroup);
}

// A 1.34/1.35 API server (the gates off) drops the fields: the driver warns, stops its claim watch, and Prepare
// binds as without the flag.
TEST_F(BindingConditionsTest, AServerWithoutTheGateGetsTodaysBehaviour) {
  publisher_.reset();
  claims_.reset();
  reader_.reset();
  api_.reset();
  auto api = sim::KubeApiSim::Start(dir_.path(), {.feature_gates = "DRADeviceBindingConditions=false"});
  ASSERT_TRUE(api.ok()) << api.status();
  api_ = *std::move(api);
  Connect();
  StartHost(sim::NodeFile("a10x2-nvidia.json"));
  StartAgent();
  EXPECT_FALSE(api_->Slices()->at(0)["spec"]["devices"][0].contains("bindingConditions"));
  Allocate("uid-1", {kA10First});
  EXPECT_FALSE(Claim("uid-1")["status"]["allocation"]["devices"]["results"][0].contains("bindingConditions"));
  EXPECT_EQ(DriverOf(kA10First), "nvidia");
  ASSERT_EQ(Prepare("uid-1"), "");
  EXPECT_EQ(DriverOf(kA10First), "vfio-pci");
  ASSERT_EQ(Unprepare("uid-1"), "");
  EXPECT_EQ(DriverOf(kA10First), "nvidia");
  EXPECT_TRUE(Outcomes().empty());
}

}  // namespace
}  // namespace vfio_agent::dra
