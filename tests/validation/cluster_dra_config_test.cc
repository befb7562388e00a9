// `kubevirt-config --format dra`: the DeviceClasses, ResourceClaimTemplates and VM snippets, parsed back with
// yaml-cpp and checked against each other (every name a snippet uses is an object the output creates).
#include <yaml-cpp/yaml.h>

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "fabric_fixture.h"
#include "support/sysfs_tree.h"
#include "vfio_gpu_agent/cli/commands.h"
#include "vfio_gpu_agent/validation/dra_config.h"

namespace vfio_agent::validation {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kDefaultDriver[] = "gpu.vfio-agent.cozystack.io";

std::pair<int, std::string> RunDraCommand(std::vector<std::string> args) {
  args.insert(args.begin(), {"--format", "dra"});
  std::ostringstream out;
  const int code = cli::RunKubevirtConfig(args, out);
  return {code, out.str()};
}

struct DraOutput {
  std::map<std::string, YAML::Node> classes;    // by metadata.name
  std::map<std::string, YAML::Node> templates;  // by metadata.name
  std::vector<YAML::Node> vm_snippets;          // the commented blocks, uncommented
};

// The documents, and each "#   "-indented comment block after them as YAML of its own.
DraOutput ParseDraOutput(const std::string& text) {
  DraOutput out;
  for (const YAML::Node& doc : YAML::LoadAll(text)) {
    if (!doc.IsDefined() || doc.IsNull()) continue;
    EXPECT_EQ(doc["apiVersion"].as<std::string>(), "resource.k8s.io/v1");
    const std::string kind = doc["kind"].as<std::string>();
    auto& into = kind == "DeviceClass" ? out.classes : out.templates;
    EXPECT_TRUE(kind == "DeviceClass" || kind == "ResourceClaimTemplate") << kind;
    EXPECT_TRUE(into.emplace(doc["metadata"]["name"].as<std::string>(), doc).second) << "duplicate object";
  }
  std::string block;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::ConsumePrefix(&line, "#   ")) {
      absl::StrAppend(&block, line, "\n");
    } else if (!block.empty()) {
      out.vm_snippets.push_back(YAML::Load(block));
      block.clear();
    }
  }
  if (!block.empty()) out.vm_snippets.push_back(YAML::Load(block));
  return out;
}

bool IsDnsName(const std::string& name) {
  static const std::regex kSubdomain("[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*");
  return name.size() <= 253 && std::regex_match(name, kSubdomain);
}

// The host of the HGX tests: 8 H200 with NVSwitches, and an A10 with its audio function.
vfio_agent::testing::SysfsTree& DraHost(vfio_agent::testing::SysfsTree& tree) {
  for (int i = 0; i < 8; ++i) {
    tree.AddDevice({.bdf = absl::StrFormat("0000:%02x:00.0", 0x18 + i), .device = 0x2335, .driver = "vfio-pci",
                    .iommu_group = 11 + i});
  }
  tree.AddDevice({.bdf = "0000:2a:00.0", .device = 0x2236, .driver = "nvidia", .iommu_group = 30});
  tree.AddDevice({.bdf = "0000:2a:00.1", .device = 0x1aef, .class_code = 0x040300, .driver = "snd_hda_intel",
                  .iommu_group = 30});
  tree.AddDevice({.bdf = "0000:05:00.0", .device = 0x22a3, .class_code = 0x068000, .driver = "nvidia",
                  .iommu_group = 40});
  return tree;
}

TEST(DraConfigTest, ClassNamesAreDnsSubdomainsUnderTheDriver) {
  EXPECT_EQ(DeviceClassName("nvidia.com/GH100_H200_SXM_141GB", kDefaultDriver),
            "gh100-h200-sxm-141gb.gpu.vfio-agent.cozystack.io");
  EXPECT_EQ(DeviceClassName("example.com/A.b-C_d", "x.example"), "a-b-c-d.x.example");
  EXPECT_TRUE(IsDnsName(DeviceClassName("nvidia.com/GA102GL_A10", kDefaultDriver)));
}

TEST(DraConfigTest, SelectorNamesTheDriverAndTheModelsResourceNameAttribute) {
  EXPECT_EQ(DeviceClassSelector("nvidia.com/GH100_H200_SXM_141GB", kDefaultDriver),
            "device.driver == \"gpu.vfio-agent.cozystack.io\" && "
            "device.attributes[\"gpu.vfio-agent.cozystack.io\"].resourceName == \"GH100_H200_SXM_141GB\"");
}

TEST(DraConfigTest, ModelsCountTheGpusOfEachName) {
  names::NameResolver resolver(nullptr, "nvidia.com", {});
  const auto models = DraModels({{0x10de, 0x2335}, {0x10de, 0x2236}, {0x10de, 0x2335}}, resolver);
  ASSERT_EQ(models.size(), 2u);
  EXPECT_EQ(models[0].resource_name, "nvidia.com/GA102GL_A10");
  EXPECT_EQ(models[0].gpus, 1);
  EXPECT_EQ(models[1].resource_name, "nvidia.com/GH100_H200_SXM_141GB");
  EXPECT_EQ(models[1].gpus, 2);
}

TEST(DraConfigCommandTest, AClassAndTemplatesPerModelOfTheHostsGpus) {
  vfio_agent::testing::TempDir dir;
  vfio_agent::testing::SysfsTree tree(dir.path() / "sys");
  DraHost(tree);
  auto [code, text] = RunDraCommand({"--sysfs-root", tree.root().string(), "--nvswitches"});
  ASSERT_EQ(code, cli::kExitOk) << text;
  const DraOutput out = ParseDraOutput(text);

  // Two classes per GPU model, legacy VFIO and iommufd; the NVSwitch is no DRA device even with --nvswitches, the
  // audio function never.
  ASSERT_EQ(out.classes.size(), 4u) << text;
  const YAML::Node h200_iommufd = out.classes.at("gh100-h200-sxm-141gb-iommufd.gpu.vfio-agent.cozystack.io");
  EXPECT_FALSE(h200_iommufd["spec"]["extendedResourceName"].IsDefined());  // the legacy class keeps the name
  EXPECT_EQ(h200_iommufd["spec"]["selectors"][0]["cel"]["expression"].as<std::string>(),
            DeviceClassSelector("nvidia.com/GH100_H200_SXM_141GB", kDefaultDriver));
  EXPECT_TRUE(out.classes.contains("ga102gl-a10-iommufd.gpu.vfio-agent.cozystack.io"));
  const YAML::Node h200 = out.classes.at("gh100-h200-sxm-141gb.gpu.vfio-agent.cozystack.io");
  EXPECT_EQ(h200["spec"]["extendedResourceName"].as<std::string>(), "nvidia.com/GH100_H200_SXM_141GB");
  ASSERT_EQ(h200["spec"]["selectors"].size(), 1u);
  EXPECT_EQ(h200["spec"]["selectors"][0]["cel"]["expression"].as<std::string>(),
            DeviceClassSelector("nvidia.com/GH100_H200_SXM_141GB", kDefaultDriver));
  const YAML::Node a10 = out.classes.at("ga102gl-a10.gpu.vfio-agent.cozystack.io");
  EXPECT_EQ(a10["spec"]["extendedResourceName"].as<std::string>(), "nvidia.com/GA102GL_A10");
  EXPECT_THAT(text, Not(HasSubstr("NVSWITCH")));

  // 1 GPU for each model, and all 8 H200 in one claim of 8 single-device requests (KubeVirt takes one device a
  // request); the single A10 gets no second template.
  std::set<std::string> template_names;
  for (const auto& [name, doc] : out.templates) template_names.insert(name);
  EXPECT_EQ(template_names, (std::set<std::string>{"ga102gl-a10", "gh100-h200-sxm-141gb", "gh100-h200-sxm-141gb-x8"}));
  const YAML::Node eight = out.templates.at("gh100-h200-sxm-141gb-x8")["spec"]["spec"]["devices"]["requests"];
  ASSERT_EQ(eight.size(), 8u);
  std::set<std::string> request_names;
  for (const YAML::Node& request : eight) {
    request_names.insert(request["name"].as<std::string>());
    EXPECT_EQ(request["exactly"]["deviceClassName"].as<std::string>(), h200["metadata"]["name"].as<std::string>());
    EXPECT_EQ(request["exactly"]["allocationMode"].as<std::string>(), "ExactCount");
    EXPECT_EQ(request["exactly"]["count"].as<int>(), 1);
    EXPECT_TRUE(IsDnsName(request["name"].as<std::string>()));
  }
  EXPECT_EQ(request_names.size(), 8u);
  for (const auto& [name, doc] : out.classes) EXPECT_TRUE(IsDnsName(name)) << name;
  for (const auto& [name, doc] : out.templates) EXPECT_TRUE(IsDnsName(name)) << name;
}

// Every claim a snippet declares comes from a printed template, and every gpus[] entry names a declared claim
// and one of its template's requests, each request used once; the deviceName way names a class's resource.
TEST(DraConfigCommandTest, VmSnippetsUseWhatTheOutputCreates) {
  vfio_agent::testing::TempDir dir;
  vfio_agent::testing::SysfsTree tree(dir.path() / "sys");
  DraHost(tree);
  auto [code, text] = RunDraCommand({"--sysfs-root", tree.root().string()});
  ASSERT_EQ(code, cli::kExitOk) << text;
  const DraOutput out = ParseDraOutput(text);
  std::set<std::string> extended_names;
  for (const auto& [name, doc] : out.classes) {
    if (doc["spec"]["extendedResourceName"]) extended_names.insert(doc["spec"]["extendedResourceName"].as<std::string>());
  }

  int claim_snippets = 0, device_name_snippets = 0;
  std::set<int> gpu_counts;
  for (const YAML::Node& snippet : out.vm_snippets) {
    const YAML::Node spec = snippet["spec"]["template"]["spec"];
    const YAML::Node gpus = spec["domain"]["devices"]["gpus"];
    ASSERT_TRUE(gpus.IsSequence());
    if (!spec["resourceClaims"]) {
      ++device_name_snippets;
      ASSERT_EQ(gpus.size(), 1u);
      EXPECT_TRUE(extended_names.contains(gpus[0]["deviceName"].as<std::string>()));
      continue;
    }
    ++claim_snippets;
    std::map<std::string, std::set<std::string>> requests_of_claim;
    for (const YAML::Node& claim : spec["resourceClaims"]) {
      const std::string template_name = claim["resourceClaimTemplateName"].as<std::string>();
      ASSERT_TRUE(out.templates.contains(template_name)) << template_name;
      for (const YAML::Node& request : out.templates.at(template_name)["spec"]["spec"]["devices"]["requests"]) {
        requests_of_claim[claim["name"].as<std::string>()].insert(request["name"].as<std::string>());
      }
    }
    std::set<std::pair<std::string, std::string>> used;
    for (const YAML::Node& gpu : gpus) {
      EXPECT_FALSE(gpu["deviceName"]) << "a claim-backed GPU must have no deviceName";
      const std::string claim = gpu["claimName"].as<std::string>();
      const std::string request = gpu["requestName"].as<std::string>();
      ASSERT_TRUE(requests_of_claim.contains(claim)) << claim;
      EXPECT_TRUE(requests_of_claim.at(claim).contains(request)) << request;
      EXPECT_TRUE(used.emplace(claim, request).second) << "claim/request used twice: " << claim << "/" << request;
    }
    size_t all_requests = 0;
    for (const auto& [claim, requests] : requests_of_claim) all_requests += requests.size();
    EXPECT_EQ(used.size(), all_requests) << "a request no GPU takes would hold a device the VM never sees";
    gpu_counts.insert(static_cast<int>(gpus.size()));
  }
  // H200: 1 and 8; A10: 1. Both ways for each model.
  EXPECT_EQ(claim_snippets, 3);
  EXPECT_EQ(gpu_counts, (std::set<int>{1, 8}));
  EXPECT_EQ(device_name_snippets, 2);
}

// HGX shared NVSwitch: with --fabric-manager the multi-GPU templates are one per partition size Fabric Manager
// supports, each tying its requests to one partition; a VM snippet uses each.
TEST(DraConfigCommandTest, WithFabricManagerEachPartitionSizeGetsATemplateTiedByMatchAttribute) {
  vfio_agent::testing::TempDir dir;
  vfio_agent::testing::SysfsTree tree(dir.path() / "sys");
  DraHost(tree);
  const std::filesystem::path fm = vfio_agent::testing::MakeFakeFm(dir.path() / "fm");
  auto [code, text] = RunDraCommand({"--sysfs-root", tree.root().string(), "--fabric-manager", "unix:" + fm.string(),
                                     "--fabric-library", FAKE_NVFM_LIBRARY});
  ASSERT_EQ(code, cli::kExitOk) << text;
  const DraOutput out = ParseDraOutput(text);
  std::set<std::string> template_names;
  for (const auto& [name, doc] : out.templates) template_names.insert(name);
  EXPECT_EQ(template_names, (std::set<std::string>{"ga102gl-a10", "gh100-h200-sxm-141gb", "gh100-h200-sxm-141gb-x2",
                                                   "gh100-h200-sxm-141gb-x4", "gh100-h200-sxm-141gb-x8"}));
  for (int size : {2, 4, 8}) {
    const YAML::Node devices =
        out.templates.at(absl::StrFormat("gh100-h200-sxm-141gb-x%d", size))["spec"]["spec"]["devices"];
    std::vector<std::string> requests;
    for (const YAML::Node& request : devices["requests"]) requests.push_back(request["name"].as<std::string>());
    ASSERT_EQ(requests.size(), static_cast<size_t>(size));
    ASSERT_EQ(devices["constraints"].size(), 1u) << size;
    EXPECT_EQ(devices["constraints"][0]["matchAttribute"].as<std::string>(),
              absl::StrFormat("%s/partition%d", kDefaultDriver, size));
    EXPECT_EQ(devices["constraints"][0]["requests"].as<std::vector<std::string>>(), requests);
  }
  EXPECT_FALSE(out.templates.at("gh100-h200-sxm-141gb")["spec"]["spec"]["devices"]["constraints"]);
  int claim_snippets = 0;
  for (const YAML::Node& snippet : out.vm_snippets) {
    if (snippet["spec"]["template"]["spec"]["resourceClaims"]) ++claim_snippets;
  }
  EXPECT_EQ(claim_snippets, 5);  // H200: 1, 2, 4, 8; A10: 1

  // An FM that does not answer is an error, not a node without partitions.
  EXPECT_EQ(RunDraCommand({"--sysfs-root", tree.root().string(), "--fabric-manager",
                           "unix:" + (dir.path() / "no-fm").string(), "--fabric-library", FAKE_NVFM_LIBRARY})
                .first,
            cli::kExitError);
}

TEST(DraConfigCommandTest, DriverNameDomainAndOverridesCarryThrough) {
  auto [code, text] = RunDraCommand({"--ids", "10de:2335", "--dra-driver-name", "gpus.example.org", "--resource-domain",
                                  "example.com", "--resource-name", "10de:2335=H200"});
  ASSERT_EQ(code, cli::kExitOk) << text;
  const DraOutput out = ParseDraOutput(text);
  ASSERT_EQ(out.classes.size(), 2u);
  EXPECT_TRUE(out.classes.contains("h200-iommufd.gpus.example.org"));
  ASSERT_TRUE(out.classes.contains("h200.gpus.example.org"));
  const YAML::Node& klass = out.classes.at("h200.gpus.example.org");
  EXPECT_EQ(klass["spec"]["extendedResourceName"].as<std::string>(), "example.com/H200");
  EXPECT_EQ(klass["spec"]["selectors"][0]["cel"]["expression"].as<std::string>(),
            DeviceClassSelector("example.com/H200", "gpus.example.org"));
  std::vector<std::string> templates;
  for (const auto& [name, doc] : out.templates) templates.push_back(name);
  EXPECT_THAT(templates, ElementsAre("h200"));
}

// daemonset/overlays/dra ships a class per model of Cozystack's default table: the same objects the command prints
// for those models, so a VM spec written against either finds the other's classes.
TEST(DraConfigTest, TheDraOverlaysClassesAreTheCommandsForCozystacksTable) {
  std::vector<std::pair<uint16_t, uint16_t>> ids;
  for (const auto& [device, name] : names::PinnedNames()) ids.emplace_back(0x10de, device);
  names::NameResolver resolver(nullptr, "nvidia.com", {});
  const DraOutput want =
      ParseDraOutput(DeviceClassesYaml(DraModels(ids, resolver), kDefaultDriver, /*iommufd_classes=*/true));
  ASSERT_EQ(want.classes.size(), 2 * names::PinnedNames().size());

  const std::string path = std::string(VA_DAEMONSET_DIR) + "/overlays/dra/deviceclasses.yaml";
  std::ifstream file(path);
  ASSERT_TRUE(file) << path;
  std::stringstream text;
  text << file.rdbuf();
  const DraOutput shipped = ParseDraOutput(text.str());
  std::set<std::string> want_names, shipped_names;
  for (const auto& [name, doc] : want.classes) want_names.insert(name);
  for (const auto& [name, doc] : shipped.classes) shipped_names.insert(name);
  EXPECT_EQ(shipped_names, want_names);
  for (const auto& [name, doc] : want.classes) {
    if (!shipped.classes.contains(name)) continue;
    const YAML::Node got = shipped.classes.at(name)["spec"];
    ASSERT_EQ(got["extendedResourceName"].IsDefined(), doc["spec"]["extendedResourceName"].IsDefined()) << name;
    if (got["extendedResourceName"]) {
      EXPECT_EQ(got["extendedResourceName"].as<std::string>(), doc["spec"]["extendedResourceName"].as<std::string>());
    }
    ASSERT_EQ(got["selectors"].size(), 1u) << name;
    EXPECT_EQ(got["selectors"][0]["cel"]["expression"].as<std::string>(),
              doc["spec"]["selectors"][0]["cel"]["expression"].as<std::string>());
  }
}

TEST(DraConfigCommandTest, ExitCodes) {
  EXPECT_EQ(RunDraCommand({"--ids", "10de:2335", "--dra-driver-name", "Not_A_Name"}).first, cli::kExitUsage);
  vfio_agent::testing::TempDir dir;
  vfio_agent::testing::SysfsTree empty(dir.path() / "sys");
  EXPECT_EQ(RunDraCommand({"--sysfs-root", empty.root().string()}).first, cli::kExitNotReady);
}

}  // namespace
}  // namespace vfio_agent::validation
