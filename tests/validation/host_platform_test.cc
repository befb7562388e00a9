// Layer 1 (platform): the healthy bound 8x H200 node passes every host check; each broken node fails (or warns)
// exactly the check of its failure mode, with that check's fix.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "host_node.h"

namespace vfio_agent::validation::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAreArray;

TEST(HostPlatformTest, HealthyBoundH200NodePassesEveryHostCheck) {
  auto node = BoundH200();
  const rpt::ValidateReport report = node->Validate(/*nvswitches=*/true);
  EXPECT_THAT(Problems(report), IsEmpty());
  EXPECT_EQ(report.counts().skip(), 0);
  EXPECT_TRUE(report.host_ready());
  EXPECT_TRUE(report.ok());
  // Every check id of layers 1-2 ran; per GPU the five device checks.
  std::set<std::string> ids;
  for (const auto& check : report.checks()) ids.insert(check.id());
  EXPECT_THAT(ids, UnorderedElementsAreArray({"iommu.enabled", "iommu.interrupt_remapping", "vfio.modules",
                                               "vfio.container_node", "iommufd", "kernel.lockdown", "host_drivers",
                                               "device.driver", "device.sriov_mode", "device.bars", "device.power_state",
                                               "device.reset_method", "group.viable", "group.devnode",
                                               "device.stranded_override", "nvswitch.passthrough",
                                               "nvswitch.fabric_manager", "device.mmio_window"}));
  for (const std::string& bdf : H200Gpus()) {
    const rpt::Check* driver = FindCheck(report, "device.driver", bdf);
    ASSERT_NE(driver, nullptr) << bdf;
    EXPECT_EQ(driver->result(), rpt::PASS);
  }
}

TEST(HostPlatformTest, IommuOffInTheBiosFailsIommuEnabledWithTheBiosFix) {
  auto node = HostNode::Start("iommu-off.json", [](Json& n) { n["platform"]["acpi_table"] = false; });
  ASSERT_TRUE(node.ok()) << node.status();
  const rpt::ValidateReport report = (*node)->Validate();
  // Without an IOMMU vfio-pci cannot take the GPUs: they stay on nvidia, which device.driver reports.
  EXPECT_THAT(Problems(report), UnorderedElementsAreArray({"FAIL iommu.enabled node", "FAIL device.driver 0000:3b:00.0",
                                                           "FAIL device.driver 0000:d8:00.0"}));
  const rpt::Check* check = FindCheck(report, "iommu.enabled", "node");
  EXPECT_THAT(check->message(), HasSubstr("no DMAR table"));
  EXPECT_THAT(check->fix(), HasSubstr("Enable VT-d"));
  EXPECT_THAT(check->fix(), HasSubstr("intel_iommu=on iommu=pt"));
  EXPECT_EQ(FindCheck(report, "iommu.interrupt_remapping", "node")->result(), rpt::SKIP);
  EXPECT_FALSE(report.host_ready());
}

TEST(HostPlatformTest, IommuOffOnTheCommandLineNamesTheKernelParameter) {
  auto node = HostNode::Start("iommu-off.json", [](Json& n) {
    n["platform"]["cmdline"] = "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro intel_iommu=off";
  });
  ASSERT_TRUE(node.ok()) << node.status();
  const rpt::ValidateReport report = (*node)->Validate();
  const rpt::Check* check = FindCheck(report, "iommu.enabled", "node");
  ASSERT_NE(check, nullptr);
  EXPECT_EQ(check->result(), rpt::FAIL);
  EXPECT_THAT(check->message(), HasSubstr("says intel_iommu=off"));
  EXPECT_THAT(check->fix(), HasSubstr("Replace it with intel_iommu=on iommu=pt"));
}

TEST(HostPlatformTest, NoInterruptRemappingFailsWithTheBiosFix) {
  auto node = BoundH200([](Json& n) { n["platform"]["interrupt_remapping"] = false; });
  const rpt::ValidateReport report = node->Validate(true);
  EXPECT_THAT(Problems(report), ElementsAre("FAIL iommu.interrupt_remapping node"));
  const rpt::Check* check = FindCheck(report, "iommu.interrupt_remapping", "node");
  EXPECT_THAT(check->message(), HasSubstr("No interrupt remapping support"));
  EXPECT_THAT(check->fix(), HasSubstr("x2APIC"));
  EXPECT_THAT(check->evidence(0).value(), HasSubstr("IR bit 3 clear"));
}

TEST(HostPlatformTest, AllowUnsafeInterruptsTurnsMissingRemappingIntoAWarning) {
  auto node = BoundH200([](Json& n) {
    n["platform"]["interrupt_remapping"] = false;
    n["platform"]["allow_unsafe_interrupts"] = true;
  });
  const rpt::ValidateReport report = node->Validate(true);
  EXPECT_THAT(Problems(report), ElementsAre("WARN iommu.interrupt_remapping node"));
  EXPECT_THAT(FindCheck(report, "iommu.interrupt_remapping", "node")->fix(), HasSubstr("allow_unsafe_interrupts"));
  EXPECT_TRUE(report.ok());
}

TEST(HostPlatformTest, MissingVfioModuleFailsVfioModules) {
  auto node = BoundH200([](Json& n) { n["platform"]["missing_modules"] = Json::array({"vfio_iommu_type1"}); });
  const rpt::ValidateReport report = node->Validate(true);
  EXPECT_THAT(Problems(report), ElementsAre("FAIL vfio.modules node"));
  const rpt::Check* check = FindCheck(report, "vfio.modules", "node");
  EXPECT_THAT(check->message(), HasSubstr("vfio_iommu_type1"));
  EXPECT_THAT(check->fix(), HasSubstr("/etc/modules-load.d/vfio.conf"));
}

TEST(HostPlatformTest, ContainerNodeMustBeACharacterDevice) {
  auto node = BoundH200();
  const std::filesystem::path container = node->paths.dev_root / "vfio/vfio";
  ASSERT_TRUE(std::filesystem::remove(container));
  rpt::ValidateReport report = node->Validate(true);
  EXPECT_THAT(Problems(report), ElementsAre("FAIL vfio.container_node node"));
  EXPECT_THAT(FindCheck(report, "vfio.container_node", "node")->fix(), HasSubstr("hostPath /dev"));

  std::ofstream(container) << "";  // a plain file where the device node should be
  report = node->Validate(true);
  EXPECT_THAT(Problems(report), ElementsAre("FAIL vfio.container_node node"));
  EXPECT_THAT(FindCheck(report, "vfio.container_node", "node")->message(), HasSubstr("not a character device"));
}

TEST(HostPlatformTest, IommufdHostIsNoted) {
  auto node = BoundH200([](Json& n) { n["platform"]["iommufd"] = true; });
  const rpt::ValidateReport report = node->Validate(true);
  EXPECT_THAT(Problems(report), IsEmpty());
  EXPECT_THAT(FindCheck(report, "iommufd", "node")->message(), HasSubstr("iommufd available"));
}

TEST(HostPlatformTest, CdevOnlyIommufdHostNeedsNoGroupNodes) {
  auto node = BoundH200([](Json& n) { n["platform"]["iommufd"] = true; });
  ASSERT_TRUE(std::filesystem::remove(node->paths.dev_root / "vfio/11"));
  const rpt::ValidateReport report = node->Validate(true);
  EXPECT_THAT(Problems(report), IsEmpty());
  EXPECT_THAT(FindCheck(report, "group.devnode", "group 11")->message(), HasSubstr("vfio cdev"));
}

TEST(HostPlatformTest, KernelLockdownIsNoted) {
  auto node = BoundH200([](Json& n) { n["platform"]["lockdown"] = "integrity"; });
  const rpt::ValidateReport report = node->Validate(true);
  EXPECT_THAT(Problems(report), IsEmpty());
  EXPECT_THAT(FindCheck(report, "kernel.lockdown", "node")->message(), HasSubstr("lockdown: integrity"));
}

TEST(HostPlatformTest, HostDriverOwningAGpuWarnsAndFailsThatDevice) {
  auto node = HostNode::Start(kH200Node, [](Json& n) {
    n["drivers"].push_back("nouveau");
    n["platform"]["modules"] = Json::array({"nvidiafb"});
    Device(n, "0000:18:00.0")["driver"] = "nouveau";
  });
  ASSERT_TRUE(node.ok()) << node.status();
  ASSERT_TRUE((*node)->BindNvidia(true).ok());
  ASSERT_TRUE((*node)->sim->Control("set-driver 0000:18:00.0 nouveau").ok());
  const rpt::ValidateReport report = (*node)->Validate(true);
  EXPECT_THAT(Problems(report), UnorderedElementsAreArray({"WARN host_drivers node", "FAIL device.driver 0000:18:00.0",
                                                           "FAIL nvswitch.passthrough node"}));
  EXPECT_THAT(FindCheck(report, "host_drivers", "node")->message(), HasSubstr("own 0000:18:00.0 (nouveau)"));
  EXPECT_THAT(FindCheck(report, "host_drivers", "node")->fix(), HasSubstr("blacklist nouveau"));
  EXPECT_EQ(FindCheck(report, "host_drivers", "node")->evidence(0).value(), "nvidia nouveau nvidiafb");
  EXPECT_THAT(FindCheck(report, "device.driver", "0000:18:00.0")->fix(), HasSubstr("blacklist nouveau"));
  EXPECT_EQ(FindCheck(report, "group.devnode", "group 11")->result(), rpt::SKIP);
}

// The host layers on this machine's real /sys, /dev and /proc, read-only: whatever the machine is, the report is
// complete and iommu.enabled agrees with the kernel's group directory.
TEST(HostPlatformTest, RealHostIsReadOnlyAndConsistent) {
  ValidateOptions options;
  options.layers = {Layer::kPlatform, Layer::kDevices};
  auto report = validation::Validate(options);
  ASSERT_TRUE(report.ok()) << report.status();
  const rpt::Check* iommu = FindCheck(*report, "iommu.enabled", "node");
  ASSERT_NE(iommu, nullptr);
  std::error_code ec;
  const bool groups = std::filesystem::directory_iterator("/sys/kernel/iommu_groups", ec) !=
                      std::filesystem::directory_iterator();
  EXPECT_EQ(iommu->result() == rpt::PASS, groups && !ec);
  const rpt::Counts& c = report->counts();
  EXPECT_EQ(c.pass() + c.warn() + c.fail() + c.skip(), report->checks_size());
  EXPECT_EQ(report->ok(), c.fail() == 0);
}

}  // namespace
}  // namespace vfio_agent::validation::testing
