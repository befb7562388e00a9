// `inspect` against every shipped simulated node (FUSE) and the real, read-only /sys of this machine.
#include "vfio_gpu_agent/cli/inspect.h"

#include <gmock/gmock.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "sim_process.h"
#include "support/fuse.h"
#include "support/sysfs_tree.h"
#include "vfio_gpu_agent/dra/device_names.h"
#include "vfio_gpu_agent/names/resource_names.h"
#include "vfio_gpu_agent/pci/inventory.h"
#include "vfio_gpu_agent/plugin/devices.h"

namespace vfio_agent::cli {
namespace {

namespace rpt = report::v1;
using ::testing::HasSubstr;

class InspectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!vfio_agent::testing::FuseAvailable()) GTEST_SKIP() << vfio_agent::testing::kNeedsFuse;
  }
  void StartNode(const std::string& node) {
    auto sim = sim::SimProcess::Start(sim::NodeFile(node), tmp_.path() / "node");
    ASSERT_TRUE(sim.ok()) << sim.status();
    sim_ = *std::move(sim);
    options_.paths.sysfs_root = sim_->sysfs_root();
    options_.paths.dev_root = sim_->dev_root();
    options_.paths.modules_root = tmp_.path() / "no-modules";
  }

  rpt::InspectReport Inspect() {
    auto db = LoadNameDatabase(options_);
    auto report = BuildInspectReport(options_, db.get());
    EXPECT_TRUE(report.ok()) << report.status();
    return report.ok() ? *report : rpt::InspectReport();
  }

  // Runs the real binary; returns exit code and stdout.
  std::pair<int, std::string> RunBinary(const std::string& args) {
    std::string cmd = absl::StrCat(VFIO_AGENT_BINARY, " ", args, " --sysfs-root ", options_.paths.sysfs_root.string(),
                                   " --dev-root ", options_.paths.dev_root.string(), " --modules-root ",
                                   options_.paths.modules_root.string(), " 2>/dev/null");
    FILE* pipe = popen(cmd.c_str(), "r");
    std::string out;
    std::array<char, 4096> buf{};
    size_t n;
    while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
    int status = pclose(pipe);
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
  }

  vfio_agent::testing::TempDir tmp_;
  std::unique_ptr<sim::SimProcess> sim_;
  CommonOptions options_;
};

std::map<std::string, const rpt::Function*> ByBdf(const rpt::InspectReport& report) {
  std::map<std::string, const rpt::Function*> out;
  for (const auto& fn : report.functions()) out[fn.bdf()] = &fn;
  return out;
}

TEST_F(InspectTest, HgxH200NodeAdvertisesEightPinnedNamesSplitOverTwoNumaNodes) {
  StartNode("hgx-h200-8gpu.json");
  rpt::InspectReport report = Inspect();
  EXPECT_EQ(report.schema(), kInspectSchema);
  EXPECT_TRUE(report.iommu_enabled());
  EXPECT_TRUE(report.ready());
  ASSERT_EQ(report.functions_size(), 8);  // NVSwitches only on request
  std::map<int, int> per_numa;
  for (const auto& fn : report.functions()) {
    EXPECT_EQ(fn.role(), rpt::GPU) << fn.bdf();
    // Debian 12's pci.ids has no 10de:2335; the pinned Cozystack table supplies the name.
    EXPECT_EQ(fn.resource_name(), "nvidia.com/GH100_H200_SXM_141GB") << fn.bdf();
    EXPECT_EQ(fn.action(), rpt::WOULD_BIND) << fn.bdf();
    EXPECT_EQ(fn.target_driver(), "vfio-pci");
    EXPECT_EQ(fn.driver(), "nvidia");
    EXPECT_GE(fn.iommu_group(), 0);
    ++per_numa[fn.numa_node()];
  }
  EXPECT_EQ(per_numa, (std::map<int, int>{{0, 4}, {1, 4}}));
  std::string text = FormatInspectText(report);
  EXPECT_THAT(text, HasSubstr("0000:18:00.0"));
  EXPECT_THAT(text, HasSubstr("would bind -> vfio-pci"));
  EXPECT_THAT(text, HasSubstr("ready: every selected device"));
}

TEST_F(InspectTest, NvSwitchesOnlyWithTheSwitch) {
  StartNode("hgx-h200-8gpu.json");
  options_.policy.include_nvswitches = true;
  rpt::InspectReport report = Inspect();
  int switches = 0;
  for (const auto& fn : report.functions()) {
    if (fn.role() != rpt::NVSWITCH) continue;
    ++switches;
    EXPECT_EQ(fn.device_id(), "22a3");
    EXPECT_FALSE(fn.resource_name().empty());
    EXPECT_EQ(fn.iommu_group(), 40) << "the board's four switches share one group";
  }
  EXPECT_EQ(switches, 4);
  EXPECT_EQ(report.functions_size(), 12);
}

// The switches' resource name is the one `serve` registers: from pci.ids, by the GPUs' rule.
TEST_F(InspectTest, NvSwitchNameIsTheOneServeRegisters) {
  StartNode("hgx-h200-8gpu.json");
  options_.policy.include_nvswitches = true;
  std::ofstream(tmp_.path() / "pci.ids") << "10de  NVIDIA Corporation\n\t22a3  GH100 [H100 NVSwitch]\n";
  auto db = names::LoadPciIds(tmp_.path() / "pci.ids");
  ASSERT_TRUE(db.ok()) << db.status();
  auto report = BuildInspectReport(options_, db->get());
  ASSERT_TRUE(report.ok()) << report.status();
  std::set<std::string> inspected;
  for (const auto& fn : report->functions()) {
    if (fn.role() == rpt::NVSWITCH) inspected.insert(fn.resource_name());
  }
  EXPECT_EQ(inspected, std::set<std::string>{"nvidia.com/GH100_H100_NVSWITCH"});

  for (const char* bdf : {"0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0"}) {
    ASSERT_TRUE(sim_->Control(absl::StrCat("set-driver ", bdf, " vfio-pci")).ok());
  }
  auto inventory = pci::Scan(options_.paths.sysfs_root);
  ASSERT_TRUE(inventory.ok()) << inventory.status();
  const names::NameResolver served_names(db->get(), "nvidia.com", {});
  const plugin::DeviceSnapshot served = plugin::BuildSnapshot(
      options_.paths, *inventory, pci::Select(*inventory, options_.policy), served_names, {});
  ASSERT_TRUE(served.resources.contains("nvidia.com/GH100_H100_NVSWITCH"));
  EXPECT_EQ(served.resources.at("nvidia.com/GH100_H100_NVSWITCH").devices.size(), 4u);
}

TEST_F(InspectTest, MixedNodeShowsTwoResourcesAlreadyBound) {
  StartNode("a10-t4-mixed.json");
  rpt::InspectReport report = Inspect();
  EXPECT_TRUE(report.ready());
  std::map<std::string, int> per_resource;
  for (const auto& fn : report.functions()) {
    EXPECT_EQ(fn.action(), rpt::ALREADY_BOUND) << fn.bdf();
    ++per_resource[fn.resource_name()];
  }
  EXPECT_EQ(per_resource, (std::map<std::string, int>{{"nvidia.com/GA102GL_A10", 2}, {"nvidia.com/TU104GL_TESLA_T4", 2}}));
}

TEST_F(InspectTest, WorkstationCompanionsTravelWithTheirGpu) {
  StartNode("workstation-gpu-audio-usb.json");
  rpt::InspectReport report = Inspect();
  auto fns = ByBdf(report);
  ASSERT_EQ(fns.size(), 4u);
  EXPECT_EQ(fns["0000:01:00.0"]->role(), rpt::GPU);
  for (const char* companion : {"0000:01:00.1", "0000:01:00.2", "0000:01:00.3"}) {
    ASSERT_TRUE(fns.count(companion)) << companion;
    EXPECT_EQ(fns[companion]->role(), rpt::COMPANION) << companion;
    EXPECT_EQ(fns[companion]->action(), rpt::WOULD_BIND) << companion;
    EXPECT_TRUE(fns[companion]->resource_name().empty()) << "companions are never advertised: " << companion;
  }
  ASSERT_EQ(report.groups_size(), 1);
  EXPECT_EQ(report.groups(0).id(), 12);
  EXPECT_EQ(report.groups(0).members_size(), 4);
  EXPECT_FALSE(report.groups(0).viable());  // not until the companions leave snd_hda_intel/xhci_hcd
  EXPECT_TRUE(report.ready());
  EXPECT_THAT(FormatInspectText(report), HasSubstr("group 12"));
}

TEST_F(InspectTest, ForeignNicBlocksItsGroupOnlyAndNamesTheCulprit) {
  StartNode("gpu-foreign-nic.json");
  rpt::InspectReport report = Inspect();
  EXPECT_FALSE(report.ready());
  auto fns = ByBdf(report);
  ASSERT_TRUE(fns.count("0000:3b:00.0"));
  EXPECT_EQ(fns["0000:3b:00.0"]->action(), rpt::BLOCKED);
  EXPECT_THAT(fns["0000:3b:00.0"]->reason(), HasSubstr("0000:3c:00.0"));
  EXPECT_EQ(fns["0000:86:00.0"]->action(), rpt::WOULD_BIND);
  bool blocker_named = false;
  for (const auto& group : report.groups()) {
    for (const auto& b : group.blockers()) blocker_named |= b.find("0000:3c:00.0 8086:1572 bound to i40e") != std::string::npos;
  }
  EXPECT_TRUE(blocker_named);
}

TEST_F(InspectTest, BridgeInTheGroupDoesNotBlock) {
  StartNode("gpu-behind-bridge.json");
  rpt::InspectReport report = Inspect();
  EXPECT_TRUE(report.ready());
  ASSERT_EQ(report.groups_size(), 1);
  bool saw_bridge = false;
  for (const auto& m : report.groups(0).members()) saw_bridge |= m.role() == rpt::BRIDGE;
  EXPECT_TRUE(saw_bridge);
  EXPECT_EQ(ByBdf(report)["0000:5e:00.0"]->resource_name(), "nvidia.com/GA100_A100_PCIE_80GB");
}

TEST_F(InspectTest, IommuOffBlocksEverythingAndSaysWhy) {
  StartNode("iommu-off.json");
  rpt::InspectReport report = Inspect();
  EXPECT_FALSE(report.iommu_enabled());
  EXPECT_FALSE(report.ready());
  ASSERT_EQ(report.functions_size(), 2);
  for (const auto& fn : report.functions()) {
    EXPECT_EQ(fn.action(), rpt::BLOCKED);
    EXPECT_EQ(fn.iommu_group(), -1);
    EXPECT_EQ(fn.resource_name(), "nvidia.com/TU104GL_TESLA_T4");
  }
  EXPECT_THAT(report.summary(), HasSubstr("IOMMU is off"));
}

TEST_F(InspectTest, BinaryExitCodesAndJsonRoundTrip) {
  StartNode("gpu-foreign-nic.json");
  auto [code, out] = RunBinary("inspect --json");
  EXPECT_EQ(code, 1) << out;
  rpt::InspectReport parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out, &parsed).ok()) << out;
  EXPECT_EQ(parsed.schema(), kInspectSchema);
  EXPECT_EQ(parsed.functions_size(), 2);
  // Field names are the documented lowerCamelCase ones.
  EXPECT_THAT(out, HasSubstr("\"resourceName\": \"nvidia.com/GA102GL_A10\""));
  EXPECT_THAT(out, HasSubstr("\"action\": \"BLOCKED\""));

  auto [help_code, help] = RunBinary("inspect --help");
  EXPECT_EQ(help_code, 0);
  EXPECT_THAT(help, HasSubstr("--sysfs-root"));
  EXPECT_EQ(RunBinary("inspect --no-such-flag").first, 2);
}

// A vm-vgpu node binds nothing: `inspect` lists the vGPUs under the names the device plugin and the DRA driver give
// them, every GPU stays on nvidia, and `bind` says it binds nothing, writes nothing and exits 0.
TEST_F(InspectTest, VgpuWorkloadListsTheServedVgpusAndBindBindsNothing) {
  StartNode("vgpu-mdev-t4-a10.json");
  const std::string uuids[] = {"4b3e2c1a-0000-4000-8000-00000000000a", "4b3e2c1a-0000-4000-8000-00000000000b"};
  for (const std::string& uuid : uuids) {  // two T4-1Q, as `run --vgpu-config` makes them
    std::ofstream(options_.paths.sysfs_root / "class/mdev_bus/0000:3b:00.0/mdev_supported_types/nvidia-230/create")
        << uuid;
  }
  options_.workload = Workload::kVmVgpu;
  const rpt::InspectReport report = Inspect();
  EXPECT_EQ(report.workload(), "vm-vgpu");
  ASSERT_EQ(report.vgpus_size(), 2);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(report.vgpus(i).id(), uuids[i]);
    EXPECT_EQ(report.vgpus(i).framework(), "mdev");
    EXPECT_EQ(report.vgpus(i).resource_name(), "nvidia.com/GRID_T4-1Q");
    EXPECT_EQ(report.vgpus(i).dra_device(), "mdev-" + uuids[i]);
    EXPECT_EQ(report.vgpus(i).gpu(), "0000:3b:00.0");
  }
  for (const auto& fn : report.functions()) EXPECT_EQ(fn.action(), rpt::STAYS) << fn.bdf();
  EXPECT_TRUE(report.ready());
  const std::string text = FormatInspectText(report);
  EXPECT_THAT(text, ::testing::Not(HasSubstr("would bind")));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("can be passed through")));
  EXPECT_THAT(text, HasSubstr("nothing is bound on a vm-vgpu node"));

  auto [inspect_code, inspect_out] = RunBinary("inspect --workload vm-vgpu");
  EXPECT_EQ(inspect_code, 0) << inspect_out;
  EXPECT_THAT(inspect_out, HasSubstr("mdev-" + uuids[0]));
  EXPECT_THAT(inspect_out, ::testing::Not(HasSubstr("would bind")));

  const size_t writes = sim_->Log().size();
  auto [code, out] = RunBinary("bind --workload vm-vgpu");
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("nothing to bind on a vm-vgpu node"));
  EXPECT_THAT(out, HasSubstr(uuids[1]));
  EXPECT_THAT(out, HasSubstr("nvidia.com/GRID_T4-1Q"));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("nvidia -> vfio-pci")));
  EXPECT_EQ(sim_->Log().size(), writes);  // nothing written, the GPUs still on nvidia
}

// SR-IOV vGPUs are listed by their VF, under the DRA driver's vgpu-<address> name (a card with room left, whose
// catalog the VFs list; a full card's names come from the agent's state dir, --state-dir).
TEST_F(InspectTest, VgpuWorkloadListsSriovVgpusByTheirVf) {
  StartNode("vgpu-sriov-l40s-h200.json");
  const std::filesystem::path pf = options_.paths.sysfs_root / "bus/pci/devices/0000:86:00.0";
  std::ofstream(pf / "sriov_numvfs") << "2";
  const std::string vf = std::filesystem::read_symlink(pf / "virtfn0").filename().string();
  std::ofstream(options_.paths.sysfs_root / "bus/pci/devices" / vf / "nvidia/current_vgpu_type") << "1414";
  options_.workload = Workload::kVmVgpu;
  const rpt::InspectReport report = Inspect();
  ASSERT_EQ(report.vgpus_size(), 1) << FormatInspectText(report);
  EXPECT_EQ(report.vgpus(0).id(), vf);
  EXPECT_EQ(report.vgpus(0).framework(), "sriov");
  EXPECT_EQ(report.vgpus(0).resource_name(), "nvidia.com/NVIDIA_H200X-1-18C");
  EXPECT_EQ(report.vgpus(0).dra_device(), dra::VfDeviceName(vf));
  EXPECT_EQ(report.vgpus(0).gpu(), "0000:86:00.0");
}

TEST_F(InspectTest, BinaryExitsZeroOnAPassableNode) {
  StartNode("a10x2-nvidia.json");
  auto [code, out] = RunBinary("inspect");
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("nvidia.com/GA102GL_A10"));
}

// `inspect` prints the names `serve` advertises, whichever GPUs are on vfio at the time: here two operator
// names collide, and only one of the two GPUs is on vfio-pci yet.
TEST(InspectNamesTest, InspectPrintsTheNamesServeAdvertises) {
  vfio_agent::testing::TempDir dir;
  vfio_agent::testing::SysfsTree tree(dir.path() / "sys");
  tree.AddDevice({.bdf = "0000:3b:00.0", .device = 0x2335, .driver = "vfio-pci", .iommu_group = 12});
  tree.AddDevice({.bdf = "0000:5d:00.0", .device = 0x2330, .driver = "nvidia", .iommu_group = 13});
  CommonOptions options;
  options.paths.sysfs_root = tree.root();
  options.paths.dev_root = dir.path() / "dev";
  options.paths.modules_root = dir.path() / "no-modules";
  std::filesystem::create_directories(options.paths.dev_root / "vfio");
  std::ofstream(options.paths.dev_root / "vfio" / "12") << "";
  options.name_overrides = {{0x10de, 0x2335, "HOPPER"}, {0x10de, 0x2330, "HOPPER"}};

  auto report = BuildInspectReport(options, nullptr);
  ASSERT_TRUE(report.ok()) << report.status();
  auto inventory = pci::Scan(options.paths.sysfs_root);
  ASSERT_TRUE(inventory.ok()) << inventory.status();
  const names::NameResolver serve_names(nullptr, options.resource_domain, options.name_overrides);
  const plugin::DeviceSnapshot served = plugin::BuildSnapshot(
      options.paths, *inventory, pci::Select(*inventory, options.policy), serve_names, {});
  ASSERT_EQ(served.resources.size(), 1u);
  const std::string served_name = served.resources.begin()->first;
  EXPECT_NE(served.resources.begin()->second.Find("0000:3b:00.0"), nullptr);
  EXPECT_EQ(ByBdf(*report)["0000:3b:00.0"]->resource_name(), served_name);
  EXPECT_EQ(ByBdf(*report)["0000:5d:00.0"]->resource_name(), "nvidia.com/HOPPER_2330");
}

// The real /sys of this machine, read-only: inspect lists exactly the NVIDIA display functions (and their
// group companions) that an independent reading of the vendor and class files finds, each GPU with a valid
// resource name, whether this machine has none (a VM whose disk and NIC are PCI devices) or several.
TEST(InspectRealSysfsTest, ReadOnlyRunOnThisMachineListsItsNvidiaGpusAndNothingElse) {
  if (!std::filesystem::exists("/sys/bus/pci/devices")) GTEST_SKIP() << "no PCI bus in /sys here";
  std::set<std::string> gpus;
  for (const auto& entry : std::filesystem::directory_iterator("/sys/bus/pci/devices")) {
    std::string vendor, klass;
    std::ifstream(entry.path() / "vendor") >> vendor;
    std::ifstream(entry.path() / "class") >> klass;
    if (vendor == "0x10de" && (klass.starts_with("0x0300") || klass.starts_with("0x0302"))) {
      gpus.insert(entry.path().filename().string());
    }
  }
  CommonOptions options;  // defaults: /sys, /dev, /lib/modules
  auto report = BuildInspectReport(options, nullptr);
  ASSERT_TRUE(report.ok()) << report.status();
  std::set<std::string> listed_gpus;
  for (const auto& fn : report->functions()) {
    if (fn.role() != rpt::GPU) {
      EXPECT_EQ(fn.role(), rpt::COMPANION) << fn.bdf();
      EXPECT_EQ(fn.vendor_id(), "10de") << fn.bdf();
      continue;
    }
    listed_gpus.insert(fn.bdf());
    EXPECT_TRUE(names::ValidateExtendedResourceName(fn.resource_name()).ok()) << fn.bdf() << " " << fn.resource_name();
    EXPECT_THAT(fn.resource_name(), ::testing::StartsWith("nvidia.com/"));
  }
  EXPECT_EQ(listed_gpus, gpus);
  if (gpus.empty()) {
    EXPECT_TRUE(report->ready());
    EXPECT_THAT(report->summary(), HasSubstr("nothing to pass through"));
  }
}

}  // namespace
}  // namespace vfio_agent::cli
