// Layer 5: the KubeVirt CR reader and the checks against a node with 2x H200 and 1x A10 on vfio-pci.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "kubevirt_cr.h"
#include "support/sysfs_tree.h"
#include "vfio_backend_checks.h"
#include "validation/cluster_node.h"

namespace vfio_agent::validation {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::FindCheck;
using testing::kH200;

constexpr char kA10[] = "nvidia.com/GA102GL_A10";

// The CR as Cozystack renders it (packages/system/kubevirt, gpu-operator enabled, default table, no user entries).
constexpr char kCozystackCr[] = R"(apiVersion: kubevirt.io/v1
kind: KubeVirt
metadata:
  name: kubevirt
  namespace: cozy-kubevirt
spec:
  configuration:
    developerConfiguration:
      featureGates:
      - HotplugVolumes
      - ExpandDisks
      - LiveMigration
      - AutoResourceLimitsGate
      - CPUManager
      - GPU
      - VMExport
      - HostDevices
    permittedHostDevices:
      pciHostDevices:
      - pciVendorSelector: 10DE:2335
        resourceName: nvidia.com/GH100_H200_SXM_141GB
        externalResourceProvider: true
      - pciVendorSelector: 10DE:2330
        resourceName: nvidia.com/GH100_H100_SXM5_80GB
        externalResourceProvider: true
      - pciVendorSelector: 10DE:2331
        resourceName: nvidia.com/GH100_H100_PCIE
        externalResourceProvider: true
      - pciVendorSelector: 10DE:2321
        resourceName: nvidia.com/GH100_H100L_94GB
        externalResourceProvider: true
      - pciVendorSelector: 10DE:26B9
        resourceName: nvidia.com/AD102GL_L40S
        externalResourceProvider: true
      - pciVendorSelector: 10DE:26B5
        resourceName: nvidia.com/AD102GL_L40
        externalResourceProvider: true
      - pciVendorSelector: 10DE:27B8
        resourceName: nvidia.com/AD104GL_L4
        externalResourceProvider: true
      - pciVendorSelector: 10DE:20B2
        resourceName: nvidia.com/GA100_A100_SXM4_80GB
        externalResourceProvider: true
      - pciVendorSelector: 10DE:20B0
        resourceName: nvidia.com/GA100_A100_SXM4_40GB
        externalResourceProvider: true
      - pciVendorSelector: 10DE:20B5
        resourceName: nvidia.com/GA100_A100_PCIE_80GB
        externalResourceProvider: true
      - pciVendorSelector: 10DE:20F1
        resourceName: nvidia.com/GA100_A100_PCIE_40GB
        externalResourceProvider: true
      - pciVendorSelector: 10DE:20B7
        resourceName: nvidia.com/GA100GL_A30_PCIE
        externalResourceProvider: true
      - pciVendorSelector: 10DE:2235
        resourceName: nvidia.com/GA102GL_A40
        externalResourceProvider: true
      - pciVendorSelector: 10DE:2236
        resourceName: nvidia.com/GA102GL_A10
        externalResourceProvider: true
      - pciVendorSelector: 10DE:1EB8
        resourceName: nvidia.com/TU104GL_TESLA_T4
        externalResourceProvider: true
      - pciVendorSelector: 10DE:1DB1
        resourceName: nvidia.com/GV100GL_TESLA_V100_SXM2_16GB
        externalResourceProvider: true
      - pciVendorSelector: 10DE:1DB5
        resourceName: nvidia.com/GV100GL_TESLA_V100_SXM2_32GB
        externalResourceProvider: true
      - pciVendorSelector: 10DE:1DB4
        resourceName: nvidia.com/GV100GL_TESLA_V100_PCIE_16GB
        externalResourceProvider: true
      - pciVendorSelector: 10DE:1DF6
        resourceName: nvidia.com/GV100GL_TESLA_V100S_PCIE_32GB
        externalResourceProvider: true
)";

// A plain KubeVirt CR as `kubectl get kubevirt -A -o json` prints it.
constexpr char kPlainJsonList[] = R"({
    "apiVersion": "v1",
    "items": [
        {
            "apiVersion": "kubevirt.io/v1",
            "kind": "KubeVirt",
            "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
            "spec": {
                "configuration": {
                    "developerConfiguration": {"featureGates": ["HostDevices"]},
                    "permittedHostDevices": {
                        "pciHostDevices": [
                            {"pciVendorSelector": "10de:2335", "resourceName": "nvidia.com/GH100_H200_SXM_141GB",
                             "externalResourceProvider": true},
                            {"pciVendorSelector": "10de:2236", "resourceName": "nvidia.com/GA102GL_A10"}
                        ]
                    }
                }
            },
            "status": {"phase": "Deployed"}
        }
    ],
    "kind": "List",
    "metadata": {"resourceVersion": ""}
})";

std::string Replace(std::string text, std::string_view from, std::string_view to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

// --- the reader ---

TEST(KubevirtCrTest, ReadsCozystacksCr) {
  auto cr = ParseKubevirtCr(kCozystackCr);
  ASSERT_TRUE(cr.ok()) << cr.status();
  EXPECT_EQ(cr->name, "kubevirt");
  EXPECT_EQ(cr->namespace_, "cozy-kubevirt");
  EXPECT_EQ(cr->objects, 1);
  EXPECT_TRUE(cr->has_permitted_host_devices);
  ASSERT_EQ(cr->pci_host_devices.size(), 19u);
  EXPECT_EQ(cr->pci_host_devices[13].index, 13);
  EXPECT_EQ(cr->pci_host_devices[13].pci_vendor_selector, "10DE:2236");
  EXPECT_EQ(cr->pci_host_devices[13].resource_name, kA10);
  EXPECT_EQ(cr->pci_host_devices[13].external_resource_provider, true);
  EXPECT_EQ(cr->feature_gates.size(), 8u);
  EXPECT_EQ(cr->feature_gates.back(), "HostDevices");
}

TEST(KubevirtCrTest, ReadsAJsonListAndAbsentFields) {
  auto cr = ParseKubevirtCr(kPlainJsonList);
  ASSERT_TRUE(cr.ok()) << cr.status();
  EXPECT_EQ(cr->namespace_, "kubevirt");
  ASSERT_EQ(cr->pci_host_devices.size(), 2u);
  EXPECT_EQ(cr->pci_host_devices[0].external_resource_provider, true);
  EXPECT_EQ(cr->pci_host_devices[1].external_resource_provider, std::nullopt);
  EXPECT_THAT(cr->feature_gates, ElementsAre("HostDevices"));
}

TEST(KubevirtCrTest, ReadsTheFirstOfSeveralDocumentsAndCountsThem) {
  const std::string text = std::string("---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n---\n") +
                           kCozystackCr + "---\n" + kCozystackCr;
  auto cr = ParseKubevirtCr(text);
  ASSERT_TRUE(cr.ok()) << cr.status();
  EXPECT_EQ(cr->objects, 2);
  EXPECT_EQ(cr->pci_host_devices.size(), 19u);
}

TEST(KubevirtCrTest, ACrWithoutConfigurationHasNothingPermitted) {
  auto cr = ParseKubevirtCr("apiVersion: kubevirt.io/v1\nkind: KubeVirt\nmetadata: {name: kubevirt}\nspec: {}\n");
  ASSERT_TRUE(cr.ok()) << cr.status();
  EXPECT_FALSE(cr->has_permitted_host_devices);
  EXPECT_TRUE(cr->pci_host_devices.empty());
  EXPECT_TRUE(cr->feature_gates.empty());
}

TEST(KubevirtCrTest, RejectsWhatIsNotAKubevirtCr) {
  EXPECT_EQ(ParseKubevirtCr("kind: [unclosed").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ParseKubevirtCr("a: b\n c: d: e\n").status().message()), HasSubstr("line "));
  EXPECT_EQ(ParseKubevirtCr("kind: ConfigMap\n").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ParseKubevirtCr("").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ParseKubevirtCr("- 1\n- 2\n").status().code(), absl::StatusCode::kNotFound);
  auto not_a_list = ParseKubevirtCr(
      "kind: KubeVirt\nspec:\n  configuration:\n    permittedHostDevices:\n      pciHostDevices: {a: b}\n");
  EXPECT_EQ(not_a_list.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(not_a_list.status().message()), HasSubstr("pciHostDevices is not a list"));
  auto not_a_bool = ParseKubevirtCr(Replace(kCozystackCr, "externalResourceProvider: true", "externalResourceProvider: maybe"));
  EXPECT_THAT(std::string(not_a_bool.status().message()), HasSubstr("pciHostDevices[0].externalResourceProvider"));
}

TEST(KubevirtCrTest, ParsesSelectors) {
  EXPECT_EQ(ParsePciVendorSelector("10DE:2335"), std::make_pair(uint16_t{0x10de}, uint16_t{0x2335}));
  EXPECT_EQ(ParsePciVendorSelector("10de:26b9"), std::make_pair(uint16_t{0x10de}, uint16_t{0x26b9}));
  EXPECT_EQ(ParsePciVendorSelector("10DE"), std::nullopt);
  EXPECT_EQ(ParsePciVendorSelector("10DE:233"), std::nullopt);
  EXPECT_EQ(ParsePciVendorSelector("10DE:23351"), std::nullopt);
  EXPECT_EQ(ParsePciVendorSelector("10DG:2335"), std::nullopt);
  EXPECT_EQ(ParsePciVendorSelector("10DE:2335:1"), std::nullopt);
}

// --- the checks ---

class ClusterKubevirtTest : public ::testing::Test {
 protected:
  void SetUp() override {
    vfio_agent::testing::SysfsTree tree(dir_.path());
    tree.AddDevice({.bdf = "0000:18:00.0", .device = 0x2335, .driver = "vfio-pci", .iommu_group = 11});
    tree.AddDevice({.bdf = "0000:2a:00.0", .device = 0x2335, .driver = "vfio-pci", .iommu_group = 13});
    tree.AddDevice({.bdf = "0000:3b:00.0", .device = 0x2236, .driver = "vfio-pci", .iommu_group = 15});
    paths_.sysfs_root = tree.root();
    paths_.dev_root = dir_.path() / "dev";
    std::filesystem::create_directories(paths_.dev_root / "vfio");
    for (int group : {11, 13, 15}) std::ofstream(paths_.dev_root / "vfio" / std::to_string(group));
    auto inventory = pci::Scan(paths_.sysfs_root, {.detail_vendor = pci::kVendorNvidia});
    ASSERT_TRUE(inventory.ok()) << inventory.status();
    inventory_ = std::make_unique<pci::Inventory>(*std::move(inventory));
    selection_ = pci::Select(*inventory_, pci::SelectionPolicy{});
    model_ = node::Build(paths_, *inventory_, selection_, resolver_, nullptr);
    served_ = node::ServedOf(model_, node::WholeDevices::kOnVfio);
    ASSERT_EQ(node::ByResource(served_).size(), 2u);
    view_ = NodeView{.paths = paths_, .inventory = inventory_.get(), .selection = &selection_, .model = &model_,
                     .served = &served_};
  }
  std::vector<Check> Run(const std::string& cr) { return KubevirtChecks(view_, cr, resolver_); }

  vfio_agent::testing::TempDir dir_{"va-kubevirt"};
  HostPaths paths_;
  std::unique_ptr<pci::Inventory> inventory_;
  pci::Selection selection_;
  names::NameResolver resolver_{nullptr, "nvidia.com", {}};
  node::Snapshot model_;
  node::ServedDevices served_;
  NodeView view_;
};

TEST_F(ClusterKubevirtTest, NoCrSkipsWithWhy) {
  const auto checks = KubevirtChecks(view_, std::nullopt, resolver_);
  ASSERT_EQ(checks.size(), 1u);
  EXPECT_EQ(checks[0].id, "kubevirt.permitted");
  EXPECT_EQ(checks[0].result, Result::kSkip);
  EXPECT_THAT(checks[0].message, HasSubstr("--kubevirt-cr"));
}

TEST_F(ClusterKubevirtTest, UnreadableCrFails) {
  const auto checks = Run("kind: [unclosed");
  ASSERT_EQ(checks.size(), 1u);
  EXPECT_EQ(checks[0].result, Result::kFail);
  EXPECT_THAT(checks[0].fix, HasSubstr("kubectl get kubevirt -A -o yaml"));
}

TEST_F(ClusterKubevirtTest, CozystacksDefaultCrPassesEverything) {
  const auto checks = Run(kCozystackCr);
  // permitted + external_provider per resource, two gates, duplicate_selector, name_mismatch, vfio_backend.
  ASSERT_EQ(checks.size(), 9u);
  for (const Check& check : checks) {
    EXPECT_EQ(check.result, Result::kPass) << check.id << " " << check.subject << ": " << check.message;
    EXPECT_EQ(check.layer, Layer::kKubevirt);
  }
  const Check* permitted = FindCheck(checks, "kubevirt.permitted", kA10);
  ASSERT_NE(permitted, nullptr);
  EXPECT_THAT(testing::EvidenceText(*permitted),
              HasSubstr("kubevirt cozy-kubevirt/kubevirt spec.configuration.permittedHostDevices.pciHostDevices[13] = "
                        "pciVendorSelector=10DE:2236 resourceName=nvidia.com/GA102GL_A10 "
                        "externalResourceProvider=true"));
}

TEST_F(ClusterKubevirtTest, MissingNameFailsPermittedAndSkipsExternal) {
  const auto checks = Run(Replace(kCozystackCr, "nvidia.com/GA102GL_A10\n", "nvidia.com/GA102GL_A10G\n"));
  const Check* permitted = FindCheck(checks, "kubevirt.permitted", kA10);
  ASSERT_NE(permitted, nullptr);
  EXPECT_EQ(permitted->result, Result::kFail);
  EXPECT_THAT(permitted->message, HasSubstr("not permitted"));
  EXPECT_THAT(permitted->fix, HasSubstr("vfio-gpu-agent kubevirt-config"));
  EXPECT_EQ(FindCheck(checks, "kubevirt.external_provider", kA10)->result, Result::kSkip);
  EXPECT_EQ(FindCheck(checks, "kubevirt.permitted", kH200)->result, Result::kPass);
}

TEST_F(ClusterKubevirtTest, NoPermittedHostDevicesAtAllFails) {
  const auto checks = Run("kind: KubeVirt\nmetadata: {name: kubevirt, namespace: kubevirt}\nspec:\n  configuration:\n"
                          "    developerConfiguration: {featureGates: [HostDevices, GPU]}\n");
  const Check* permitted = FindCheck(checks, "kubevirt.permitted", kH200);
  ASSERT_NE(permitted, nullptr);
  EXPECT_EQ(permitted->result, Result::kFail);
  EXPECT_THAT(testing::EvidenceText(*permitted), HasSubstr("permittedHostDevices absent"));
}

TEST_F(ClusterKubevirtTest, ExternalResourceProviderFalseOrAbsentFails) {
  auto cr = Replace(kCozystackCr, "resourceName: nvidia.com/GH100_H200_SXM_141GB\n        externalResourceProvider: true",
                    "resourceName: nvidia.com/GH100_H200_SXM_141GB\n        externalResourceProvider: false");
  const auto with_false = Run(cr);
  const Check* h200 = FindCheck(with_false, "kubevirt.external_provider", kH200);
  ASSERT_NE(h200, nullptr);
  EXPECT_EQ(h200->result, Result::kFail);
  EXPECT_THAT(h200->message, HasSubstr("virt-handler serves"));
  EXPECT_THAT(h200->fix, HasSubstr("externalResourceProvider: true"));

  const auto plain = Run(kPlainJsonList);
  const Check* a10 = FindCheck(plain, "kubevirt.external_provider", kA10);
  ASSERT_NE(a10, nullptr);
  EXPECT_EQ(a10->result, Result::kFail);
  EXPECT_THAT(testing::EvidenceText(*a10), HasSubstr("externalResourceProvider=(absent)"));
  EXPECT_EQ(FindCheck(plain, "kubevirt.external_provider", kH200)->result, Result::kPass);
}

TEST_F(ClusterKubevirtTest, HostDevicesGateOffFailsAndGpuGateOffWarns) {
  auto cr = Replace(Replace(kCozystackCr, "      - HostDevices\n", ""), "      - GPU\n", "");
  const auto checks = Run(cr);
  const Check* host_devices = FindCheck(checks, "kubevirt.feature_gate", "HostDevices");
  ASSERT_NE(host_devices, nullptr);
  EXPECT_EQ(host_devices->result, Result::kFail);
  EXPECT_THAT(host_devices->fix, HasSubstr("spec.configuration.developerConfiguration.featureGates"));
  EXPECT_THAT(testing::EvidenceText(*host_devices), HasSubstr("HotplugVolumes,ExpandDisks"));
  const Check* gpu = FindCheck(checks, "kubevirt.feature_gate", "GPU");
  ASSERT_NE(gpu, nullptr);
  EXPECT_EQ(gpu->result, Result::kWarn);
}

TEST_F(ClusterKubevirtTest, DuplicateSelectorsAreFlagged) {
  // A user entry appended to the default table (gpu.replaceDefaults false).
  const std::string same = std::string(kCozystackCr) +
                           "      - pciVendorSelector: 10de:2236\n        resourceName: nvidia.com/GA102GL_A10\n"
                           "        externalResourceProvider: true\n";
  const auto same_checks = Run(same);
  const Check* identical = FindCheck(same_checks, "kubevirt.duplicate_selector", "10DE:2236");
  ASSERT_NE(identical, nullptr);
  EXPECT_EQ(identical->result, Result::kWarn);
  EXPECT_EQ(identical->evidence.size(), 2u);

  const std::string differ = std::string(kCozystackCr) +
                             "      - pciVendorSelector: 10DE:2236\n        resourceName: nvidia.com/A10\n"
                             "        externalResourceProvider: true\n";
  const auto differ_checks = Run(differ);
  const Check* conflicting = FindCheck(differ_checks, "kubevirt.duplicate_selector", "10DE:2236");
  ASSERT_NE(conflicting, nullptr);
  EXPECT_EQ(conflicting->result, Result::kFail);
  EXPECT_THAT(conflicting->message, HasSubstr("not deterministic"));
  EXPECT_THAT(conflicting->fix, HasSubstr("gpu.replaceDefaults"));
}

TEST_F(ClusterKubevirtTest, NameTheNodeCannotAdvertiseIsFlaggedWithTheNodesName) {
  // What an old pci.ids without the H200 gives the peer plugin: the device id.
  const auto checks = Run(Replace(kCozystackCr, "resourceName: nvidia.com/GH100_H200_SXM_141GB",
                                  "resourceName: nvidia.com/2335"));
  const Check* mismatch = FindCheck(checks, "kubevirt.name_mismatch", "nvidia.com/2335");
  ASSERT_NE(mismatch, nullptr);
  EXPECT_EQ(mismatch->result, Result::kFail);
  EXPECT_THAT(mismatch->message, HasSubstr("advertises that GPU as nvidia.com/GH100_H200_SXM_141GB"));
  EXPECT_THAT(mismatch->fix, HasSubstr("resourceName: nvidia.com/GH100_H200_SXM_141GB"));
  EXPECT_THAT(mismatch->fix, HasSubstr("--resource-name 10de:2335=2335"));
  EXPECT_EQ(FindCheck(checks, "kubevirt.permitted", kH200)->result, Result::kFail);
  // Entries for GPUs this node does not have are other nodes' business.
  EXPECT_EQ(FindCheck(checks, "kubevirt.name_mismatch", "nvidia.com/AD102GL_L40S"), nullptr);
}

}  // namespace
}  // namespace vfio_agent::validation

namespace vfio_agent::validation {
namespace {

// The backend the node offers (group nodes: legacy; /dev/iommu and every GPU's cdev: iommufd) against what the
// CR's KubeVirt opens: iommufd only from v1.9 with the IOMMUFD gate.
TEST_F(ClusterKubevirtTest, TheVfioBackendTheNodeOffersAgainstWhatKubevirtOpens) {
  auto backend = [&](const std::string& version, const std::string& gates) {
    const std::string cr = absl::StrCat(
        "apiVersion: kubevirt.io/v1\nkind: KubeVirt\nmetadata: {name: kubevirt, namespace: kubevirt}\n"
        "spec: {configuration: {developerConfiguration: {featureGates: [",
        gates, "]}}}\nstatus: {observedKubeVirtVersion: ", version, "}\n");
    const std::vector<Check> checks = Run(cr);
    const Check* check = FindCheck(checks, "kubevirt.vfio_backend", "node");
    EXPECT_NE(check, nullptr);
    return check == nullptr ? Check{} : *check;
  };
  Check legacy = backend("v1.8.2", "HostDevices");
  EXPECT_EQ(legacy.result, Result::kPass) << legacy.message;
  EXPECT_THAT(legacy.message, HasSubstr("offers legacy"));
  EXPECT_THAT(legacy.message, ::testing::Not(HasSubstr("iommufd (")));

  // iommufd as well: /dev/iommu and each GPU's cdev.
  std::ofstream(paths_.dev_root / "iommu");
  std::filesystem::create_directories(paths_.dev_root / "vfio/devices");
  int n = 0;
  for (const char* bdf : {"0000:18:00.0", "0000:2a:00.0", "0000:3b:00.0"}) {
    const std::string cdev = absl::StrCat("vfio", n++);
    std::filesystem::create_directories(paths_.sysfs_root / "bus/pci/devices" / bdf / "vfio-dev" / cdev);
    std::ofstream(paths_.dev_root / "vfio/devices" / cdev);
  }
  auto inventory = pci::Scan(paths_.sysfs_root, {.detail_vendor = pci::kVendorNvidia});
  ASSERT_TRUE(inventory.ok());
  *inventory_ = *std::move(inventory);
  Check both = backend("v1.8.2", "HostDevices");
  EXPECT_EQ(both.result, Result::kPass) << both.message;
  EXPECT_THAT(both.message, HasSubstr("and iommufd"));
  EXPECT_THAT(both.message, HasSubstr("<model>-iommufd DeviceClass would fail"));
  EXPECT_THAT(backend("v1.9.0", "HostDevices, IOMMUFD").message, HasSubstr("with the IOMMUFD gate opens iommufd"));

  // A cdev-only node (no group nodes): only a KubeVirt that opens iommufd can use it.
  for (int group : {11, 13, 15}) std::filesystem::remove(paths_.dev_root / "vfio" / std::to_string(group));
  EXPECT_EQ(backend("v1.9.0", "HostDevices").result, Result::kFail);
  EXPECT_EQ(backend("v1.8.2", "HostDevices, IOMMUFD").result, Result::kFail);
  EXPECT_EQ(backend("v1.10.1", "HostDevices, IOMMUFD").result, Result::kPass);
}

}  // namespace
}  // namespace vfio_agent::validation
