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
#include "support/sysfs_tree.h"
#include "support/wait.h"
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
    std::filesystem::create_directories(options_.cdi_dir);
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
    std::vector<kube::SliceDevice> devices;
    for (const std::string& bdf : published) devices.push_back({.name = dra::DeviceName(bdf)});
    ASSERT_TRUE((*publisher)->Publish(devices).ok());
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

  std::vector<Check> SliceChecks() {
    auto inventory = pci::Scan(tree_.root(), {.detail_vendor = 0x10de});
    EXPECT_TRUE(inventory.ok()) << inventory.status();
    const pci::Selection selection = pci::Select(*inventory, {});
    const NodeView node{.paths = {}, .inventory = &*inventory, .selection = &selection, .expected = nullptr};
    return DraSliceChecks(node, Dra());
  }

  vfio_agent::testing::TempDir dir_{"va-dra-validate"};
  vfio_agent::testing::SysfsTree tree_{dir_.path() / "sys"};
  dra::DriverOptions options_;
  std::unique_ptr<KubeletDraSim> kubelet_;
  std::unique_ptr<dra::Driver> driver_;
  std::unique_ptr<sim::KubeApiSim> api_;
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
  const std::string command = absl::StrCat(
      "env -u KUBERNETES_SERVICE_HOST ", VA_AGENT_BIN, " validate --sysfs-root ", tree_.root().string(),
      " --json --layers plugin,kubelet,kubevirt --kubelet-api dra --kubelet-registry-dir ",
      options_.registry_dir.string(), " --kubelet-plugins-dir ", options_.plugins_dir.string(), " --cdi-dir ",
      options_.cdi_dir.string(), " --kubevirt-cr ", cr.string(), " --log-level error 2>/dev/null");
  FILE* pipe = ::popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buffer[4096];
  for (size_t n = 0; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) out.append(buffer, n);
  ::pclose(pipe);
  const Json report = Json::parse(out, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(report.is_object()) << out;
  std::map<std::string, std::string> results;
  for (const Json& check : report["checks"]) {
    results[check["id"].get<std::string>() + "/" + check["subject"].get<std::string>()] = check["result"];
  }
  const std::string driver = options_.driver_name;
  EXPECT_EQ(results["dra.registration/" + driver], "PASS") << out;
  EXPECT_EQ(results["dra.kubelet_accepted/" + driver], "PASS") << out;
  EXPECT_EQ(results["dra.cdi_dir/" + options_.cdi_dir.string()], "PASS") << out;
  EXPECT_EQ(results["dra.slices/node"], "SKIP") << out;  // no cluster
  EXPECT_EQ(results["dra.kubevirt_gate/GPUsWithDRA"], "PASS") << out;
  for (const auto& [id, result] : results) EXPECT_THAT(id, ::testing::Not(HasSubstr("plugin."))) << id;
}

}  // namespace
}  // namespace vfio_agent::validation
