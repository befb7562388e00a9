// Layer 2 (devices): per GPU and per IOMMU group, each failure mode on a simulated node fails (or warns) exactly
// its check, with that check's fix.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include "host_node.h"
#include "vfio_gpu_agent/common/fs.h"

namespace vfio_agent::validation::testing {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::UnorderedElementsAre;

constexpr char kGpu[] = "0000:18:00.0";  // group 11

// With --nvswitches a GPU off vfio also breaks the whole board for the one VM meant to get it (nvswitch.passthrough).
TEST(HostDeviceTest, GpuOnItsHostDriverFailsDeviceDriverAndTheBoard) {
  auto node = BoundH200();
  ASSERT_TRUE(node->sim->Control(absl::StrCat("set-driver ", kGpu, " nvidia")).ok());
  const rpt::ValidateReport report = node->Validate(true);
  EXPECT_THAT(Problems(report),
              UnorderedElementsAre(absl::StrCat("FAIL device.driver ", kGpu), "FAIL nvswitch.passthrough node"));
  const rpt::Check* check = FindCheck(report, "device.driver", kGpu);
  EXPECT_THAT(check->fix(), HasSubstr(absl::StrCat("vfio-gpu-agent bind --device ", kGpu)));
  EXPECT_THAT(check->fix(), HasSubstr("nvidia-persistenced"));
  EXPECT_EQ(FindCheck(report, "group.devnode", "group 11")->result(), rpt::SKIP);

  // A CUDA process holding the GPU's node is named, with its pid, in the evidence and the fix.
  const std::filesystem::path proc = node->paths.proc_root / "4242";
  std::filesystem::create_directories(proc / "fd");
  std::ofstream(proc / "comm") << "cuda-app\n";
  std::filesystem::create_symlink(node->paths.dev_root / "nvidia0", proc / "fd/3");
  const rpt::ValidateReport held = node->Validate(true);
  const rpt::Check* with_holder = FindCheck(held, "device.driver", kGpu);
  EXPECT_THAT(with_holder->fix(), HasSubstr("pid 4242 (cuda-app)"));
  EXPECT_THAT(with_holder->evidence(2).value(), HasSubstr("nvidia0 open"));
  EXPECT_FALSE(report.host_ready());
}

TEST(HostDeviceTest, ForeignEndpointInTheGroupIsAnAcsProblem) {
  auto node = HostNode::Start("gpu-foreign-nic.json");
  ASSERT_TRUE(node.ok()) << node.status();
  ASSERT_TRUE((*node)->BindNvidia(false).ok());
  const rpt::ValidateReport report = (*node)->Validate();
  EXPECT_THAT(Problems(report), ElementsAre("FAIL group.viable group 30"));
  const rpt::Check* check = FindCheck(report, "group.viable", "group 30");
  EXPECT_THAT(check->message(), HasSubstr("foreign endpoint 0000:3c:00.0 8086:1572 class 020000 on i40e"));
  EXPECT_THAT(check->message(), HasSubstr("ACS"));
  EXPECT_THAT(check->fix(), HasSubstr("slot"));
}

TEST(HostDeviceTest, CompanionOnAHostDriverIsFixedByBind) {
  auto node = HostNode::Start("workstation-gpu-audio-usb.json");
  ASSERT_TRUE(node.ok()) << node.status();
  ASSERT_TRUE((*node)->BindNvidia(false).ok());  // the GPU alone; audio, USB and UCSI stay on their drivers
  const rpt::ValidateReport report = (*node)->Validate();
  EXPECT_THAT(Problems(report), ElementsAre("FAIL group.viable group 12"));
  const rpt::Check* check = FindCheck(report, "group.viable", "group 12");
  EXPECT_THAT(check->message(), HasSubstr("0000:01:00.1 10de:"));
  EXPECT_THAT(check->message(), HasSubstr("snd_hda_intel"));
  EXPECT_THAT(check->fix(), HasSubstr("vfio-gpu-agent bind"));
}

TEST(HostDeviceTest, BridgeInTheGroupIsJudgedByHeaderTypeAndDoesNotBlock) {
  auto node = HostNode::Start("gpu-behind-bridge.json");
  ASSERT_TRUE(node.ok()) << node.status();
  ASSERT_TRUE((*node)->BindNvidia(false).ok());
  const rpt::ValidateReport report = (*node)->Validate();
  EXPECT_THAT(Problems(report), IsEmpty());
  EXPECT_THAT(FindCheck(report, "group.viable", "group 40")->evidence(0).value(), HasSubstr("on pcieport"));
}

TEST(HostDeviceTest, EndpointWithABridgeClassButHeaderType0BlocksTheGroup) {
  // An NVSwitch-like endpoint of another vendor: class 0x0604 is not enough to be waved through.
  auto node = HostNode::Start("gpu-behind-bridge.json", [](Json& n) {
    n["drivers"].push_back("fakebridge");
    n["devices"].push_back({{"bdf", "0000:5e:00.1"}, {"vendor", "1d0f"}, {"device", "0001"}, {"class", "060400"},
                            {"header_type", 0}, {"iommu_group", 40}, {"driver", "fakebridge"}, {"parent", "0000:5d:00.0"}});
  });
  ASSERT_TRUE(node.ok()) << node.status();
  ASSERT_TRUE((*node)->BindNvidia(false).ok());
  const rpt::ValidateReport report = (*node)->Validate();
  EXPECT_THAT(Problems(report), ElementsAre("FAIL group.viable group 40"));
  EXPECT_THAT(FindCheck(report, "group.viable", "group 40")->message(), HasSubstr("0000:5e:00.1 1d0f:0001"));
}

TEST(HostDeviceTest, MissingGroupNodeFailsGroupDevnode) {
  auto node = BoundH200();
  ASSERT_TRUE(std::filesystem::remove(node->paths.dev_root / "vfio/11"));
  const rpt::ValidateReport report = node->Validate(true);
  EXPECT_THAT(Problems(report), ElementsAre("FAIL group.devnode group 11"));
  EXPECT_THAT(FindCheck(report, "group.devnode", "group 11")->fix(), HasSubstr("hostPath /dev"));
}

TEST(HostDeviceTest, OverrideLeftWithoutADriverIsAStrandedBind) {
  auto node = BoundH200();
  ASSERT_TRUE(node->sim->Control(absl::StrCat("set-driver ", kGpu, " none")).ok());
  ASSERT_TRUE(fs::WriteAttribute(node->paths.PciDevice(kGpu) / "driver_override", "vfio-pci").ok());
  const rpt::ValidateReport report = node->Validate(true);
  EXPECT_THAT(Problems(report), UnorderedElementsAre(absl::StrCat("FAIL device.stranded_override ", kGpu),
                                                     absl::StrCat("FAIL device.driver ", kGpu),
                                                     "FAIL nvswitch.passthrough node"));
  const rpt::Check* check = FindCheck(report, "device.stranded_override", kGpu);
  EXPECT_THAT(check->message(), HasSubstr("driver_override=vfio-pci but no driver"));
  EXPECT_THAT(check->fix(), HasSubstr("drivers_probe"));
  EXPECT_EQ(FindCheck(report, "device.stranded_override", "node"), nullptr);
}

TEST(HostDeviceTest, UnassignedBarFailsDeviceBars) {
  auto node = BoundH200([](Json& n) { Device(n, kGpu)["bars"][1]["unassigned"] = true; });
  const rpt::ValidateReport report = node->Validate(true);
  EXPECT_THAT(Problems(report), ElementsAre(absl::StrCat("FAIL device.bars ", kGpu)));
  const rpt::Check* check = FindCheck(report, "device.bars", kGpu);
  EXPECT_THAT(check->message(), HasSubstr("BAR1 (256 GiB)"));
  EXPECT_THAT(check->fix(), HasSubstr("Above 4G Decoding"));
  EXPECT_THAT(check->fix(), HasSubstr("pci=realloc"));
}

TEST(HostDeviceTest, D3coldWarnsWithoutWakingTheGpu) {
  auto node = BoundH200([](Json& n) { Device(n, kGpu)["power_state"] = "D3cold"; });
  const rpt::ValidateReport report = node->Validate(true);
  EXPECT_THAT(Problems(report), ElementsAre(absl::StrCat("WARN device.power_state ", kGpu)));
  const rpt::Check* check = FindCheck(report, "device.power_state", kGpu);
  EXPECT_THAT(check->fix(), HasSubstr("disable_idle_d3=1"));
  EXPECT_THAT(check->fix(), HasSubstr("d3cold_allowed"));
  // The sim wakes a device whose config space is read, as the kernel does; nothing read it.
  EXPECT_THAT(node->sim->Log(), Not(Contains(absl::StrCat("wake ", kGpu))));
  EXPECT_EQ(fs::ReadTrimmed(node->paths.PciDevice(kGpu) / "power_state").value_or(""), "D3cold");
  EXPECT_TRUE(report.host_ready());
}

TEST(HostDeviceTest, ConfigReadWakesAD3coldGpuInTheSimulator) {
  // The premise of the test above: a config read would have shown up.
  auto node = BoundH200([](Json& n) { Device(n, kGpu)["power_state"] = "D3cold"; });
  int fd = ::open((node->paths.PciDevice(kGpu) / "config").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ::close(fd);
  EXPECT_THAT(node->sim->Log(), Contains(absl::StrCat("wake ", kGpu)));
  EXPECT_EQ(fs::ReadTrimmed(node->paths.PciDevice(kGpu) / "power_state").value_or(""), "D0");
}

TEST(HostDeviceTest, DeviceOffTheBusFailsPowerState) {
  auto node = BoundH200([](Json& n) { Device(n, kGpu)["faults"]["dead"] = true; });
  const rpt::ValidateReport report = node->Validate(true);
  EXPECT_THAT(Problems(report), ElementsAre(absl::StrCat("FAIL device.power_state ", kGpu)));
  EXPECT_THAT(FindCheck(report, "device.power_state", kGpu)->message(), HasSubstr("0xffff"));
  EXPECT_THAT(FindCheck(report, "device.power_state", kGpu)->fix(), HasSubstr("Reboot"));
}

TEST(HostDeviceTest, NoResetMethodWarns) {
  auto node = BoundH200([](Json& n) { Device(n, kGpu)["reset_method"] = ""; });
  const rpt::ValidateReport report = node->Validate(true);
  EXPECT_THAT(Problems(report), ElementsAre(absl::StrCat("WARN device.reset_method ", kGpu)));
  EXPECT_THAT(FindCheck(report, "device.reset_method", kGpu)->fix(), HasSubstr("one VM"));
}

TEST(HostDeviceTest, SriovVfsOnAPassthroughGpuFailOneModePerNode) {
  auto node = BoundH200([](Json& n) {
    Device(n, kGpu)["sriov_totalvfs"] = 16;
    n["devices"].push_back({{"bdf", "0000:18:00.4"}, {"vendor", "10de"}, {"device", "2335"}, {"class", "030200"},
                            {"iommu_group", 90}, {"physfn", kGpu}, {"parent", "0000:17:00.0"}});
  });
  const rpt::ValidateReport report = node->Validate(true);
  EXPECT_THAT(Problems(report), ElementsAre(absl::StrCat("FAIL device.sriov_mode ", kGpu)));
  const rpt::Check* check = FindCheck(report, "device.sriov_mode", kGpu);
  EXPECT_THAT(check->message(), HasSubstr("1 SR-IOV VFs enabled"));
  EXPECT_THAT(check->fix(), HasSubstr("One mode per node"));
}

TEST(HostDeviceTest, MdevParentFailsOneModePerNode) {
  auto node = BoundH200([](Json& n) { Device(n, kGpu)["mdev"] = true; });
  const rpt::ValidateReport report = node->Validate(true);
  EXPECT_THAT(Problems(report), ElementsAre(absl::StrCat("FAIL device.sriov_mode ", kGpu)));
  EXPECT_THAT(FindCheck(report, "device.sriov_mode", kGpu)->message(), HasSubstr("mdev parent"));
}

TEST(HostDeviceTest, NvSwitchesLeftOnTheHostWithoutFabricManagerWarn) {
  auto node = HostNode::Start(kH200Node);
  ASSERT_TRUE(node.ok()) << node.status();
  ASSERT_TRUE((*node)->BindNvidia(/*nvswitches=*/false).ok());
  rpt::ValidateReport report = (*node)->Validate();
  EXPECT_THAT(Problems(report), ElementsAre("WARN nvswitch.passthrough node"));
  EXPECT_THAT(FindCheck(report, "nvswitch.passthrough", "node")->fix(), HasSubstr("--nvswitches"));
  EXPECT_THAT(FindCheck(report, "nvswitch.passthrough", "node")->fix(), HasSubstr("Fabric Manager"));

  // Shared-NVSwitch model: Fabric Manager runs on the host.
  const std::filesystem::path fm = (*node)->paths.proc_root / "4242";
  std::filesystem::create_directories(fm);
  std::ofstream(fm / "comm") << "nv-fabricmanage\n";
  report = (*node)->Validate();
  EXPECT_THAT(Problems(report), IsEmpty());
  EXPECT_THAT(FindCheck(report, "nvswitch.passthrough", "node")->message(), HasSubstr("Fabric Manager running"));
  // Fabric Manager on the node is this model's, not a fault: only full passthrough checks for it.
  EXPECT_EQ(FindCheck(report, "nvswitch.fabric_manager", "node"), nullptr);
}

// --- full passthrough (--nvswitches, FABRIC_MODE=0): one VM gets the whole board and runs Fabric Manager ---

TEST(HostDeviceTest, FullPassthroughPassesWithTheWholeBoardOnVfioAndNoFabricManager) {
  auto node = BoundH200();
  const rpt::ValidateReport report = node->Validate(/*nvswitches=*/true);
  EXPECT_THAT(Problems(report), IsEmpty());
  EXPECT_THAT(FindCheck(report, "nvswitch.passthrough", "node")->message(),
              HasSubstr("full passthrough: 8 GPUs and 4 NVSwitches on vfio"));
  EXPECT_EQ(FindCheck(report, "nvswitch.fabric_manager", "node")->result(), rpt::PASS);
  // The four switches are one IOMMU group, judged as one.
  EXPECT_EQ(FindCheck(report, "group.viable", "group 40")->result(), rpt::PASS);
  EXPECT_EQ(FindCheck(report, "group.devnode", "group 40")->result(), rpt::PASS);
}

TEST(HostDeviceTest, FullPassthroughFailsWhileOneSwitchIsOnTheHost) {
  auto node = BoundH200();
  ASSERT_TRUE(node->sim->Control("set-driver 0000:07:00.0 nvidia").ok());
  const rpt::ValidateReport report = node->Validate(/*nvswitches=*/true);
  EXPECT_THAT(Problems(report), UnorderedElementsAre("FAIL device.driver 0000:07:00.0", "FAIL nvswitch.passthrough node"));
  const rpt::Check* check = FindCheck(report, "nvswitch.passthrough", "node");
  EXPECT_THAT(check->message(), HasSubstr("0 of 8 GPUs and 1 of 4 NVSwitches are not (0000:07:00.0 on nvidia)"));
  EXPECT_THAT(check->message(), HasSubstr("Fabric Manager cannot bring NVLink up"));
  EXPECT_THAT(check->fix(), HasSubstr("vfio-gpu-agent bind --nvswitches"));
  EXPECT_THAT(check->fix(), HasSubstr("one VM every GPU and NVSwitch"));
  // The same node without --nvswitches: the switches are not the agent's to judge one by one.
  EXPECT_EQ(FindCheck(node->Validate(/*nvswitches=*/false), "nvswitch.passthrough", "node")->result(), rpt::WARN);
}

TEST(HostDeviceTest, FullPassthroughNamesAGpuLeftOnTheHost) {
  auto node = BoundH200();
  ASSERT_TRUE(node->sim->Control("set-driver 0000:db:00.0 none").ok());
  const rpt::ValidateReport report = node->Validate(/*nvswitches=*/true);
  const rpt::Check* check = FindCheck(report, "nvswitch.passthrough", "node");
  EXPECT_EQ(check->result(), rpt::FAIL);
  EXPECT_THAT(check->message(), HasSubstr("1 of 8 GPUs and 0 of 4 NVSwitches are not (0000:db:00.0 on (no driver))"));
}

TEST(HostDeviceTest, FullPassthroughFailsWithFabricManagerOnTheNode) {
  auto node = BoundH200();
  const std::filesystem::path fm = node->paths.proc_root / "4242";
  std::filesystem::create_directories(fm);
  std::ofstream(fm / "comm") << "nv-fabricmanage\n";
  const rpt::ValidateReport report = node->Validate(/*nvswitches=*/true);
  EXPECT_THAT(Problems(report), ElementsAre("FAIL nvswitch.fabric_manager node"));
  const rpt::Check* check = FindCheck(report, "nvswitch.fabric_manager", "node");
  EXPECT_THAT(check->message(), HasSubstr("pid 4242) runs on the node"));
  EXPECT_EQ(check->evidence(0).value(), "nv-fabricmanager pid 4242");
  EXPECT_THAT(check->fix(), HasSubstr("systemctl disable --now nvidia-fabricmanager"));
  EXPECT_THAT(check->fix(), HasSubstr("without --nvswitches"));
}

TEST(HostDeviceTest, BigBarsBeyondTheAddressSpaceWarnWithKubevirtsMmioFix) {
  auto node = BoundH200([](Json& n) { n["platform"]["phys_bits"] = 40; });
  const rpt::ValidateReport report = node->Validate(true);
  EXPECT_THAT(Problems(report), ElementsAre("WARN device.mmio_window node"));
  const rpt::Check* check = FindCheck(report, "device.mmio_window", "node");
  EXPECT_THAT(check->message(), HasSubstr("2048.25 GiB"));
  EXPECT_THAT(check->fix(), HasSubstr("host-passthrough"));
  EXPECT_THAT(check->fix(), HasSubstr("X-PciMmio64Mb"));
}

}  // namespace
}  // namespace vfio_agent::validation::testing
