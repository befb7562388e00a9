// The --cdi spec files against the CDI specification (container-device-interface SPEC.md and the rules its
// reference library enforces), checked by a validator written here from the spec, not by the code that
// writes the files.
#include "vfio_gpu_agent/plugin/cdi.h"

#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "support/sysfs_tree.h"

namespace vfio_agent::plugin {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using json = nlohmann::json;

bool IsLetter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsAlnum(char c) { return IsLetter(c) || IsDigit(c); }

// The spec versions a runtime accepts (0.3.0 is the earliest the reference library reads).
const std::vector<std::string> kVersions = {"0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0"};
int VersionIndex(const std::string& v) {
  auto it = std::find(kVersions.begin(), kVersions.end(), v);
  return it == kVersions.end() ? -1 : static_cast<int>(it - kVersions.begin());
}

// Every violation of the spec in `text`, one line each; empty when the spec is valid.
std::vector<std::string> CdiViolations(const std::string& text) {
  std::vector<std::string> errors;
  json spec = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (spec.is_discarded() || !spec.is_object()) return {"not a JSON object"};
  for (const char* field : {"cdiVersion", "kind", "devices"}) {
    if (!spec.contains(field)) errors.push_back(std::string("missing required field ") + field);
  }
  if (!errors.empty()) return errors;
  const std::string version = spec["cdiVersion"].is_string() ? spec["cdiVersion"].get<std::string>() : "";
  if (VersionIndex(version) < 0) errors.push_back("cdiVersion \"" + version + "\" is not a released version");

  // kind = vendor "/" class. vendor: a letter first, alphanumeric last, [A-Za-z0-9_.-] between. class: a
  // letter first, alphanumeric last, [A-Za-z0-9_-] between ('.' from 0.6.0).
  int required = 0;  // index into kVersions of the least version the content needs
  const std::string kind = spec["kind"].is_string() ? spec["kind"].get<std::string>() : "";
  const size_t slash = kind.find('/');
  const std::string vendor = kind.substr(0, slash), klass = slash == std::string::npos ? "" : kind.substr(slash + 1);
  auto name_ok = [](const std::string& s, const std::string& inner) {
    if (s.empty() || !IsLetter(s.front()) || !IsAlnum(s.back())) return false;
    return std::all_of(s.begin(), s.end(), [&](char c) { return IsAlnum(c) || inner.find(c) != std::string::npos; });
  };
  if (slash == std::string::npos || !name_ok(vendor, "_.-") || !name_ok(klass, "_.-")) {
    errors.push_back("kind \"" + kind + "\" is not vendor/class");
  }
  if (klass.find('.') != std::string::npos) required = std::max(required, VersionIndex("0.6.0"));

  if (!spec["devices"].is_array() || spec["devices"].empty()) errors.push_back("devices must be a non-empty array");
  std::set<std::string> names;
  for (const json& device : spec["devices"]) {
    // Device names: alphanumeric at both ends, [A-Za-z0-9_.:-] between; a digit first only from 0.5.0.
    const std::string name = device.value("name", "");
    const bool chars_ok = !name.empty() && IsAlnum(name.front()) && IsAlnum(name.back()) &&
                          std::all_of(name.begin(), name.end(), [](char c) { return IsAlnum(c) || std::string("_.:-").find(c) != std::string::npos; });
    if (!chars_ok) errors.push_back("device name \"" + name + "\" is invalid");
    if (!name.empty() && !IsLetter(name.front())) required = std::max(required, VersionIndex("0.5.0"));
    if (!names.insert(name).second) errors.push_back("device name \"" + name + "\" repeated");
    // Every device needs at least one container edit.
    if (!device.contains("containerEdits") || !device["containerEdits"].is_object()) {
      errors.push_back("device \"" + name + "\" has no containerEdits");
      continue;
    }
    const json& edits = device["containerEdits"];
    const json nodes = edits.value("deviceNodes", json::array());
    if (nodes.empty() && edits.value("env", json::array()).empty() && edits.value("mounts", json::array()).empty() &&
        edits.value("hooks", json::array()).empty()) {
      errors.push_back("device \"" + name + "\" has empty containerEdits");
    }
    for (const json& node : nodes) {
      const std::string path = node.value("path", "");
      if (path.empty() || path.front() != '/') errors.push_back("device node path \"" + path + "\" is not absolute");
      const std::string permissions = node.value("permissions", "");
      if (permissions.find_first_not_of("rwm") != std::string::npos) {
        errors.push_back("device node permissions \"" + permissions + "\" are not a subset of rwm");
      }
      if (node.contains("hostPath")) required = std::max(required, VersionIndex("0.5.0"));
    }
  }
  if (VersionIndex(version) >= 0 && VersionIndex(version) < required) {
    errors.push_back("cdiVersion " + version + " is older than the " + kVersions[required] + " its content needs");
  }
  return errors;
}

ResourceDevices Gpus(const std::string& resource_name, std::vector<std::string> ids) {
  ResourceDevices r;
  r.resource_name = resource_name;
  int group = 73;
  for (const std::string& id : ids) {
    PluginDevice d;
    d.id = id;
    d.healthy = true;
    d.iommu_group = group++;
    d.vfio_cdevs = {"vfio" + std::to_string(group)};
    r.devices.push_back(d);
  }
  return r;
}

TEST(CdiValidatorTest, CatchesWhatTheSpecForbids) {
  // The validator itself must be able to fail.
  EXPECT_THAT(CdiViolations(R"({"cdiVersion":"0.3.0","kind":"nvidia.com/gpu","devices":[{"name":"gpu0","containerEdits":{"deviceNodes":[{"path":"/dev/x"}]}}]})"), IsEmpty());
  EXPECT_THAT(CdiViolations(R"({"kind":"nvidia.com/gpu","devices":[]})"), ::testing::Contains("missing required field cdiVersion"));
  EXPECT_THAT(CdiViolations(R"({"cdiVersion":"0.3.0","kind":"nvidia.com/gpu","devices":[{"name":"0000:3b:00.0","containerEdits":{"deviceNodes":[{"path":"/dev/x"}]}}]})"),
              ElementsAre("cdiVersion 0.3.0 is older than the 0.5.0 its content needs"));
  EXPECT_THAT(CdiViolations(R"({"cdiVersion":"0.6.0","kind":"nvidia.com/1x","devices":[{"name":"a","containerEdits":{}}]})"),
              ElementsAre("kind \"nvidia.com/1x\" is not vendor/class", "device \"a\" has empty containerEdits"));
}

TEST(CdiTest, SpecIsValidCdiForBdfNamedDevices) {
  for (pci::VfioNodeSet set : {pci::VfioNodeSet::kLegacy, pci::VfioNodeSet::kLegacyAndCdevs, pci::VfioNodeSet::kIommufd}) {
    const std::string text =
        CdiSpecJson(Gpus("nvidia.com/GA102GL_A10", {"0000:3b:00.0", "0000:86:00.0"}), set, /*host_iommufd=*/true);
    EXPECT_THAT(CdiViolations(text), IsEmpty()) << text;
  }
}

TEST(CdiTest, AClassWithADotGetsTheVersionThatAllowsIt) {
  const std::string text = CdiSpecJson(Gpus("example.com/A10.v2", {"0000:3b:00.0"}), pci::VfioNodeSet::kLegacy, false);
  EXPECT_THAT(CdiViolations(text), IsEmpty()) << text;
}

// Per node set, the nodes of one backend (issue 32: the spec used to carry the group node and /dev/iommu together,
// which Kata refuses), in KubeVirt's PCI plugin's order.
TEST(CdiTest, DeviceNodesAreTheAllocateDevicesOfEachGpu) {
  const auto paths_of = [](pci::VfioNodeSet set) {
    const json spec = json::parse(CdiSpecJson(Gpus("nvidia.com/GA102GL_A10", {"0000:3b:00.0"}), set, true));
    EXPECT_EQ(spec["kind"], "nvidia.com/GA102GL_A10");
    EXPECT_EQ(spec["devices"].size(), 1u);
    EXPECT_EQ(spec["devices"][0]["name"], "0000:3b:00.0");
    std::vector<std::string> paths;
    for (const json& node : spec["devices"][0]["containerEdits"]["deviceNodes"]) {
      paths.push_back(node["path"]);
      EXPECT_EQ(node["permissions"], "rw");
    }
    return paths;
  };
  EXPECT_THAT(paths_of(pci::VfioNodeSet::kLegacy), ElementsAre("/dev/vfio/vfio", "/dev/vfio/73"));
  EXPECT_THAT(paths_of(pci::VfioNodeSet::kLegacyAndCdevs),
              ElementsAre("/dev/vfio/vfio", "/dev/vfio/73", "/dev/vfio/devices/vfio74"));
  EXPECT_THAT(paths_of(pci::VfioNodeSet::kIommufd), ElementsAre("/dev/vfio/devices/vfio74", "/dev/iommu"));
  // The name Allocate hands out is the qualified CDI name of that device: kind "=" name.
  EXPECT_EQ(CdiDeviceName("nvidia.com/GA102GL_A10", "0000:3b:00.0"), "nvidia.com/GA102GL_A10=0000:3b:00.0");
}

// A resource name can be a valid extended resource name and still not a CDI kind (the class must start with
// a letter, e.g. the hex fallback "2342"): no invalid spec is written, and the error says why.
TEST(CdiTest, AResourceNameThatIsNoCdiKindIsAnErrorNotAnInvalidFile) {
  testing::TempDir dir;
  absl::Status status = WriteCdiSpec(dir.path() / "cdi", Gpus("nvidia.com/2342", {"0000:3b:00.0"}), pci::VfioNodeSet::kLegacy, false);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), ::testing::HasSubstr("nvidia.com/2342"));
  EXPECT_FALSE(std::filesystem::exists(CdiSpecPath(dir.path() / "cdi", "nvidia.com/2342")));
}

TEST(CdiTest, WritesAtomicallyIntoTheDirectory) {
  testing::TempDir dir;
  const ResourceDevices gpus = Gpus("nvidia.com/GA102GL_A10", {"0000:3b:00.0"});
  ASSERT_TRUE(WriteCdiSpec(dir.path() / "cdi", gpus, pci::VfioNodeSet::kLegacy, false).ok());
  const auto path = CdiSpecPath(dir.path() / "cdi", "nvidia.com/GA102GL_A10");
  EXPECT_EQ(path.filename(), "vfio-gpu-agent_nvidia.com_GA102GL_A10.json");
  std::ifstream in(path);
  std::stringstream content;
  content << in.rdbuf();
  EXPECT_THAT(CdiViolations(content.str()), IsEmpty()) << content.str();
  EXPECT_EQ(std::filesystem::status(path).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write |
                std::filesystem::perms::group_read | std::filesystem::perms::others_read);
  EXPECT_FALSE(std::filesystem::exists(path.string() + ".tmp"));
}

}  // namespace
}  // namespace vfio_agent::plugin
