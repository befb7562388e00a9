// --bind-on-prepare end to end: kubelet-dra-sim calls the driver, which reads the claim from the fake API server and
// binds on the FUSE sysfs simulator, which moves drivers as the kernel does and blocks a write when told to. Every
// GPU starts on its host driver; each test reads where every function of the group is afterwards.
#include <chrono>
#include <future>
#include <fstream>
#include <map>
#include <optional>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/algorithm/container.h"
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
#include "vfio_gpu_agent/dra/checkpoint.h"
#include "vfio_gpu_agent/dra/device_names.h"
#include "vfio_gpu_agent/dra/driver.h"

namespace vfio_agent::dra {
namespace {

using Json = nlohmann::json;
using kubeletsim::dra::KubeletDraSim;
using kubeletsim::dra::MakeClaim;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr char kDriverName[] = "gpu.vfio-agent.cozystack.io";
// workstation-gpu-audio-usb.json: a Quadro RTX 4000 and its three companions, all in IOMMU group 12.
constexpr char kQuadro[] = "0000:01:00.0";
const std::map<std::string, std::string> kQuadroGroup = {{"0000:01:00.0", "nvidia"},
                                                        {"0000:01:00.1", "snd_hda_intel"},
                                                        {"0000:01:00.2", "xhci_hcd"},
                                                        {"0000:01:00.3", "nvidia-gpu"}};
// a10x2-nvidia.json: two A10s on nvidia, alone in groups 33 and 77.
constexpr char kA10First[] = "0000:3b:00.0";
constexpr char kA10Second[] = "0000:86:00.0";

class BindOnPrepareTest : public kube::testing::KubeApiSimTest {
 protected:
  void SetUp() override {
    KubeApiSimTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (!vfio_agent::testing::FuseAvailable()) GTEST_SKIP() << vfio_agent::testing::kNeedsFuse;
    auto kubeconfig = api_->WriteKubeconfig(dir_.path() / "kubeconfig");
    ASSERT_TRUE(kubeconfig.ok()) << kubeconfig.status();
    auto reader = kube::ConnectResourceClaimReader({.kubeconfig = *kubeconfig});
    ASSERT_TRUE(reader.ok()) << reader.status();
    reader_ = *std::move(reader);
  }

  void TearDown() override {
    driver_.reset();
    kubelet_.reset();
  }

  // The simulated node, with `before` run against its control file first (the host as the agent finds it).
  void StartHost(const std::filesystem::path& node, const std::vector<std::string>& before = {}) {
    std::filesystem::create_directories(dir_.path() / "root");
    auto sim = sim::SimProcess::Start(node, dir_.path() / "root");
    ASSERT_TRUE(sim.ok()) << sim.status();
    sim_ = *std::move(sim);
    for (const std::string& command : before) ASSERT_TRUE(sim_->Control(command).ok()) << command;
  }

  DriverOptions Options() const {
    DriverOptions options{.registry_dir = dir_.path() / "plugins_registry",
                          .plugins_dir = dir_.path() / "plugins",
                          .cdi_dir = dir_.path() / "cdi"};
    options.paths.sysfs_root = sim_->sysfs_root();
    options.paths.dev_root = sim_->dev_root();
    options.paths.proc_root = "/proc";  // the holders are this test's own processes
    options.paths.modules_root = dir_.path() / "modules";
    options.get_claim = [this](const std::string& ns, const std::string& name) { return reader_->Get(ns, name, 20s); };
    options.bind_on_prepare = true;
    return options;
  }

  void StartAgent() { ASSERT_NO_FATAL_FAILURE(testing::StartRegistered(Options(), &driver_, &kubelet_)); }

  // Allocated by the scheduler: one request per GPU, reserved for `pod` (by default a pod of its own).
  void AddClaim(const std::string& uid, const std::vector<std::string>& gpus, std::string pod = "") {
    if (pod.empty()) pod = "pod-" + uid;
    Json results = Json::array();
    for (const std::string& bdf : gpus) {
      results.push_back({{"request", absl::StrCat("gpu", results.size())}, {"driver", kDriverName}, {"pool", "node-a"},
                         {"device", DeviceName(bdf)}});
    }
    const Json claim = {{"metadata", {{"namespace", "vms"}, {"name", "claim-" + uid}, {"uid", uid}}},
                        {"spec", {{"devices", {{"requests", Json::array()}}}}},
                        {"status", {{"allocation", {{"devices", {{"results", results}}}}},
                                    {"reservedFor", {{{"resource", "pods"}, {"name", pod}, {"uid", pod}}}}}}};
    ASSERT_TRUE(api_->Control("claim " + claim.dump()).ok());
  }

  // The claim's error ("" when prepared); a broken call fails the test.
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
  std::string OverrideOf(const std::string& bdf) const {
    return fs::ReadTrimmed(sim_->sysfs_root() / "bus/pci/devices" / bdf / "driver_override").value_or("?");
  }
  // Every function on its driver and no override left behind.
  void ExpectOn(const std::map<std::string, std::string>& drivers) const {
    for (const auto& [bdf, driver] : drivers) {
      EXPECT_EQ(DriverOf(bdf), driver) << bdf;
      EXPECT_EQ(OverrideOf(bdf), "(null)") << bdf;
    }
  }
  std::filesystem::path Checkpoint(const std::string& uid) const {
    return dir_.path() / "plugins" / kDriverName / "claims" / (uid + ".json");
  }
  std::filesystem::path CdiSpec(const std::string& uid) const {
    return dir_.path() / "cdi" / absl::StrCat(kDriverName, "_claim_", uid, ".json");
  }
  // The device's health in the kubelet's latest health message; nullopt when not in it.
  std::optional<::v1alpha1::HealthStatus> StreamedHealth(const std::string& bdf) const {
    auto health = kubelet_->LatestHealth(kDriverName);
    if (!health) return std::nullopt;
    for (const auto& device : health->devices()) {
      if (device.device().device_name() == DeviceName(bdf)) return device.health();
    }
    return std::nullopt;
  }
  // Something under <dev>/ changed: the driver's loop rescans now (its device event).
  void PokeDevDir(const std::string& name) const { std::ofstream(sim_->dev_root() / name) << "\n"; }
  const GpuDevice* Published(const std::string& bdf) {
    devices_ = driver_->Devices();
    for (const GpuDevice& device : devices_) {
      if (device.bdf == bdf) return &device;
    }
    return nullptr;
  }

  std::unique_ptr<sim::SimProcess> sim_;
  std::unique_ptr<kube::ResourceClaimReader> reader_;
  std::unique_ptr<KubeletDraSim> kubelet_;
  std::unique_ptr<Driver> driver_;
  std::vector<GpuDevice> devices_;
};

TEST_F(BindOnPrepareTest, AClaimBindsItsWholeGroupAndUnprepareReturnsEachFunctionToItsDriver) {
  StartHost(sim::NodeFile("workstation-gpu-audio-usb.json"));
  StartAgent();
  // Published while on nvidia, and healthy: a Prepare can bind it.
  const GpuDevice* quadro = Published(kQuadro);
  ASSERT_NE(quadro, nullptr);
  EXPECT_TRUE(quadro->healthy()) << quadro->unhealthy_reason;
  EXPECT_TRUE(quadro->slice.taints.empty());
  ExpectOn(kQuadroGroup);  // nothing bound at start

  AddClaim("uid-1", {kQuadro});
  ASSERT_EQ(Prepare("uid-1"), "");
  for (const auto& [bdf, driver] : kQuadroGroup) EXPECT_EQ(DriverOf(bdf), "vfio-pci") << bdf;
  EXPECT_TRUE(std::filesystem::exists(sim_->dev_root() / "vfio/12"));
  EXPECT_TRUE(std::filesystem::exists(CdiSpec("uid-1")));
  const Json checkpoint = Json::parse(fs::ReadTrimmed(Checkpoint("uid-1")).value_or("{}"));
  EXPECT_EQ(checkpoint["driversBeforeBind"], Json(kQuadroGroup));
  // As `validate` reads it: the claim holds the GPU and every function its Prepare bound.
  absl::StatusOr<CheckpointRead> read = ReadCheckpoint(Options());
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->claims.size(), 1u);
  EXPECT_EQ(read->claims[0].ref, "vms/claim-uid-1 (uid-1)");
  EXPECT_THAT(read->claims[0].bdfs,
              ::testing::ElementsAre("0000:01:00.0", "0000:01:00.1", "0000:01:00.2", "0000:01:00.3"));

  ASSERT_EQ(Unprepare("uid-1"), "");
  ExpectOn(kQuadroGroup);
  EXPECT_FALSE(std::filesystem::exists(Checkpoint("uid-1")));
  read = ReadCheckpoint(Options());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(read->claims.empty());
  EXPECT_FALSE(std::filesystem::exists(CdiSpec("uid-1")));
}

// Never `nvidia` by assumption: a GPU without a driver before the claim has none after it (a reprobe would hand it
// to nvidia), and one that was on vfio-pci when the agent started stays there.
TEST_F(BindOnPrepareTest, AGpuWithoutADriverStaysWithoutAndOneOnVfioAtStartStaysOnVfio) {
  StartHost(sim::NodeFile("a10x2-nvidia.json"),
            {absl::StrCat("set-driver ", kA10First, " none"), absl::StrCat("set-driver ", kA10Second, " vfio-pci")});
  StartAgent();
  AddClaim("uid-1", {kA10First, kA10Second});
  ASSERT_EQ(Prepare("uid-1"), "");
  EXPECT_EQ(DriverOf(kA10First), "vfio-pci");
  EXPECT_EQ(DriverOf(kA10Second), "vfio-pci");
  const Json checkpoint = Json::parse(fs::ReadTrimmed(Checkpoint("uid-1")).value_or("{}"));
  EXPECT_EQ(checkpoint["driversBeforeBind"], Json::parse(absl::StrCat(R"({")", kA10First, R"(":""})")));

  ASSERT_EQ(Unprepare("uid-1"), "");
  ExpectOn({{kA10First, ""}});
  EXPECT_EQ(DriverOf(kA10Second), "vfio-pci");
  for (const std::string& line : sim_->Log()) EXPECT_THAT(line, ::testing::Not(HasSubstr(kA10Second + std::string(" nvidia"))));
}

// A process holding the GPU open keeps nvidia from letting go (the simulator blocks the unbind until released):
// the claim fails within the agent's own deadline, well inside the kubelet's 45 s, naming the holder, and the group
// is exactly as before.
TEST_F(BindOnPrepareTest, AHeldGpuFailsTheClaimInTimeNamingTheHolderWithNothingHalfBound) {
  StartHost(sim::NodeFile("workstation-gpu-audio-usb.json"), {absl::StrCat("unbind-delay ", kQuadro, " -1")});
  vfio_agent::testing::HoldingProcess cuda_app(sim_->dev_root() / "nvidia0");
  const std::string comm = fs::ReadTrimmed(absl::StrCat("/proc/", cuda_app.pid(), "/comm")).value_or("?");
  StartAgent();
  AddClaim("uid-1", {kQuadro});
  const auto start = std::chrono::steady_clock::now();
  const std::string error = Prepare("uid-1");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 40s);
  EXPECT_THAT(error, HasSubstr(absl::StrCat("pid ", cuda_app.pid(), " (", comm, "): ")));
  EXPECT_THAT(error, HasSubstr("nvidia0 open"));
  EXPECT_THAT(error, HasSubstr(absl::StrCat(kQuadro, " blocked: unbind from nvidia")));
  EXPECT_THAT(error, HasSubstr("every function written to is back on its driver"));
  ExpectOn(kQuadroGroup);
  EXPECT_FALSE(std::filesystem::exists(Checkpoint("uid-1")));
  EXPECT_FALSE(std::filesystem::exists(CdiSpec("uid-1")));
  ASSERT_TRUE(sim_->Control(absl::StrCat("release ", kQuadro)).ok());
}

// The unbind the agent gave up on stays in the kernel and completes when the holder lets go, leaving the GPU on no
// driver (seen on the real cluster, tests/deploy/records/binding.md). The next claim binds it; its Unprepare must
// return it to nvidia, the driver it had before the abandoned write, not to "no driver".
TEST_F(BindOnPrepareTest, AGpuAnAbandonedUnbindLeftOnNoDriverReturnsToItsDriverAfterTheNextClaim) {
  StartHost(sim::NodeFile("workstation-gpu-audio-usb.json"), {absl::StrCat("unbind-delay ", kQuadro, " -1")});
  {
    vfio_agent::testing::HoldingProcess cuda_app(sim_->dev_root() / "nvidia0");
    StartAgent();
    AddClaim("uid-1", {kQuadro});
    EXPECT_THAT(Prepare("uid-1"), HasSubstr(absl::StrCat(kQuadro, " blocked: unbind from nvidia")));
    ExpectOn(kQuadroGroup);
  }
  // The holder is gone: the kernel finishes the abandoned unbind.
  ASSERT_TRUE(sim_->Control(absl::StrCat("unbind-delay ", kQuadro, " 0")).ok());
  ASSERT_TRUE(sim_->Control(absl::StrCat("release ", kQuadro)).ok());
  ASSERT_TRUE(vfio_agent::testing::WaitUntil([&] { return DriverOf(kQuadro).empty(); })) << DriverOf(kQuadro);
  AddClaim("uid-2", {kQuadro});
  ASSERT_EQ(Prepare("uid-2"), "");
  EXPECT_EQ(DriverOf(kQuadro), "vfio-pci");
  ASSERT_EQ(Unprepare("uid-2"), "");
  ExpectOn(kQuadroGroup);
}

// The GPU and its audio function are on vfio-pci when the USB controller's unbind blocks: both go back before the
// claim is answered.
TEST_F(BindOnPrepareTest, FunctionsAlreadyMovedGoBackWhenALaterOneOfTheGroupBlocks) {
  StartHost(sim::NodeFile("workstation-gpu-audio-usb.json"), {"unbind-delay 0000:01:00.2 -1"});
  StartAgent();
  AddClaim("uid-1", {kQuadro});
  const std::string error = Prepare("uid-1");
  EXPECT_THAT(error, HasSubstr("0000:01:00.2 blocked: unbind from xhci_hcd"));
  EXPECT_THAT(error, HasSubstr("0000:01:00.0 on nvidia (was nvidia)"));
  ExpectOn(kQuadroGroup);
  const std::vector<std::string> log = sim_->Log();
  EXPECT_THAT(log, ::testing::Contains("bind 0000:01:00.0 vfio-pci"));  // it had moved
  EXPECT_THAT(log, ::testing::Contains("bind 0000:01:00.1 snd_hda_intel"));
  EXPECT_FALSE(std::filesystem::exists(Checkpoint("uid-1")));
  ASSERT_TRUE(sim_->Control("release 0000:01:00.2").ok());
}

// The checkpoint carries the drivers: an agent restarted between Prepare and Unprepare still returns each function
// where it was, the USB controller (unbound before) included, which a reprobe would give to xhci_hcd.
TEST_F(BindOnPrepareTest, AnAgentRestartBetweenPrepareAndUnprepareStillReturnsEachFunction) {
  StartHost(sim::NodeFile("workstation-gpu-audio-usb.json"), {"set-driver 0000:01:00.2 none"});
  std::map<std::string, std::string> before = kQuadroGroup;
  before["0000:01:00.2"] = "";
  StartAgent();
  AddClaim("uid-1", {kQuadro});
  ASSERT_EQ(Prepare("uid-1"), "");
  driver_.reset();
  ASSERT_TRUE(kubelet_->WaitFor([](const KubeletDraSim& k) { return k.Plugins().empty(); }, 30s));
  StartAgent();
  for (const auto& [bdf, driver] : before) EXPECT_EQ(DriverOf(bdf), "vfio-pci") << bdf << ": a restart moves nothing";
  ASSERT_EQ(Unprepare("uid-1"), "");
  ExpectOn(before);
}

// The stale-claim sweep applies the same policy: a claim deleted while the agent was down has its GPU returned.
TEST_F(BindOnPrepareTest, AClaimDeletedWhileTheAgentWasDownHasItsGpuReturned) {
  StartHost(sim::NodeFile("a10x2-nvidia.json"));
  StartAgent();
  AddClaim("uid-1", {kA10First});
  ASSERT_EQ(Prepare("uid-1"), "");
  ASSERT_EQ(DriverOf(kA10First), "vfio-pci");
  driver_.reset();
  ASSERT_TRUE(api_->Control("delete-claim vms claim-uid-1").ok());
  StartAgent();
  EXPECT_TRUE(vfio_agent::testing::WaitUntil([&] { return !std::filesystem::exists(Checkpoint("uid-1")); }));
  ExpectOn({{kA10First, "nvidia"}, {kA10Second, "nvidia"}});
}

// A GPU whose group holds a foreign endpoint (a NIC on i40e) can never be bound: it is published tainted, and a
// claim on it is refused with the reason before anything is written.
TEST_F(BindOnPrepareTest, AGpuSharingItsGroupWithAForeignDeviceIsTaintedAndRefusedUntouched) {
  StartHost(sim::NodeFile("gpu-foreign-nic.json"));
  StartAgent();
  const GpuDevice* shared = Published("0000:3b:00.0");
  ASSERT_NE(shared, nullptr);
  EXPECT_THAT(shared->unhealthy_reason, HasSubstr("IOMMU group 30 cannot be bound to vfio-pci: 0000:3c:00.0"));
  EXPECT_EQ(shared->slice.taints.size(), 1u);
  const GpuDevice* alone = Published(kA10Second);
  ASSERT_NE(alone, nullptr);
  EXPECT_TRUE(alone->healthy()) << alone->unhealthy_reason;

  AddClaim("uid-1", {"0000:3b:00.0"});
  const std::string error = Prepare("uid-1");
  EXPECT_THAT(error, HasSubstr("0000:3b:00.0 blocked: group shares its IOMMU group with 0000:3c:00.0"));
  EXPECT_THAT(error, HasSubstr("nothing was written"));
  EXPECT_EQ(sim_->Log(), std::vector<std::string>{});
  ExpectOn({{"0000:3b:00.0", "nvidia"}, {"0000:3c:00.0", "i40e"}});
}

// Two GPUs in one IOMMU group (no ACS between them), each in its own claim of one VM's pod: the first claim bound the
// group, but its Unprepare must not pull the second GPU from under the VM. The last claim out returns both.
TEST_F(BindOnPrepareTest, TheLastClaimOutOfASharedGroupReturnsIt) {
  Json node = Json::parse(fs::ReadTrimmed(sim::NodeFile("a10x2-nvidia.json")).value_or("{}"));
  for (Json& device : node["devices"]) device["iommu_group"] = 33;
  std::ofstream(dir_.path() / "shared-group.json") << node.dump();
  StartHost(dir_.path() / "shared-group.json");
  StartAgent();
  AddClaim("uid-a", {kA10First}, "vm-pod");
  AddClaim("uid-b", {kA10Second}, "vm-pod");
  ASSERT_EQ(Prepare("uid-a"), "");
  ASSERT_EQ(Prepare("uid-b"), "");
  ASSERT_EQ(Unprepare("uid-a"), "");
  EXPECT_EQ(DriverOf(kA10First), "vfio-pci");
  EXPECT_EQ(DriverOf(kA10Second), "vfio-pci");
  const Json checkpoint = Json::parse(fs::ReadTrimmed(Checkpoint("uid-b")).value_or("{}"));
  EXPECT_EQ(checkpoint["driversBeforeBind"].size(), 2u) << checkpoint.dump();
  ASSERT_EQ(Unprepare("uid-b"), "");
  ExpectOn({{kA10First, "nvidia"}, {kA10Second, "nvidia"}});
}

// Two GPUs of one IOMMU group in claims of two pods: a group has one owner, so the second VM would fail with EBUSY
// on /dev/vfio/<group>. The second claim is refused, naming the first, and nothing is written for it (issue 31,
// defect 4).
TEST_F(BindOnPrepareTest, AGroupIsNeverSplitBetweenClaimsOfTwoPods) {
  Json node = Json::parse(fs::ReadTrimmed(sim::NodeFile("a10x2-nvidia.json")).value_or("{}"));
  for (Json& device : node["devices"]) device["iommu_group"] = 33;
  std::ofstream(dir_.path() / "shared-group.json") << node.dump();
  StartHost(dir_.path() / "shared-group.json");
  StartAgent();
  AddClaim("uid-a", {kA10First});
  AddClaim("uid-b", {kA10Second});
  ASSERT_EQ(Prepare("uid-a"), "");
  const size_t writes = sim_->Log().size();
  const std::string error = Prepare("uid-b");
  EXPECT_THAT(error, HasSubstr(absl::StrCat("shares IOMMU group 33 with ", DeviceName(kA10First), " (", kA10First,
                                            ") of prepared claim vms/claim-uid-a (uid-a)")));
  EXPECT_EQ(sim_->Log().size(), writes);
  EXPECT_FALSE(std::filesystem::exists(Checkpoint("uid-b")));
  EXPECT_FALSE(std::filesystem::exists(CdiSpec("uid-b")));
  ASSERT_EQ(Unprepare("uid-a"), "");
  EXPECT_EQ(Prepare("uid-b"), "");  // once the group is free, the other pod gets it
}

// The checkpoint says what a Prepare may change before the first sysfs write: while the GPU's unbind is blocked in
// the kernel, the claim's record is on disk, pending, with every function's driver before (issue 31, defect 5).
TEST_F(BindOnPrepareTest, APrepareIsRecordedBeforeSysfsIsTouched) {
  StartHost(sim::NodeFile("workstation-gpu-audio-usb.json"), {absl::StrCat("unbind-delay ", kQuadro, " -1")});
  StartAgent();
  AddClaim("uid-1", {kQuadro});
  std::future<std::string> prepared = std::async(std::launch::async, [this] { return Prepare("uid-1"); });
  // The kernel holds the GPU's unbind (the simulator logs the wait before it starts waiting).
  EXPECT_TRUE(vfio_agent::testing::WaitUntil([&] {
    return absl::c_linear_search(sim_->Log(), absl::StrCat("unbind-wait ", kQuadro, " nvidia"));
  }));
  const Json record = Json::parse(fs::ReadTrimmed(Checkpoint("uid-1")).value_or("{}"), nullptr, false);
  EXPECT_TRUE(record.is_object() && record.value("pending", false)) << record.dump();
  if (record.is_object() && record.contains("driversBeforeBind")) {
    EXPECT_EQ(record["driversBeforeBind"], Json(kQuadroGroup)) << record.dump();
  }
  ASSERT_TRUE(sim_->Control(absl::StrCat("unbind-delay ", kQuadro, " 0")).ok());
  ASSERT_TRUE(sim_->Control(absl::StrCat("release ", kQuadro)).ok());
  EXPECT_EQ(prepared.get(), "");
  const Json final_record = Json::parse(fs::ReadTrimmed(Checkpoint("uid-1")).value_or("{}"));
  EXPECT_FALSE(final_record.value("pending", false)) << final_record.dump();
  ASSERT_EQ(Unprepare("uid-1"), "");
  ExpectOn(kQuadroGroup);
}

// An agent killed inside a Prepare (after the bind, before the checkpoint was final) leaves a pending record: the
// next start returns each function it names to its driver and removes the claim's files, and the kubelet's retry
// prepares the claim afresh (issue 31, defect 5).
TEST_F(BindOnPrepareTest, ARestartUndoesAPrepareCutShort) {
  StartHost(sim::NodeFile("workstation-gpu-audio-usb.json"),
            {"set-driver 0000:01:00.0 vfio-pci", "set-driver 0000:01:00.1 vfio-pci"});  // where the bind had got to
  const std::string boot_id = fs::ReadTrimmed("/proc/sys/kernel/random/boot_id").value_or("");
  const Json pending = {{"bootID", boot_id},
                        {"namespace", "vms"},
                        {"name", "claim-uid-1"},
                        {"uid", "uid-1"},
                        {"cdiSpec", CdiSpec("uid-1").string()},
                        {"metadataDir", (dir_.path() / "plugins" / kDriverName / "dra-device-metadata/vms_claim-uid-1").string()},
                        {"devices", Json::array()},
                        {"driversBeforeBind", kQuadroGroup},
                        {"pending", true}};
  std::filesystem::create_directories(Checkpoint("uid-1").parent_path());
  std::ofstream(Checkpoint("uid-1")) << pending.dump();
  StartAgent();
  ExpectOn(kQuadroGroup);
  EXPECT_FALSE(std::filesystem::exists(Checkpoint("uid-1")));
  AddClaim("uid-1", {kQuadro});
  ASSERT_EQ(Prepare("uid-1"), "");
  EXPECT_EQ(DriverOf(kQuadro), "vfio-pci");
  ASSERT_EQ(Unprepare("uid-1"), "");
  ExpectOn(kQuadroGroup);
}

// A scan taken while a claim's Prepare is moving a GPU sees it half-moved, which is not its health: the driver keeps
// the health the GPU had before for that scan (the stream and the slice stay Healthy), while the same scan's news of
// a GPU nobody moves is published. A move that leaves its GPU unhealthy is published as soon as it ends, not at the
// next periodic rescan.
TEST_F(BindOnPrepareTest, AScanDuringAMoveKeepsTheGpusHealthAndTheFirstScanAfterItDecides) {
  StartHost(sim::NodeFile("a10x2-nvidia.json"), {absl::StrCat("unbind-delay ", kA10First, " -1")});
  DriverOptions options = Options();
  options.rescan_interval = std::chrono::hours(1);  // only device events and the end of a move scan
  ASSERT_NO_FATAL_FAILURE(testing::StartRegistered(options, &driver_, &kubelet_));
  ASSERT_TRUE(vfio_agent::testing::WaitUntil([&] {
    return StreamedHealth(kA10First) == ::v1alpha1::HEALTHY && StreamedHealth(kA10Second) == ::v1alpha1::HEALTHY;
  }));

  AddClaim("uid-1", {kA10First});
  std::future<std::string> prepared = std::async(std::launch::async, [this] { return Prepare("uid-1"); });
  ASSERT_TRUE(vfio_agent::testing::WaitUntil([&] {
    return absl::c_linear_search(sim_->Log(), absl::StrCat("unbind-wait ", kA10First, " nvidia"));
  }));
  // Mid-move both GPUs read as off the bus; a device event makes the driver scan.
  ASSERT_TRUE(sim_->Control(absl::StrCat("dead ", kA10First, " 1")).ok());
  ASSERT_TRUE(sim_->Control(absl::StrCat("dead ", kA10Second, " 1")).ok());
  PokeDevDir("poke-1");
  ASSERT_TRUE(vfio_agent::testing::WaitUntil([&] { return StreamedHealth(kA10Second) == ::v1alpha1::UNHEALTHY; }));
  // The same message: the moving GPU as it was before the move.
  EXPECT_EQ(StreamedHealth(kA10First), ::v1alpha1::HEALTHY);
  const GpuDevice* moving = Published(kA10First);
  ASSERT_NE(moving, nullptr);
  EXPECT_TRUE(moving->healthy()) << moving->unhealthy_reason;
  EXPECT_TRUE(moving->slice.taints.empty());

  ASSERT_TRUE(sim_->Control(absl::StrCat("dead ", kA10First, " 0")).ok());
  ASSERT_TRUE(sim_->Control(absl::StrCat("unbind-delay ", kA10First, " 0")).ok());
  ASSERT_TRUE(sim_->Control(absl::StrCat("release ", kA10First)).ok());
  ASSERT_EQ(prepared.get(), "");
  EXPECT_EQ(DriverOf(kA10First), "vfio-pci");
  EXPECT_EQ(StreamedHealth(kA10First), ::v1alpha1::HEALTHY);

  // Unprepare returns it to nvidia, where it reads as off the bus: once the return ended, that is its health.
  ASSERT_TRUE(sim_->Control(absl::StrCat("dead ", kA10First, " 1")).ok());
  ASSERT_EQ(Unprepare("uid-1"), "");
  EXPECT_EQ(DriverOf(kA10First), "nvidia");
  EXPECT_TRUE(vfio_agent::testing::WaitUntil([&] { return StreamedHealth(kA10First) == ::v1alpha1::UNHEALTHY; },
                                             std::chrono::seconds(10)));
  moving = Published(kA10First);
  ASSERT_NE(moving, nullptr);
  EXPECT_THAT(moving->unhealthy_reason, HasSubstr("config space"));
}

}  // namespace
}  // namespace vfio_agent::dra
