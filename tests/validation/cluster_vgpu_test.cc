// vm-vgpu nodes (issue 19): the vgpu layer, the vGPU status files, and the plugin, kubelet and KubeVirt layers
// against the vGPUs, on the simulated T4/A10 mdev node and L40S/H200 SR-IOV node under sysfs-sim.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <yaml-cpp/yaml.h>

#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

#include "validation/cluster_node.h"
#include "vfio_gpu_agent/cli/commands.h"
#include "vfio_gpu_agent/common/fs.h"
#include "vfio_gpu_agent/validation/validate.h"

namespace vfio_agent::validation {
namespace {

using ::testing::HasSubstr;
using testing::ClusterNode;
using testing::FindCheck;

constexpr char kT4[] = "0000:3b:00.0";
constexpr char kA10[] = "0000:86:00.0";
constexpr char kL40s[] = "0000:3b:00.0";
constexpr char kH200a[] = "0000:86:00.0";
constexpr char kH200b[] = "0000:af:00.0";
constexpr char kL40s4Q[] = "nvidia.com/NVIDIA_L40S-4Q";
constexpr char kT41Q[] = "nvidia.com/GRID_T4-1Q";
constexpr char kUuid1[] = "0b2b2d5e-7c1a-4c8e-9f0a-1d2e3f4a5b01";
constexpr char kUuid2[] = "0b2b2d5e-7c1a-4c8e-9f0a-1d2e3f4a5b02";

std::vector<Check> ChecksOf(const report::v1::ValidateReport& report) {
  std::vector<Check> out;
  for (const auto& c : report.checks()) {
    Check check{.id = c.id(), .layer = Layer::kPlatform, .subject = c.subject(),
                .result = static_cast<Result>(c.result() - 1), .message = c.message(), .fix = c.fix()};
    for (const auto& e : c.evidence()) check.evidence.push_back({e.source(), e.value()});
    out.push_back(std::move(check));
  }
  return out;
}

class VgpuValidateTest : public ::testing::Test {
 protected:
  void Start(const std::string& node_file) {
    auto node = ClusterNode::Create(node_file);
    ASSERT_TRUE(node.ok()) << node.status();
    node_ = *std::move(node);
  }
  ValidateOptions Options(std::set<Layer> layers) {
    ValidateOptions options;
    options.paths = node_->paths;
    options.workload = Workload::kVmVgpu;
    options.layers = std::move(layers);
    options.vgpu_catalog_file = dir_.path() / "state/vgpu-catalog.txt";
    options.rpc_wait = testing::kWait;
    return options;
  }
  std::vector<Check> Run(const ValidateOptions& options) {
    auto report = Validate(options);
    EXPECT_TRUE(report.ok()) << report.status();
    report_ = report.ok() ? *report : report::v1::ValidateReport();
    return ChecksOf(report_);
  }
  // The VFs of `pf` after enabling `count` of them.
  std::vector<std::string> EnableVfs(const std::string& pf, int count) {
    EXPECT_TRUE(Write(node_->paths.PciDevice(pf) / "sriov_numvfs", std::to_string(count)));
    std::vector<std::string> vfs;
    auto inventory = pci::Scan(node_->paths.sysfs_root, {.detail_vendor = pci::kVendorNvidia});
    for (const pci::Function& fn : inventory->functions()) {
      if (fn.physfn == pf) vfs.push_back(fn.bdf);
    }
    EXPECT_EQ(vfs.size(), static_cast<size_t>(count));
    return vfs;
  }
  // A write to a kernel attribute of the simulated node, as the vGPU manager's tools make them.
  static bool Write(const std::filesystem::path& attribute, const std::string& value) {
    const absl::Status status = fs::WriteAttribute(attribute, value);
    EXPECT_TRUE(status.ok()) << status;
    return status.ok();
  }
  bool SetVgpuType(const std::string& vf, const std::string& id) {
    return Write(node_->paths.PciDevice(vf) / "nvidia/current_vgpu_type", id);
  }
  bool CreateMdev(const std::string& parent, const std::string& type, const std::string& uuid) {
    return Write(node_->paths.PciDevice(parent) / "mdev_supported_types" / type / "create", uuid);
  }
  std::filesystem::path WriteFile(const std::string& name, const std::string& text) {
    const std::filesystem::path path = dir_.path() / name;
    std::ofstream(path) << text;
    return path;
  }
  std::string Kubevirt(const std::string& permitted) {
    return "apiVersion: kubevirt.io/v1\nkind: KubeVirt\nmetadata:\n  name: kubevirt\n  namespace: kubevirt\nspec:\n"
           "  configuration:\n    developerConfiguration:\n      featureGates: [GPU, HostDevices]\n"
           "    permittedHostDevices:\n" + permitted;
  }

  // `kubevirt-config --workload vm-vgpu` on this node: exit code and stdout.
  std::pair<int, std::string> KubevirtConfig(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"--workload", "vm-vgpu", "--sysfs-root", node_->paths.sysfs_root.string(),
                                     "--state-dir", (dir_.path() / "state").string()};
    args.insert(args.end(), extra.begin(), extra.end());
    std::ostringstream out;
    const int code = cli::RunKubevirtConfig(args, out);
    return {code, out.str()};
  }
  // The patch's permittedHostDevices in a KubeVirt CR with the gates on, as `kubectl patch` leaves it.
  static std::string Patched(const std::string& patch) {
    return "apiVersion: kubevirt.io/v1\nkind: KubeVirt\nmetadata:\n  name: kubevirt\n  namespace: kubevirt\n" +
           absl::StrReplaceAll(patch, {{"  configuration:\n", "  configuration:\n    developerConfiguration:\n"
                                                          "      featureGates: [GPU, HostDevices]\n"}});
  }

  // The KubeVirt layer against a CR with `patch` applied.
  std::vector<Check> ValidateKubevirt(const std::string& patch) {
    ValidateOptions options = Options({Layer::kKubevirt});
    options.kubevirt_cr = Patched(patch);
    return Run(options);
  }

  vfio_agent::testing::TempDir dir_{"va-vgpu-validate"};
  std::unique_ptr<ClusterNode> node_;
  report::v1::ValidateReport report_;
};

TEST_F(VgpuValidateTest, SriovCardsWithoutVfsAreNotReadyAndGetNoReadyFiles) {
  Start("vgpu-sriov-l40s-h200.json");
  const std::filesystem::path status = dir_.path() / "validations";
  std::filesystem::create_directories(status);
  std::ofstream(status / "vfio-pci-ready");  // left from vm-passthrough
  ValidateOptions options = Options({Layer::kPlatform, Layer::kDevices, Layer::kVgpu});
  options.status_dir = status;
  const std::vector<Check> checks = Run(options);

  EXPECT_EQ(FindCheck(checks, "device.driver")->result, Result::kSkip);
  EXPECT_EQ(FindCheck(checks, "vgpu.gpu_driver", kL40s)->result, Result::kPass);
  EXPECT_EQ(FindCheck(checks, "vgpu.manager")->result, Result::kPass) << FindCheck(checks, "vgpu.manager")->message;
  for (const char* pf : {kL40s, kH200a, kH200b}) {
    const Check* vfs = FindCheck(checks, "vgpu.vfs_enabled", pf);
    ASSERT_NE(vfs, nullptr) << pf;
    EXPECT_EQ(vfs->result, Result::kFail);
    EXPECT_THAT(vfs->message, HasSubstr("0 of 32 VFs enabled"));
    EXPECT_THAT(vfs->fix, HasSubstr(std::string("sriov-manage -e ") + pf));
  }
  const Check* devices = FindCheck(checks, "vgpu.devices");
  EXPECT_EQ(devices->result, Result::kFail);
  EXPECT_THAT(devices->fix, HasSubstr("--vgpu-config-file"));

  EXPECT_FALSE(report_.vgpu_manager_ready());
  EXPECT_EQ(fs::ReadTrimmed(status / "workload-type").value_or(""), "vm-vgpu");
  EXPECT_FALSE(std::filesystem::exists(status / "vgpu-manager-ready"));
  EXPECT_FALSE(std::filesystem::exists(status / "vgpu-devices-ready"));
  EXPECT_FALSE(std::filesystem::exists(status / "vfio-pci-ready"));
}

TEST_F(VgpuValidateTest, SriovProfilesAreComparedWithTheConfigAndTheReadyFilesFollow) {
  Start("vgpu-sriov-l40s-h200.json");
  const std::vector<std::string> l40s_vfs = EnableVfs(kL40s, 32);
  EnableVfs(kH200a, 32);
  EnableVfs(kH200b, 32);
  ASSERT_EQ(l40s_vfs.size(), 32u);
  ASSERT_TRUE(SetVgpuType(l40s_vfs[0], "1155"));  // NVIDIA L40S-4Q
  const std::filesystem::path config = WriteFile("vgpu.yaml", R"(version: v1
vgpu-configs:
  l40s-small:
    - devices: [0]
      vgpu-devices:
        L40S-4Q: 2
)");
  const std::filesystem::path status = dir_.path() / "validations";
  ValidateOptions options = Options({Layer::kPlatform, Layer::kVgpu});
  options.status_dir = status;
  options.vgpu_config_file = config;
  options.vgpu_config = "l40s-small";

  std::vector<Check> checks = Run(options);
  EXPECT_EQ(FindCheck(checks, "vgpu.vfs_enabled", kH200b)->result, Result::kPass);
  EXPECT_EQ(FindCheck(checks, "vgpu.devices")->result, Result::kPass);
  const Check* profiles = FindCheck(checks, "vgpu.profiles", kL40s);
  ASSERT_NE(profiles, nullptr);
  EXPECT_EQ(profiles->result, Result::kFail);
  EXPECT_THAT(profiles->message, HasSubstr("to create 1x L40S-4Q"));
  EXPECT_TRUE(report_.vgpu_manager_ready());
  EXPECT_FALSE(report_.vgpu_devices_ready());
  EXPECT_TRUE(std::filesystem::exists(status / "vgpu-manager-ready"));
  EXPECT_FALSE(std::filesystem::exists(status / "vgpu-devices-ready"));

  ASSERT_TRUE(SetVgpuType(l40s_vfs[1], "1155"));
  checks = Run(options);
  EXPECT_EQ(FindCheck(checks, "vgpu.profiles", kL40s)->result, Result::kPass)
      << FindCheck(checks, "vgpu.profiles", kL40s)->message;
  EXPECT_TRUE(std::filesystem::exists(status / "vgpu-devices-ready"));
  EXPECT_EQ(fs::ReadTrimmed(status / "vgpu-devices-ready").value_or("x"), "");

  options.vgpu_config = "no-such-config";
  checks = Run(options);
  EXPECT_EQ(FindCheck(checks, "vgpu.profiles")->result, Result::kFail);
  EXPECT_FALSE(std::filesystem::exists(status / "vgpu-devices-ready"));
}

TEST_F(VgpuValidateTest, SriovProfilesAreAdvertisedAllocatableAndPermittedAsExternalPciHostDevices) {
  Start("vgpu-sriov-l40s-h200.json");
  const std::vector<std::string> vfs = EnableVfs(kL40s, 32);
  ASSERT_EQ(vfs.size(), 32u);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(SetVgpuType(vfs[i], "1155"));
  ASSERT_TRUE(node_->StartKubelet().ok());
  ASSERT_TRUE(node_->StartAgent(Workload::kVmVgpu).ok());
  ASSERT_TRUE(node_->WaitForKubelet(kL40s4Q, 2, 2)) << node_->kubelet().DescribeNode();

  ValidateOptions options = Options({Layer::kPlugin, Layer::kKubelet, Layer::kKubevirt});
  options.kubevirt_cr = Kubevirt("      pciHostDevices:\n      - pciVendorSelector: 10DE:26B9\n"
                                 "        resourceName: nvidia.com/NVIDIA_L40S-4Q\n"
                                 "        externalResourceProvider: true\n");
  std::vector<Check> checks = Run(options);
  const Check* listed = FindCheck(checks, "plugin.devices", kL40s4Q);
  ASSERT_NE(listed, nullptr);
  EXPECT_EQ(listed->result, Result::kPass) << listed->message;
  EXPECT_EQ(FindCheck(checks, "kubelet.allocatable", kL40s4Q)->result, Result::kPass);
  EXPECT_EQ(FindCheck(checks, "kubevirt.permitted", kL40s4Q)->result, Result::kPass);
  EXPECT_EQ(FindCheck(checks, "kubevirt.feature_gate", "HostDevices")->result, Result::kPass);

  options.kubevirt_cr = Kubevirt("      pciHostDevices:\n      - pciVendorSelector: 10DE:26B9\n"
                                 "        resourceName: nvidia.com/NVIDIA_L40S-4Q\n");
  checks = Run(options);
  const Check* internal = FindCheck(checks, "kubevirt.permitted", kL40s4Q);
  EXPECT_EQ(internal->result, Result::kFail);
  EXPECT_THAT(internal->message, HasSubstr("lacks externalResourceProvider: true"));

  options.kubevirt_cr = Kubevirt("      mediatedDevices:\n      - mdevNameSelector: NVIDIA L40S-4Q\n"
                                 "        resourceName: nvidia.com/NVIDIA_L40S-4Q\n"
                                 "        externalResourceProvider: true\n");
  checks = Run(options);
  const Check* absent = FindCheck(checks, "kubevirt.permitted", kL40s4Q);
  EXPECT_EQ(absent->result, Result::kFail);
  EXPECT_THAT(absent->fix, HasSubstr("kubevirt-config --workload vm-vgpu"));
}

TEST_F(VgpuValidateTest, MdevTypesArePermittedByTheirNameSelector) {
  Start("vgpu-mdev-t4-a10.json");
  for (const char* uuid : {kUuid1, kUuid2}) {
    ASSERT_TRUE(CreateMdev(kT4, "nvidia-230", uuid));
  }
  ValidateOptions options = Options({Layer::kPlatform, Layer::kVgpu, Layer::kKubevirt});
  const std::string entry_tail = "        resourceName: nvidia.com/GRID_T4-1Q\n        externalResourceProvider: true\n";
  for (const char* selector : {"GRID T4-1Q", "GRID_T4-1Q"}) {
    options.kubevirt_cr = Kubevirt(std::string("      mediatedDevices:\n      - mdevNameSelector: ") + selector + "\n" +
                                   entry_tail);
    const std::vector<Check> checks = Run(options);
    EXPECT_EQ(FindCheck(checks, "kubevirt.permitted", kT41Q)->result, Result::kPass) << selector;
    EXPECT_EQ(FindCheck(checks, "vgpu.framework")->message, "one framework: mdev");
  }
  options.kubevirt_cr = Kubevirt("      mediatedDevices:\n      - mdevNameSelector: GRID T4-2Q\n" + entry_tail);
  std::vector<Check> checks = Run(options);
  const Check* wrong = FindCheck(checks, "kubevirt.permitted", kT41Q);
  EXPECT_EQ(wrong->result, Result::kFail);
  EXPECT_THAT(wrong->fix, HasSubstr("mdevNameSelector: \"GRID T4-1Q\""));

  // The A10 is an Ampere mdev card: its parents are VFs, so the manager is ready only once they are enabled.
  EXPECT_EQ(FindCheck(checks, "vgpu.vfs_enabled", kA10)->result, Result::kFail);
  EXPECT_FALSE(report_.vgpu_manager_ready());
  EnableVfs(kA10, 32);
  checks = Run(options);
  EXPECT_EQ(FindCheck(checks, "vgpu.vfs_enabled", kA10)->result, Result::kPass);
  EXPECT_TRUE(report_.vgpu_manager_ready());
}

TEST_F(VgpuValidateTest, AGpuLeftOnVfioPciFailsTheVgpuLayer) {
  Start("vgpu-mdev-t4-a10.json");
  ASSERT_TRUE(node_->BindToVfio({kT4}).ok());
  const std::vector<Check> checks = Run(Options({Layer::kVgpu}));
  const Check* driver = FindCheck(checks, "vgpu.gpu_driver", kT4);
  ASSERT_NE(driver, nullptr);
  EXPECT_EQ(driver->result, Result::kFail);
  EXPECT_THAT(driver->message, HasSubstr("on vfio-pci"));
  EXPECT_THAT(driver->fix, HasSubstr("drivers/nvidia/bind"));
}

TEST_F(VgpuValidateTest, APassthroughNodeSkipsTheVgpuLayer) {
  Start("vgpu-mdev-t4-a10.json");
  ValidateOptions options = Options({Layer::kVgpu});
  options.workload = Workload::kVmPassthrough;
  const std::vector<Check> checks = Run(options);
  ASSERT_EQ(checks.size(), 1u);
  EXPECT_EQ(checks[0].result, Result::kSkip);
}

constexpr char kPatchComment[] =
    "# Merge patch for a plain KubeVirt CR:\n"
    "#   kubectl patch kubevirt kubevirt -n kubevirt --type merge --patch-file <this file>\n"
    "# A merge patch replaces the whole mediatedDevices and pciHostDevices lists (each one only when listed below): "
    "add the entries the CR already has for other nodes' GPUs.\n"
    "# The HostDevices feature gate must be on as well (spec.configuration.developerConfiguration.featureGates); it "
    "is not patched here because that would replace the other gates.\n\n";

// The whole output of kubevirt-config for these lists of permittedHostDevices.
std::string ExpectedPatch(const std::string& lists) {
  return absl::StrCat(kPatchComment, "spec:\n  configuration:\n    permittedHostDevices:\n", lists);
}

TEST_F(VgpuValidateTest, KubevirtConfigPrintsSriovProfilesAsExternalPciHostDevicesThatValidatePasses) {
  Start("vgpu-sriov-l40s-h200.json");
  const std::vector<std::string> l40s = EnableVfs(kL40s, 32);
  const std::vector<std::string> h200a = EnableVfs(kH200a, 32);
  const std::vector<std::string> h200b = EnableVfs(kH200b, 32);
  ASSERT_EQ(l40s.size(), 32u);
  ASSERT_EQ(h200a.size(), 32u);
  ASSERT_EQ(h200b.size(), 32u);
  ASSERT_TRUE(SetVgpuType(l40s[0], "1155"));   // NVIDIA L40S-4Q
  ASSERT_TRUE(SetVgpuType(h200a[0], "1414"));  // NVIDIA H200X-1-18C
  ASSERT_TRUE(SetVgpuType(h200b[0], "1416"));  // NVIDIA H200X-2-35C: another profile of the same model
  auto [code, patch] = KubevirtConfig();
  ASSERT_EQ(code, cli::kExitOk) << patch;
  EXPECT_EQ(patch, ExpectedPatch("      pciHostDevices:\n"
                                 "        - pciVendorSelector: \"10DE:2335\"\n"
                                 "          resourceName: nvidia.com/NVIDIA_H200X-1-18C\n"
                                 "          externalResourceProvider: true\n"
                                 "        - pciVendorSelector: \"10DE:2335\"\n"
                                 "          resourceName: nvidia.com/NVIDIA_H200X-2-35C\n"
                                 "          externalResourceProvider: true\n"
                                 "        - pciVendorSelector: \"10DE:26B9\"\n"
                                 "          resourceName: nvidia.com/NVIDIA_L40S-4Q\n"
                                 "          externalResourceProvider: true\n"));

  const std::vector<Check> checks = ValidateKubevirt(patch);
  for (const char* name : {kL40s4Q, "nvidia.com/NVIDIA_H200X-1-18C", "nvidia.com/NVIDIA_H200X-2-35C"}) {
    const Check* permitted = FindCheck(checks, "kubevirt.permitted", name);
    ASSERT_NE(permitted, nullptr) << name;
    EXPECT_EQ(permitted->result, Result::kPass) << name << ": " << permitted->message;
  }
  EXPECT_EQ(KubevirtConfig({"--format", "cozystack"}).first, cli::kExitUsage);
}

TEST_F(VgpuValidateTest, KubevirtConfigPrintsMdevTypesAsMediatedDevices) {
  Start("vgpu-mdev-t4-a10.json");
  EXPECT_EQ(KubevirtConfig().first, cli::kExitNotReady);  // no vGPU yet
  ASSERT_TRUE(CreateMdev(kT4, "nvidia-230", kUuid1));
  auto [code, patch] = KubevirtConfig();
  ASSERT_EQ(code, cli::kExitOk) << patch;
  EXPECT_EQ(patch, ExpectedPatch("      mediatedDevices:\n"
                                 "        - mdevNameSelector: \"GRID T4-1Q\"\n"
                                 "          resourceName: nvidia.com/GRID_T4-1Q\n"
                                 "          externalResourceProvider: true\n"));
  const std::vector<Check> checks = ValidateKubevirt(patch);
  EXPECT_EQ(FindCheck(checks, "kubevirt.permitted", kT41Q)->result, Result::kPass);
  EXPECT_THAT(report_.summary(), HasSubstr("vGPU chain OK"));
}

// --format dra on a vm-vgpu node: a DeviceClass per vGPU type selecting the resourceName the DRA driver publishes
// for it, with the type's extended-resource name, and claim templates for 1 and for all of the node's vGPUs of it.
TEST_F(VgpuValidateTest, KubevirtConfigPrintsDraObjectsPerVgpuType) {
  Start("vgpu-mdev-t4-a10.json");
  EXPECT_EQ(KubevirtConfig({"--format", "dra"}).first, cli::kExitNotReady);  // no vGPU yet
  for (const char* uuid : {kUuid1, kUuid2}) ASSERT_TRUE(CreateMdev(kT4, "nvidia-230", uuid));
  auto [code, text] = KubevirtConfig({"--format", "dra"});
  ASSERT_EQ(code, cli::kExitOk) << text;
  std::map<std::string, YAML::Node> objects;  // by kind/name
  for (const YAML::Node& doc : YAML::LoadAll(text)) {
    if (doc.IsMap()) objects[doc["kind"].as<std::string>() + "/" + doc["metadata"]["name"].as<std::string>()] = doc;
  }
  ASSERT_EQ(objects.size(), 3u) << text;
  const YAML::Node& device_class = objects["DeviceClass/grid-t4-1q.gpu.vfio-agent.cozystack.io"];
  ASSERT_TRUE(device_class.IsMap()) << text;
  EXPECT_EQ(device_class["spec"]["extendedResourceName"].as<std::string>(), kT41Q);
  EXPECT_EQ(device_class["spec"]["selectors"][0]["cel"]["expression"].as<std::string>(),
            "device.driver == \"gpu.vfio-agent.cozystack.io\" && "
            "device.attributes[\"gpu.vfio-agent.cozystack.io\"].resourceName == \"GRID_T4-1Q\"");
  EXPECT_TRUE(objects.contains("ResourceClaimTemplate/grid-t4-1q"));
  ASSERT_TRUE(objects.contains("ResourceClaimTemplate/grid-t4-1q-x2"));
  EXPECT_EQ(objects["ResourceClaimTemplate/grid-t4-1q-x2"]["spec"]["spec"]["devices"]["requests"].size(), 2u);
  EXPECT_EQ(KubevirtConfig({"--format", "cozystack"}).first, cli::kExitUsage);
}

}  // namespace
}  // namespace vfio_agent::validation
