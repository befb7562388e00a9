// `kubevirt-config`: the entries, their YAML (parsed back with yaml-cpp), and the command itself.
#include <yaml-cpp/yaml.h>

#include <fstream>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kubevirt_cr.h"
#include "support/sysfs_tree.h"
#include "vfio_gpu_agent/cli/commands.h"
#include "vfio_gpu_agent/validation/check.h"
#include "vfio_gpu_agent/validation/kubevirt_config.h"

namespace vfio_agent::validation {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr uint16_t kNvidia = 0x10de;

class FakePciIds final : public names::PciIdsDatabase {
 public:
  std::optional<std::string> DeviceName(uint16_t vendor, uint16_t device) const override {
    if (vendor == kNvidia && device == 0x2339) return "GH100 [H100 SXM5 94GB]";
    return std::nullopt;
  }
  std::string source() const override { return ""; }
};

struct Entry {
  std::string selector, resource_name;
  bool external = false;
  bool operator==(const Entry&) const = default;
};
std::ostream& operator<<(std::ostream& os, const Entry& e) {
  return os << e.selector << " " << e.resource_name << " " << e.external;
}

std::vector<Entry> EntriesAt(const YAML::Node& list) {
  std::vector<Entry> out;
  EXPECT_TRUE(list.IsSequence());
  for (const YAML::Node& item : list) {
    out.push_back({item["pciVendorSelector"].as<std::string>(), item["resourceName"].as<std::string>(),
                   item["externalResourceProvider"].as<bool>()});
  }
  return out;
}

TEST(KubevirtConfigTest, SelectorsAreUpperCaseAsCozystackWritesThem) {
  EXPECT_EQ(PciVendorSelector(0x10de, 0x26b9), "10DE:26B9");
  EXPECT_EQ(PciVendorSelector(0x10de, 0x0001), "10DE:0001");
}

TEST(KubevirtConfigTest, EntriesMarkWhatCozystacksDefaultTableHas) {
  FakePciIds db;
  names::NameResolver resolver(&db, "nvidia.com", {});
  const auto entries = PermittedEntries({{kNvidia, 0x2339}, {kNvidia, 0x2335}, {kNvidia, 0x2335}}, resolver);
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].device_id, 0x2335);
  EXPECT_EQ(entries[0].resource_name, "nvidia.com/GH100_H200_SXM_141GB");
  EXPECT_TRUE(entries[0].in_cozystack_defaults);
  EXPECT_EQ(entries[1].resource_name, "nvidia.com/GH100_H100_SXM5_94GB");
  EXPECT_FALSE(entries[1].in_cozystack_defaults);
  EXPECT_EQ(entries[1].cozystack_default_name, "");

  // Another domain is not Cozystack's table, even for a pinned id.
  names::NameResolver other_domain(&db, "example.com", {});
  EXPECT_FALSE(PermittedEntries({{kNvidia, 0x2335}}, other_domain)[0].in_cozystack_defaults);
}

TEST(KubevirtConfigTest, CozystackValuesListOnlyTheMissingEntries) {
  FakePciIds db;
  names::NameResolver resolver(&db, "nvidia.com", {});
  const std::string yaml = CozystackValuesYaml(PermittedEntries({{kNvidia, 0x2335}, {kNvidia, 0x2339}}, resolver));
  const YAML::Node doc = YAML::Load(yaml);
  EXPECT_EQ(EntriesAt(doc["gpu"]["permittedHostDevices"]["pciHostDevices"]),
            (std::vector<Entry>{{"10DE:2339", "nvidia.com/GH100_H100_SXM5_94GB", true}}));
  EXPECT_THAT(yaml, HasSubstr("# Already in Cozystack's default table (nothing to add):\n"
                              "#   10DE:2335 nvidia.com/GH100_H200_SXM_141GB\n"));
}

TEST(KubevirtConfigTest, NothingToAddWhenEveryGpuIsInTheDefaultTable) {
  names::NameResolver resolver(nullptr, "nvidia.com", {});
  const std::string yaml = CozystackValuesYaml(PermittedEntries({{kNvidia, 0x2335}, {kNvidia, 0x2236}}, resolver));
  const YAML::Node list = YAML::Load(yaml)["gpu"]["permittedHostDevices"]["pciHostDevices"];
  ASSERT_TRUE(list.IsSequence());
  EXPECT_EQ(list.size(), 0u);
  EXPECT_THAT(yaml, HasSubstr("Nothing to add"));
  EXPECT_THAT(yaml, HasSubstr("#   10DE:2236 nvidia.com/GA102GL_A10\n"));
}

TEST(KubevirtConfigTest, AnOverriddenPinnedNameIsAddedAndItsDuplicateSelectorExplained) {
  names::NameResolver resolver(nullptr, "nvidia.com", {{kNvidia, 0x2335, "H200"}});
  const auto entries = PermittedEntries({{kNvidia, 0x2335}}, resolver);
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_FALSE(entries[0].in_cozystack_defaults);
  EXPECT_EQ(entries[0].cozystack_default_name, "nvidia.com/GH100_H200_SXM_141GB");
  const std::string yaml = CozystackValuesYaml(entries);
  EXPECT_EQ(EntriesAt(YAML::Load(yaml)["gpu"]["permittedHostDevices"]["pciHostDevices"]),
            (std::vector<Entry>{{"10DE:2335", "nvidia.com/H200", true}}));
  EXPECT_THAT(yaml, HasSubstr("gpu.replaceDefaults: true"));
}

TEST(KubevirtConfigTest, MergePatchListsEveryEntryAndReadsBackAsTheCrsEntries) {
  FakePciIds db;
  names::NameResolver resolver(&db, "nvidia.com", {});
  const std::string patch =
      KubevirtMergePatchYaml(PermittedEntries({{kNvidia, 0x2335}, {kNvidia, 0x2339}}, resolver));
  YAML::Node doc = YAML::Load(patch);
  EXPECT_EQ(EntriesAt(doc["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"]),
            (std::vector<Entry>{{"10DE:2335", "nvidia.com/GH100_H200_SXM_141GB", true},
                                {"10DE:2339", "nvidia.com/GH100_H100_SXM5_94GB", true}}));
  EXPECT_THAT(patch, HasSubstr("kubectl patch kubevirt kubevirt -n kubevirt --type merge --patch-file"));

  // The patch applied to a CR that permits nothing: the reader sees exactly these entries.
  doc["apiVersion"] = "kubevirt.io/v1";
  doc["kind"] = "KubeVirt";
  YAML::Emitter merged;
  merged << doc;
  auto cr = ParseKubevirtCr(merged.c_str());
  ASSERT_TRUE(cr.ok()) << cr.status();
  ASSERT_EQ(cr->pci_host_devices.size(), 2u);
  EXPECT_EQ(cr->pci_host_devices[1].resource_name, "nvidia.com/GH100_H100_SXM5_94GB");
  EXPECT_EQ(cr->pci_host_devices[1].external_resource_provider, true);
}

// --- the command ---

std::pair<int, std::string> RunCommand(std::vector<std::string> args) {
  std::ostringstream out;
  const int code = cli::RunKubevirtConfig(args, out);
  return {code, out.str()};
}

TEST(KubevirtConfigCommandTest, IdsWithoutReadingTheHost) {
  vfio_agent::testing::TempDir dir;
  const auto pci_ids = dir.path() / "pci.ids";
  std::ofstream(pci_ids) << "10de  NVIDIA Corporation\n\t2339  GH100 [H100 SXM5 94GB]\n";
  auto [code, out] = RunCommand({"--ids", "10de:2335,10DE:2339", "--pci-ids", pci_ids.string(), "--sysfs-root",
                                 (dir.path() / "absent").string()});
  ASSERT_EQ(code, cli::kExitOk) << out;
  EXPECT_EQ(EntriesAt(YAML::Load(out)["gpu"]["permittedHostDevices"]["pciHostDevices"]),
            (std::vector<Entry>{{"10DE:2339", "nvidia.com/GH100_H100_SXM5_94GB", true}}));

  auto [patch_code, patch] = RunCommand({"--ids", "10de:2335", "--format", "kubevirt-patch"});
  ASSERT_EQ(patch_code, cli::kExitOk);
  EXPECT_EQ(EntriesAt(YAML::Load(patch)["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"]),
            (std::vector<Entry>{{"10DE:2335", "nvidia.com/GH100_H200_SXM_141GB", true}}));
}

TEST(KubevirtConfigCommandTest, ReadsTheHostsSelectedGpus) {
  vfio_agent::testing::TempDir dir;
  vfio_agent::testing::SysfsTree tree(dir.path() / "sys");
  tree.AddDevice({.bdf = "0000:18:00.0", .device = 0x2335, .driver = "nvidia", .iommu_group = 11});
  tree.AddDevice({.bdf = "0000:2a:00.0", .device = 0x2236, .driver = "vfio-pci", .iommu_group = 13});
  tree.AddDevice({.bdf = "0000:2a:00.1", .device = 0x1aef, .class_code = 0x040300, .driver = "vfio-pci",
                  .iommu_group = 13});
  auto [code, out] = RunCommand({"--sysfs-root", tree.root().string(), "--format", "kubevirt-patch"});
  ASSERT_EQ(code, cli::kExitOk) << out;
  // GPUs only, bound or not; the audio function is never a resource of its own.
  EXPECT_EQ(EntriesAt(YAML::Load(out)["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"]),
            (std::vector<Entry>{{"10DE:2236", "nvidia.com/GA102GL_A10", true},
                                {"10DE:2335", "nvidia.com/GH100_H200_SXM_141GB", true}}));
  EXPECT_THAT(out, Not(HasSubstr("1AEF")));
}

// Full passthrough: the VM spec's hostDevices name the switches' resource, so KubeVirt must permit it too.
TEST(KubevirtConfigCommandTest, NvSwitchesWithTheSwitch) {
  vfio_agent::testing::TempDir dir;
  vfio_agent::testing::SysfsTree tree(dir.path() / "sys");
  tree.AddDevice({.bdf = "0000:18:00.0", .device = 0x2335, .driver = "vfio-pci", .iommu_group = 11});
  for (const char* bdf : {"0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0"}) {
    tree.AddDevice({.bdf = bdf, .device = 0x22a3, .class_code = 0x068000, .driver = "nvidia", .iommu_group = 40});
  }
  const auto pci_ids = dir.path() / "pci.ids";
  std::ofstream(pci_ids) << "10de  NVIDIA Corporation\n\t22a3  GH100 [H100 NVSwitch]\n";
  const std::vector<std::string> host = {"--sysfs-root", tree.root().string(), "--pci-ids", pci_ids.string()};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), host.begin(), host.end());
    return RunCommand(more);
  };

  auto [code, out] = with({"--nvswitches"});
  ASSERT_EQ(code, cli::kExitOk) << out;
  EXPECT_EQ(EntriesAt(YAML::Load(out)["gpu"]["permittedHostDevices"]["pciHostDevices"]),
            (std::vector<Entry>{{"10DE:22A3", "nvidia.com/GH100_H100_NVSWITCH", true}}));
  auto [patch_code, patch] = with({"--nvswitches", "--format", "kubevirt-patch"});
  ASSERT_EQ(patch_code, cli::kExitOk) << patch;
  EXPECT_EQ(EntriesAt(YAML::Load(patch)["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"]),
            (std::vector<Entry>{{"10DE:22A3", "nvidia.com/GH100_H100_NVSWITCH", true},
                                {"10DE:2335", "nvidia.com/GH100_H200_SXM_141GB", true}}));
  auto [renamed_code, renamed] = with({"--nvswitches", "--resource-name", "10de:22a3=HGX_NVSWITCH"});
  ASSERT_EQ(renamed_code, cli::kExitOk) << renamed;
  EXPECT_EQ(EntriesAt(YAML::Load(renamed)["gpu"]["permittedHostDevices"]["pciHostDevices"]),
            (std::vector<Entry>{{"10DE:22A3", "nvidia.com/HGX_NVSWITCH", true}}));

  auto [gpus_code, gpus] = with({"--format", "kubevirt-patch"});
  ASSERT_EQ(gpus_code, cli::kExitOk) << gpus;
  EXPECT_THAT(gpus, Not(HasSubstr("22A3")));
}

TEST(KubevirtConfigCommandTest, ExitCodes) {
  EXPECT_EQ(RunCommand({"--ids", "10de:23"}).first, cli::kExitUsage);
  EXPECT_EQ(RunCommand({"--ids", "10de2335"}).first, cli::kExitUsage);
  EXPECT_EQ(RunCommand({"--ids", "10de:2335", "--format", "helm"}).first, cli::kExitUsage);
  vfio_agent::testing::TempDir dir;
  vfio_agent::testing::SysfsTree empty(dir.path() / "sys");
  EXPECT_EQ(RunCommand({"--sysfs-root", empty.root().string()}).first, cli::kExitNotReady);
  EXPECT_EQ(RunCommand({"--sysfs-root", (dir.path() / "absent").string()}).first, cli::kExitError);
}

}  // namespace
}  // namespace vfio_agent::validation
