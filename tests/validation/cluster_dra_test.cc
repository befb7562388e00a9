// `validate --kubelet-api dra`: the DRA driver's links checked against the real driver (src/dra) registered with
// the kubelet DRA simulator, the fake API server holding the node's ResourceSlices (written by the agent's own
// publisher) and the DeviceClasses, and a KubeVirt CR; every failure with its fix.
#include <sys/wait.h>

#include <cstdio>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include "absl/strings/str_cat.h"
#include "kube_api_sim.h"
#include "kubelet_dra_sim.h"
#include "support/holding_process.h"
#include "support/sysfs_tree.h"
#include "support/wait.h"
#include "vfio_gpu_agent/dra/checkpoint.h"
#include "vfio_gpu_agent/dra/device_names.h"
#include "vfio_gpu_agent/dra/driver.h"
#include "vfio_gpu_agent/dra/registration_record.h"
#include "vfio_gpu_agent/kube/dra_objects_reader.h"
#include "vfio_gpu_agent/kube/resource_slices.h"
#include "vfio_gpu_agent/pci/inventory.h"
#include "vfio_gpu_agent/pci/selection.h"
#include "vfio_gpu_agent/validation/dra_checks.h"
#include "vfio_gpu_agent/validation/dra_config.h"

namespace vfio_agent::validation {
namespace {

using Json = nlohmann::json;
using ::testing::HasSubstr;
using kubeletsim::dra::KubeletDraSim;

constexpr char kNode[] = "node-a";
constexpr std::chrono::milliseconds kDraWait{20000};
const std::vector<std::string> kGpus = {"0000:18:00.0", "0000:2a:00.0"};

const Check* FindDraCheck(const std::vector<Check>& checks, const std::string& id, const std::string& subject = "") {
  for (const Check& check : checks) {
    if (check.id == id && (subject.empty() || check.subject == subject)) return &check;
  }
  return nullptr;
}

std::string DraEvidence(const Check& check) {
  std::string text;
  for (const Evidence& e : check.evidence) absl::StrAppend(&text, e.source, " = ", e.value, "\n");
  return text;
}

// The DeviceClasses `kubevirt-config --format dra` prints for an H200, as the API server lists them.
Json ClassesFor(const std::string& driver) {
  names::NameResolver resolver(nullptr, "nvidia.com", {});
  Json items = Json::array();
  for (const YAML::Node& doc : YAML::LoadAll(DeviceClassesYaml(DraModels({{0x10de, 0x2335}}, resolver), driver))) {
    items.push_back({{"apiVersion", "resource.k8s.io/v1"},
                     {"kind", "DeviceClass"},
                     {"metadata", {{"name", doc["metadata"]["name"].as<std::string>()}}},
                     {"spec",
                      {{"selectors", {{{"cel", {{"expression", doc["spec"]["selectors"][0]["cel"]["expression"]
                                                                    .as<std::string>()}}}}}}}}});
  }
  return items;
}

class ClusterDraTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (size_t i = 0; i < kGpus.size(); ++i) {
      tree_.AddDevice({.bdf = kGpus[i], .device = 0x2335, .driver = "vfio-pci", .iommu_group = 11 + static_cast<int>(i)});
    }
    options_.registry_dir = dir_.path() / "plugins_registry";
    options_.plugins_dir = dir_.path() / "plugins";
    options_.cdi_dir = dir_.path() / "cdi";
    options_.paths = {.sysfs_root = tree_.root(), .dev_root = dir_.path() / "dev", .proc_root = dir_.path() / "proc"};
    std::filesystem::create_directories(options_.cdi_dir);
    std::filesystem::create_directories(options_.paths.VfioDir());
    for (int group : {11, 12}) std::ofstream(options_.paths.VfioDir() / std::to_string(group));
    std::filesystem::create_directories(options_.paths.proc_root / "sys/kernel/random");
    std::ofstream(options_.paths.proc_root / "sys/kernel/random/boot_id") << "boot-1\n";
  }

  // Where the GPUs are under --bind-on-prepare before any claim: on nvidia, no group node.
  void GpusOnNvidia() {
    for (const std::string& bdf : kGpus) tree_.BindDriver(bdf, "nvidia");
    std::filesystem::remove_all(options_.paths.VfioDir());
  }

  // A checkpoint file as the driver writes it for a claim holding `bdfs` (tests/dra checks the driver's own).
  void WriteCheckpoint(const std::string& uid, const std::vector<std::string>& bdfs,
                       const std::string& boot = "boot-1") {
    Json devices = Json::array();
    Json before = Json::object();
    for (const std::string& bdf : bdfs) {
      devices.push_back({{"request", "gpu"}, {"pool", kNode}, {"device", dra::DeviceName(bdf)}, {"bdf", bdf}});
      before[bdf] = "nvidia";
    }
    const Json claim = {{"bootID", boot}, {"namespace", "vms"}, {"name", "claim-" + uid}, {"uid", uid},
                        {"devices", devices}, {"driversBeforeBind", before}};
    std::filesystem::create_directories(dra::CheckpointDir(options_));
    std::ofstream(dra::CheckpointDir(options_) / (uid + ".json")) << claim.dump();
  }

  // The driver serving, registered with a kubelet speaking `services`.
  void StartDriver(std::vector<std::string> services = {"v1.DRAPlugin", "v1beta1.DRAPlugin"}) {
    kubelet_ = std::make_unique<KubeletDraSim>(
        kubeletsim::dra::Options{.registry_dir = options_.registry_dir, .supported_services = std::move(services)});
    ASSERT_TRUE(kubelet_->Start().ok());
    driver_ = std::make_unique<dra::Driver>(options_);
    ASSERT_TRUE(driver_->Start().ok());
    ASSERT_TRUE(vfio_agent::testing::WaitUntil([&] { return driver_->Registration().notifications >= 1; }, kDraWait));
  }

  // The fake API server with the node, the given GPUs' devices published by the agent's publisher, and classes.
  void StartApi(const std::vector<std::string>& published, const Json& classes) {
    if (!sim::KubeApiSim::Available()) GTEST_SKIP() << "python3 not found";
    auto api = sim::KubeApiSim::Start(dir_.path());
    ASSERT_TRUE(api.ok()) << api.status();
    api_ = *std::move(api);
    auto kubeconfig = api_->WriteKubeconfig(dir_.path() / "kubeconfig");
    ASSERT_TRUE(kubeconfig.ok()) << kubeconfig.status();
    kubeconfig_ = *kubeconfig;
    ASSERT_TRUE(api_->Control(absl::StrCat("node ", kNode)).ok());
    ASSERT_TRUE(api_->Control(absl::StrCat("deviceclasses ", classes.dump())).ok());
    auto publisher = kube::ConnectResourceSlicePublisher(kubeconfig_, dir_.path() / "no-sa",
                                                         {.driver = options_.driver_name, .node_name = kNode});
    ASSERT_TRUE(publisher.ok()) << publisher.status();
    publisher_ = *std::move(publisher);
    std::vector<kube::SliceDevice> devices;
    for (const std::string& bdf : published) devices.push_back({.name = dra::DeviceName(bdf)});
    ASSERT_TRUE(publisher_->Publish(devices).ok());
  }

  DraValidation Dra() {
    DraValidation dra{.driver = options_};
    if (api_) {
      auto reader = kube::ConnectDraObjectsReader({.kubeconfig = kubeconfig_});
      EXPECT_TRUE(reader.ok()) << reader.status();
      if (reader.ok()) {
        dra.slices = ApiListRead{(*reader)->SlicesRequest(kNode), (*reader)->NodeSlices(kNode, kDraWait)};
        dra.classes = ApiListRead{(*reader)->ClassesRequest(), (*reader)->DeviceClasses(kDraWait)};
      }
    }
    return dra;
  }

  // The devices layer and the DRA kubelet layer of this node, as `validate --kubelet-api dra` runs them.
  std::vector<Check> NodeChecks(bool bind_on_prepare,
                                const std::set<Layer>& layers = {Layer::kDevices, Layer::kKubelet}) {
    auto inventory = pci::Scan(tree_.root(), {.detail_vendor = 0x10de});
    EXPECT_TRUE(inventory.ok()) << inventory.status();
    const pci::Selection selection = pci::Select(*inventory, {});
    NodeView node{.paths = options_.paths, .inventory = &*inventory, .selection = &selection, .served = nullptr};
    DraValidation dra = Dra();
    dra.driver.bind_on_prepare = bind_on_prepare;
    const absl::StatusOr<dra::CheckpointRead> checkpoint = dra::ReadCheckpoint(dra.driver);
    if (bind_on_prepare) node.bind_on_prepare = &checkpoint;
    std::vector<Check> checks;
    if (layers.contains(Layer::kDevices)) checks = DeviceChecks(node);
    if (layers.contains(Layer::kKubelet)) {
      const names::NameResolver names(nullptr, "nvidia.com", {});
      for (Check& check : DraSliceChecks(ExpectedDraDevices(node, dra, names, nullptr), dra)) {
        checks.push_back(std::move(check));
      }
    }
    return checks;
  }
  std::vector<Check> SliceChecks() { return NodeChecks(/*bind_on_prepare=*/false, {Layer::kKubelet}); }

  // dra.slices of this node as a vm-vgpu node (the vGPUs the driver serves), with the slices holding `published`.
  Check VgpuSlices(const std::vector<std::string>& published) {
    auto inventory = pci::Scan(tree_.root(), {.detail_vendor = 0x10de});
    EXPECT_TRUE(inventory.ok()) << inventory.status();
    const pci::Selection selection = pci::Select(*inventory, {});
    const vgpu::Discovery discovery = DiscoverVgpusReadOnly(tree_.root(), *inventory, dir_.path() / "vgpu-catalog.txt");
    const VgpuView view{.discovery = &discovery};
    const NodeView node{.paths = options_.paths, .inventory = &*inventory, .selection = &selection,
                        .served = nullptr, .workload = Workload::kVmVgpu, .vgpu = &view};
    std::vector<kube::SliceDevice> devices(published.size());
    for (size_t i = 0; i < published.size(); ++i) devices[i].name = published[i];
    EXPECT_TRUE(publisher_->Publish(devices).ok());
    const DraValidation dra = Dra();
    const names::NameResolver names(nullptr, "nvidia.com", {});
    const std::vector<Check> checks = DraSliceChecks(ExpectedDraDevices(node, dra, names, nullptr), dra);
    const Check* slices = FindDraCheck(checks, "dra.slices");
    return slices != nullptr ? *slices : Check{};
  }

  // `vfio-gpu-agent validate --json <args>` on this node: its exit code and report.
  std::pair<int, Json> RunValidate(const std::string& args) {
    const std::string command = absl::StrCat("env -u KUBERNETES_SERVICE_HOST ", VA_AGENT_BIN, " validate --sysfs-root ",
                                             tree_.root().string(), " --json ", args, " --log-level error 2>/dev/null");
    FILE* pipe = ::popen(command.c_str(), "r");
    EXPECT_NE(pipe, nullptr) << command;
    if (pipe == nullptr) return {-1, Json()};
    std::string out;
    char buffer[4096];
    for (size_t n = 0; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) out.append(buffer, n);
    const int status = ::pclose(pipe);
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, Json::parse(out, nullptr, /*allow_exceptions=*/false)};
  }

  vfio_agent::testing::TempDir dir_{"va-dra-validate"};
  vfio_agent::testing::SysfsTree tree_{dir_.path() / "sys"};
  dra::DriverOptions options_;
  std::unique_ptr<KubeletDraSim> kubelet_;
  std::unique_ptr<dra::Driver> driver_;
  std::unique_ptr<sim::KubeApiSim> api_;
  std::unique_ptr<kube::ResourceSlicePublisher> publisher_;
  std::filesystem::path kubeconfig_;
};

TEST_F(ClusterDraTest, ARegisteredDriverAcceptedByTheKubeletPasses) {
  StartDriver();
  const std::vector<Check> checks = DraDriverChecks(Dra(), kDraWait);
  for (const char* id : {"dra.registration", "dra.kubelet_accepted", "dra.cdi_dir"}) {
    const Check* check = FindDraCheck(checks, id);
    ASSERT_NE(check, nullptr) << id;
    EXPECT_EQ(check->result, Result::kPass) << id << ": " << check->message << "\n" << DraEvidence(*check);
  }
  EXPECT_THAT(DraEvidence(*FindDraCheck(checks, "dra.registration")), HasSubstr("endpoint " + dra::DraSocket(options_).string()));
  // The record is the driver's, written when the kubelet notified it.
  auto record = dra::ReadRegistrationRecord(dra::RegistrationRecordPath(options_));
  ASSERT_TRUE(record.ok()) << record.status();
  EXPECT_TRUE(record->registered);
}

TEST_F(ClusterDraTest, NoDriverFailsWithTheFix) {
  std::filesystem::remove_all(options_.cdi_dir);
  const std::vector<Check> checks = DraDriverChecks(Dra(), kDraWait);
  const Check* registration = FindDraCheck(checks, "dra.registration");
  ASSERT_NE(registration, nullptr);
  EXPECT_EQ(registration->result, Result::kFail);
  EXPECT_THAT(registration->fix, HasSubstr("--kubelet-api dra"));
  EXPECT_EQ(FindDraCheck(checks, "dra.kubelet_accepted")->result, Result::kWarn);
  const Check* cdi = FindDraCheck(checks, "dra.cdi_dir");
  EXPECT_EQ(cdi->result, Result::kFail);
  EXPECT_THAT(cdi->fix, HasSubstr("enable_cdi"));
}

TEST_F(ClusterDraTest, AnotherDriversSocketUnderOurNameFails) {
  dra::DriverOptions other = options_;
  other.plugins_dir = dir_.path() / "elsewhere";
  dra::Driver driver(other);  // same name, so the same registration socket, but another endpoint
  ASSERT_TRUE(driver.Start().ok());
  const std::vector<Check> checks = DraDriverChecks(Dra(), kDraWait);
  const Check* registration = FindDraCheck(checks, "dra.registration");
  ASSERT_NE(registration, nullptr);
  EXPECT_EQ(registration->result, Result::kFail);
  EXPECT_THAT(registration->message, HasSubstr("endpoint is not " + dra::DraSocket(options_).string()));
}

TEST_F(ClusterDraTest, AKubeletThatRefusedTheDriverFailsWithItsError) {
  StartDriver({"v9.DRAPlugin"});  // a kubelet that speaks none of the driver's services refuses it
  const std::vector<Check> checks = DraDriverChecks(Dra(), kDraWait);
  const Check* accepted = FindDraCheck(checks, "dra.kubelet_accepted");
  ASSERT_NE(accepted, nullptr);
  EXPECT_EQ(accepted->result, Result::kFail);
  EXPECT_THAT(accepted->message, HasSubstr("refused"));
  EXPECT_FALSE(driver_->Registration().error.empty());
  EXPECT_THAT(accepted->message, HasSubstr(driver_->Registration().error));
}

TEST_F(ClusterDraTest, SlicesMatchingTheSelectedGpusAndAClassPass) {
  StartApi(kGpus, ClassesFor(options_.driver_name));
  if (!api_) return;
  const std::vector<Check> checks = SliceChecks();
  for (const char* id : {"dra.slices", "dra.device_class"}) {
    const Check* check = FindDraCheck(checks, id);
    ASSERT_NE(check, nullptr) << id;
    EXPECT_EQ(check->result, Result::kPass) << id << ": " << check->message << "\n" << DraEvidence(*check);
  }
  EXPECT_THAT(DraEvidence(*FindDraCheck(checks, "dra.slices")), HasSubstr("fieldSelector=spec.nodeName%3Dnode-a"));
}

TEST_F(ClusterDraTest, AGpuMissingFromTheSlicesAndNoClassFail) {
  StartApi({kGpus[0]}, ClassesFor("gpu.nvidia.com"));  // another driver's class selects nothing of ours
  if (!api_) return;
  const std::vector<Check> checks = SliceChecks();
  const Check* slices = FindDraCheck(checks, "dra.slices");
  ASSERT_NE(slices, nullptr);
  EXPECT_EQ(slices->result, Result::kFail);
  EXPECT_THAT(slices->message, HasSubstr(dra::DeviceName(kGpus[1])));
  const Check* klass = FindDraCheck(checks, "dra.device_class");
  ASSERT_NE(klass, nullptr);
  EXPECT_EQ(klass->result, Result::kFail);
  EXPECT_THAT(klass->fix, HasSubstr("kubevirt-config --format dra"));
}

TEST_F(ClusterDraTest, ASliceDeviceThatIsNoSelectedGpuFails) {
  StartApi({kGpus[0], kGpus[1], "0000:99:00.0"}, ClassesFor(options_.driver_name));
  if (!api_) return;
  const std::vector<Check> checks = SliceChecks();
  const Check* slices = FindDraCheck(checks, "dra.slices");
  ASSERT_NE(slices, nullptr);
  EXPECT_EQ(slices->result, Result::kFail);
  EXPECT_THAT(slices->message, HasSubstr(dra::DeviceName("0000:99:00.0")));
}

TEST_F(ClusterDraTest, AnUnreadableListFailsAndNoClusterSkips) {
  StartApi(kGpus, ClassesFor(options_.driver_name));
  if (!api_) return;
  ASSERT_TRUE(api_->Control("deny list deviceclasses.resource.k8s.io").ok());
  const std::vector<Check> checks = SliceChecks();
  const Check* klass = FindDraCheck(checks, "dra.device_class");
  ASSERT_NE(klass, nullptr);
  EXPECT_EQ(klass->result, Result::kFail);
  EXPECT_THAT(klass->fix, HasSubstr("403"));

  api_.reset();
  for (const Check& check : SliceChecks()) EXPECT_EQ(check.result, Result::kSkip) << check.id;
}

// "<id>/<subject>" -> "PASS", ... of a JSON report.
std::map<std::string, std::string> Results(const Json& report) {
  std::map<std::string, std::string> results;
  if (!report.is_object() || !report.contains("checks")) return results;
  for (const Json& check : report["checks"]) {
    results[check["id"].get<std::string>() + "/" + check["subject"].get<std::string>()] = check["result"];
  }
  return results;
}

std::string Cr(const Json& developer_configuration) {
  Json cr = Json::object();
  cr["apiVersion"] = "kubevirt.io/v1";
  cr["kind"] = "KubeVirt";
  cr["metadata"] = {{"name", "kubevirt"}, {"namespace", "kubevirt"}};
  cr["spec"]["configuration"]["developerConfiguration"] = developer_configuration;
  return cr.dump();
}

TEST(DraKubevirtGatesTest, ADisabledGateFailsAndBetaDefaultsPass) {
  const std::vector<Check> off =
      DraKubevirtChecks(Cr({{"featureGates", {"GPU"}}, {"disabledFeatureGates", {"GPUsWithDRA"}}}));
  ASSERT_EQ(off.size(), 2u);
  EXPECT_EQ(FindDraCheck(off, "dra.kubevirt_gate", "GPUsWithDRA")->result, Result::kFail);
  EXPECT_THAT(FindDraCheck(off, "dra.kubevirt_gate", "GPUsWithDRA")->fix, HasSubstr("disabledFeatureGates"));
  EXPECT_EQ(FindDraCheck(off, "dra.kubevirt_gate", "HostDevicesWithDRA")->result, Result::kPass);

  for (const Check& check : DraKubevirtChecks(Cr(Json::object()))) EXPECT_EQ(check.result, Result::kPass);
  for (const Check& check : DraKubevirtChecks(std::nullopt)) EXPECT_EQ(check.result, Result::kSkip);
}

// The command: --kubelet-api dra puts the DRA checks in place of the device plugin's.
TEST_F(ClusterDraTest, ValidateKubeletApiDraRunsTheDraChecks) {
  StartDriver();
  const std::filesystem::path cr = dir_.path() / "kubevirt.json";
  std::ofstream(cr) << Cr(Json::object());
  const Json report = RunValidate(absl::StrCat(
      "--layers plugin,kubelet,kubevirt --kubelet-api dra --kubelet-registry-dir ", options_.registry_dir.string(),
      " --kubelet-plugins-dir ", options_.plugins_dir.string(), " --cdi-dir ", options_.cdi_dir.string(),
      " --kubevirt-cr ", cr.string())).second;
  const std::string out = report.dump();
  ASSERT_TRUE(report.is_object()) << out;
  std::map<std::string, std::string> results = Results(report);
  const std::string driver = options_.driver_name;
  EXPECT_EQ(results["dra.registration/" + driver], "PASS") << out;
  EXPECT_EQ(results["dra.kubelet_accepted/" + driver], "PASS") << out;
  EXPECT_EQ(results["dra.cdi_dir/" + options_.cdi_dir.string()], "PASS") << out;
  EXPECT_EQ(results["dra.slices/node"], "SKIP") << out;  // no cluster
  EXPECT_EQ(results["dra.kubevirt_gate/GPUsWithDRA"], "PASS") << out;
  for (const auto& [id, result] : results) EXPECT_THAT(id, ::testing::Not(HasSubstr("plugin."))) << id;
}

// --bind-on-prepare: GPUs on their host driver are where they belong until a claim's Prepare binds them, and the
// driver publishes them healthy (untainted). Without the flag the same node fails: validate must be told.
TEST_F(ClusterDraTest, BindOnPrepareGpusOnTheirHostDriverPassAndMatchTheirSlices) {
  GpusOnNvidia();
  StartApi(kGpus, ClassesFor(options_.driver_name));
  if (!api_) return;
  const std::vector<Check> checks = NodeChecks(/*bind_on_prepare=*/true);
  for (const std::string& bdf : kGpus) {
    const Check* driver = FindDraCheck(checks, "device.driver", bdf);
    ASSERT_NE(driver, nullptr) << bdf;
    EXPECT_EQ(driver->result, Result::kPass) << driver->message;
    EXPECT_THAT(driver->message, HasSubstr("on nvidia until a claim's Prepare binds"));
  }
  for (const char* group : {"group 11", "group 12"}) {
    EXPECT_EQ(FindDraCheck(checks, "group.viable", group)->result, Result::kPass) << group;
  }
  EXPECT_EQ(FindDraCheck(checks, "device.claims")->result, Result::kPass);
  const Check* slices = FindDraCheck(checks, "dra.slices");
  ASSERT_NE(slices, nullptr);
  EXPECT_EQ(slices->result, Result::kPass) << slices->message << "\n" << DraEvidence(*slices);

  const std::vector<Check> without = NodeChecks(/*bind_on_prepare=*/false);
  EXPECT_EQ(FindDraCheck(without, "device.driver", kGpus[0])->result, Result::kFail);
  EXPECT_EQ(FindDraCheck(without, "device.claims"), nullptr);
  // The agent published them healthy, which only --bind-on-prepare does for a GPU on nvidia.
  const Check* health = FindDraCheck(without, "dra.slices");
  EXPECT_EQ(health->result, Result::kWarn) << health->message;
  EXPECT_THAT(health->message, HasSubstr(dra::DeviceName(kGpus[0]) + " untainted, unhealthy here (driver nvidia)"));
  EXPECT_THAT(health->fix, HasSubstr("--bind-on-prepare (validate had it off)"));
}

// validate keeps to the driver's taint rule: a GPU unhealthy here carries its failure kind's key. The one key the
// driver once used for every failure ("<driver>/unhealthy") is another health; a None warning blocks nothing.
TEST_F(ClusterDraTest, ASliceTaintOfAnotherKindThanTheReasonHereWarnsAndTheKindsKeyPasses) {
  GpusOnNvidia();
  StartApi(kGpus, ClassesFor(options_.driver_name));
  if (!api_) return;
  auto publish = [&](const std::string& kind, const std::string& effect) {
    std::vector<kube::SliceDevice> devices;
    for (const std::string& bdf : kGpus) {
      devices.push_back({.name = dra::DeviceName(bdf),
                         .taints = {{.key = options_.driver_name + "/" + kind, .value = "nvidia", .effect = effect}}});
    }
    ASSERT_TRUE(publisher_->Publish(devices).ok());
  };
  publish("unhealthy", "NoSchedule");
  std::vector<Check> checks = SliceChecks();
  const Check* health = FindDraCheck(checks, "dra.slices");
  ASSERT_NE(health, nullptr);
  EXPECT_EQ(health->result, Result::kWarn) << health->message;
  EXPECT_THAT(health->message, HasSubstr(absl::StrCat(dra::DeviceName(kGpus[0]), " tainted ", options_.driver_name,
                                                      "/unhealthy, unhealthy here as ", options_.driver_name,
                                                      "/not-vfio (driver nvidia)")));
  publish("not-vfio", "None");  // a warning only: the GPU is still offered
  checks = SliceChecks();
  EXPECT_THAT(FindDraCheck(checks, "dra.slices")->message, HasSubstr("untainted, unhealthy here (driver nvidia)"));
  publish("not-vfio", "NoSchedule");
  checks = SliceChecks();
  EXPECT_EQ(FindDraCheck(checks, "dra.slices")->result, Result::kPass) << FindDraCheck(checks, "dra.slices")->message;
}

// What would make a Prepare's bind fail now is said before a VM asks: a process holding nvidia. A GPU that nvidia's
// runtime power management parked in D3cold is fine (the bind wakes it), as the driver judges it.
TEST_F(ClusterDraTest, BindOnPrepareAHolderOfNvidiaWarnsAndD3coldOnTheHostDriverPasses) {
  GpusOnNvidia();
  tree_.WriteAttribute(kGpus[1], "power_state", "D3cold");
  std::filesystem::create_directories(options_.paths.dev_root);
  std::ofstream(options_.paths.dev_root / "nvidia0");
  options_.paths.proc_root = "/proc";  // the holder is this test's own child
  const vfio_agent::testing::HoldingProcess holder(options_.paths.dev_root / "nvidia0");
  std::vector<Check> checks = NodeChecks(/*bind_on_prepare=*/true, {Layer::kDevices});
  const Check* driver = FindDraCheck(checks, "device.driver", kGpus[0]);
  ASSERT_NE(driver, nullptr);
  EXPECT_EQ(driver->result, Result::kWarn) << driver->message;
  EXPECT_THAT(driver->message, HasSubstr(absl::StrCat("pid ", holder.pid())));
  EXPECT_THAT(driver->message, HasSubstr("a claim's Prepare would fail"));
  EXPECT_THAT(driver->fix, HasSubstr("vfio-gpu-agent bind --device " + kGpus[0]));
  EXPECT_EQ(FindDraCheck(checks, "device.power_state", kGpus[1])->result, Result::kPass);

  checks = NodeChecks(/*bind_on_prepare=*/false, {Layer::kDevices});
  EXPECT_EQ(FindDraCheck(checks, "device.power_state", kGpus[1])->result, Result::kWarn);
}

// A prepared claim's groups belong on vfio-pci: its GPU back on nvidia fails, naming the claim; a checkpoint of
// another boot holds nothing (the agent discards it).
TEST_F(ClusterDraTest, BindOnPrepareAClaimedGpuOffVfioFailsNamingTheClaim) {
  GpusOnNvidia();
  WriteCheckpoint("uid-1", {kGpus[0]});
  WriteCheckpoint("uid-0", {kGpus[1]}, "boot-0");
  std::vector<Check> checks = NodeChecks(/*bind_on_prepare=*/true, {Layer::kDevices});
  const Check* claimed = FindDraCheck(checks, "device.driver", kGpus[0]);
  ASSERT_NE(claimed, nullptr);
  EXPECT_EQ(claimed->result, Result::kFail);
  EXPECT_THAT(claimed->message, HasSubstr("on nvidia though prepared claim vms/claim-uid-1 (uid-1) holds it"));
  EXPECT_THAT(claimed->fix, HasSubstr("vfio-gpu-agent bind --device " + kGpus[0]));
  EXPECT_EQ(FindDraCheck(checks, "device.driver", kGpus[1])->result, Result::kPass);
  const Check* claims = FindDraCheck(checks, "device.claims");
  EXPECT_EQ(claims->result, Result::kPass);
  EXPECT_THAT(DraEvidence(*claims), HasSubstr("vms/claim-uid-1 (uid-1): " + kGpus[0]));
  EXPECT_THAT(DraEvidence(*claims), HasSubstr("uid-0.json"));

  tree_.BindDriver(kGpus[0], "vfio-pci");
  checks = NodeChecks(/*bind_on_prepare=*/true, {Layer::kDevices});
  claimed = FindDraCheck(checks, "device.driver", kGpus[0]);
  EXPECT_EQ(claimed->result, Result::kPass) << claimed->message;
  EXPECT_THAT(claimed->message, HasSubstr("for claim vms/claim-uid-1 (uid-1)"));
}

// The group rule stays: a foreign endpoint blocks a later bind; a companion on its host driver is moved by the
// Prepare with its GPU, unless a claim holds the group already (then it should be on vfio-pci).
TEST_F(ClusterDraTest, BindOnPrepareAForeignEndpointFailsAndACompanionOnItsHostDriverWaitsForThePrepare) {
  GpusOnNvidia();
  tree_.AddDevice({.bdf = "0000:18:00.1", .device = 0x22a3, .class_code = 0x040300, .driver = "snd_hda_intel",
                   .iommu_group = 11});
  tree_.AddDevice({.bdf = "0000:2a:00.1", .vendor = 0x8086, .device = 0x1533, .class_code = 0x020000,
                   .driver = "igb", .iommu_group = 12});
  std::vector<Check> checks = NodeChecks(/*bind_on_prepare=*/true, {Layer::kDevices});
  const Check* companion = FindDraCheck(checks, "group.viable", "group 11");
  ASSERT_NE(companion, nullptr);
  EXPECT_EQ(companion->result, Result::kPass) << companion->message;
  EXPECT_THAT(companion->message, HasSubstr("until a claim's Prepare binds the group"));
  const Check* foreign = FindDraCheck(checks, "group.viable", "group 12");
  ASSERT_NE(foreign, nullptr);
  EXPECT_EQ(foreign->result, Result::kFail);
  EXPECT_THAT(foreign->message, HasSubstr("0000:2a:00.1"));
  EXPECT_THAT(foreign->message, HasSubstr("a claim's Prepare refuses its GPUs"));

  WriteCheckpoint("uid-1", {kGpus[0]});
  checks = NodeChecks(/*bind_on_prepare=*/true, {Layer::kDevices});
  EXPECT_EQ(FindDraCheck(checks, "group.viable", "group 11")->result, Result::kFail);
}

// The command: --bind-on-prepare reaches the devices layer and the slices check; without DRA it is refused.
TEST_F(ClusterDraTest, ValidateBindOnPrepareJudgesGpusOnTheirHostDriverAsTheAgentDoes) {
  GpusOnNvidia();
  const std::string args = absl::StrCat("--layers devices --kubelet-api dra --kubelet-plugins-dir ",
                                        options_.plugins_dir.string(), " --proc-root ", options_.paths.proc_root.string(),
                                        " --dev-root ", options_.paths.dev_root.string());
  auto [code, report] = RunValidate(args + " --bind-on-prepare");
  EXPECT_EQ(code, 0) << report.dump();
  EXPECT_EQ(Results(report)["device.driver/" + kGpus[0]], "PASS") << report.dump();
  EXPECT_EQ(Results(report)["device.claims/node"], "PASS") << report.dump();
  std::tie(code, report) = RunValidate(args);
  EXPECT_EQ(code, 1);
  EXPECT_EQ(Results(report)["device.driver/" + kGpus[0]], "FAIL") << report.dump();
  EXPECT_EQ(RunValidate("--layers devices --bind-on-prepare").first, 2);
}

// A vGPU node: the slices hold one device per vGPU the driver serves (mdev-<uuid>), never the whole GPUs.
TEST_F(ClusterDraTest, VgpuSlicesAreComparedWithTheVgpusTheDriverServes) {
  constexpr char kT4[] = "0000:3b:00.0";
  const std::string uuid_a = "0b2b2d5e-7c1a-4c8e-9f0a-1d2e3f4a5b01";
  const std::string uuid_b = "0b2b2d5e-7c1a-4c8e-9f0a-1d2e3f4a5b02";
  const std::string stale = dra::MdevDeviceName("0b2b2d5e-7c1a-4c8e-9f0a-1d2e3f4a5b09");
  tree_.AddDevice({.bdf = kT4, .device = 0x1eb8, .driver = "nvidia", .iommu_group = 30});
  tree_.AddMdevParent(kT4, {{.id = "nvidia-222", .name = "GRID T4-1Q", .available_instances = 14}});
  tree_.AddMdev({.uuid = uuid_a, .parent = kT4, .type_id = "nvidia-222", .iommu_group = 100});
  tree_.AddMdev({.uuid = uuid_b, .parent = kT4, .type_id = "nvidia-222", .iommu_group = 101});
  for (int group : {100, 101}) std::ofstream(options_.paths.VfioDir() / std::to_string(group));
  StartApi({}, ClassesFor(options_.driver_name));
  if (!api_) return;

  Check slices = VgpuSlices({dra::MdevDeviceName(uuid_a), dra::MdevDeviceName(uuid_b)});
  EXPECT_EQ(slices.result, Result::kPass) << slices.message << "\n" << DraEvidence(slices);
  EXPECT_THAT(slices.message, HasSubstr("2 vGPU(s)"));

  slices = VgpuSlices({dra::MdevDeviceName(uuid_a), stale});
  EXPECT_EQ(slices.result, Result::kFail);
  EXPECT_THAT(slices.message, HasSubstr("not published: " + dra::MdevDeviceName(uuid_b)));

  slices = VgpuSlices({dra::MdevDeviceName(uuid_a), dra::MdevDeviceName(uuid_b), stale});
  EXPECT_EQ(slices.result, Result::kFail);
  EXPECT_THAT(slices.message, HasSubstr("published but not a vGPU the driver serves here: " + stale));

  // An agent serving whole GPUs on this node.
  slices = VgpuSlices({dra::DeviceName(kT4)});
  EXPECT_EQ(slices.result, Result::kFail);
  EXPECT_THAT(slices.message, HasSubstr("published whole GPUs (" + dra::DeviceName(kT4) + ") instead of"));
  EXPECT_THAT(slices.message, HasSubstr(dra::MdevDeviceName(uuid_a)));
  EXPECT_THAT(slices.fix, HasSubstr("--workload vm-vgpu"));
}

// SR-IOV vGPUs: a VF with a vGPU type is vgpu-<VF address>; a VF without one is not served, so not expected.
TEST_F(ClusterDraTest, SriovVgpuSlicesAreNamedFromTheirVfs) {
  constexpr char kL40s[] = "0000:5e:00.0";
  constexpr char kTyped[] = "0000:5e:00.4";
  constexpr char kUntyped[] = "0000:5e:00.5";
  const std::vector<vfio_agent::testing::FakeVgpuType> types = {{.id = 1157, .name = "NVIDIA L40S-4Q"}};
  tree_.AddDevice({.bdf = kL40s, .device = 0x26b9, .driver = "nvidia", .iommu_group = 40});
  tree_.SetVgpuCatalog(kL40s, types);
  for (const auto& [vf, group] : {std::pair{kTyped, 41}, std::pair{kUntyped, 42}}) {
    tree_.AddDevice({.bdf = vf, .device = 0x26b9, .driver = "nvidia", .iommu_group = group, .physfn = kL40s});
    tree_.SetVgpuCatalog(vf, types);
    std::ofstream(options_.paths.VfioDir() / std::to_string(group));
  }
  tree_.SetCurrentVgpuType(kTyped, 1157);
  tree_.SetCurrentVgpuType(kUntyped, 0);
  StartApi({}, ClassesFor(options_.driver_name));
  if (!api_) return;

  Check slices = VgpuSlices({dra::VfDeviceName(kTyped)});
  EXPECT_EQ(slices.result, Result::kPass) << slices.message << "\n" << DraEvidence(slices);

  slices = VgpuSlices({dra::VfDeviceName(kTyped), dra::VfDeviceName(kUntyped)});
  EXPECT_EQ(slices.result, Result::kFail);
  EXPECT_THAT(slices.message, HasSubstr("published but not a vGPU the driver serves here: vgpu-0000-5e-00-5"));

  slices = VgpuSlices({});
  EXPECT_EQ(slices.result, Result::kFail);
  EXPECT_THAT(slices.message, HasSubstr("not published: vgpu-0000-5e-00-4"));
}

}  // namespace
}  // namespace vfio_agent::validation
