// The taint each health reason the driver words today makes (taints.h): the kind's key, a label-valid value, the
// effect; and the None warnings read from sysfs.
#include "vfio_gpu_agent/dra/taints.h"

#include <fstream>
#include <regex>

#include <gtest/gtest.h>

#include "support/sysfs_tree.h"

namespace vfio_agent::dra {
namespace {

constexpr std::string_view kTaintDriver = "gpu.example.com";

std::string Describe(const kube::DeviceTaint& taint) { return taint.key + "=" + taint.value + ":" + taint.effect; }

TEST(DraTaintsTest, EachReasonTheCodeGivesHasItsKindsKeyAndAValueThatSaysWhich) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"driver nvidia", "gpu.example.com/not-vfio=nvidia:NoSchedule"},
      {"no driver", "gpu.example.com/not-vfio=none:NoSchedule"},
      {"no /dev/vfio/73", "gpu.example.com/not-vfio=no-node:NoSchedule"},
      {"no IOMMU group", "gpu.example.com/group-not-viable=none:NoSchedule"},
      {"IOMMU group 12 not viable: 0000:18:00.1 on snd_hda_intel", "gpu.example.com/group-not-viable=12:NoSchedule"},
      {"IOMMU group 12 cannot be bound to vfio-pci: x", "gpu.example.com/group-not-viable=12:NoSchedule"},
      {"gone from sysfs", "gpu.example.com/gone=sysfs:NoSchedule"},
      {"config space reads 0xffff (device off the bus)", "gpu.example.com/config-space=off-bus:NoSchedule"},
      {"config space unreadable: open ...: Input/output error", "gpu.example.com/config-space=unreadable:NoSchedule"},
      {"Fabric Manager at 127.0.0.1:6666 not usable: connect refused", "gpu.example.com/fabric-unvouched=fm-unusable:NoSchedule"},
      {"in no supported Fabric Manager partition", "gpu.example.com/fabric-unvouched=no-partition:NoSchedule"},
      {"now of type GRID A100-4C", "gpu.example.com/unhealthy=:NoSchedule"},
  };
  const std::regex label_value("^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$");
  for (const auto& [reason, taint] : cases) {
    const kube::DeviceTaint made = FailureTaint(kTaintDriver, reason);
    EXPECT_EQ(Describe(made), taint) << reason;
    EXPECT_TRUE(std::regex_match(made.value, label_value)) << made.value;
    EXPECT_LE(made.value.size(), 63u);
    EXPECT_NE(std::find(FailureTaintKeys(kTaintDriver).begin(), FailureTaintKeys(kTaintDriver).end(), made.key),
              FailureTaintKeys(kTaintDriver).end());
  }
  // A driver name with characters a label value cannot hold, cut to 63.
  EXPECT_EQ(FailureTaint(kTaintDriver, "driver " + std::string(80, 'x') + "/").value, std::string(63, 'x'));
}

TEST(DraTaintsTest, NoExecuteOnlyWhenAskedAndOnlyForAGoneDevice) {
  const TaintPolicy evict{.no_execute_when_gone = true};
  EXPECT_EQ(FailureTaint(kTaintDriver, "gone from sysfs", evict).effect, "NoExecute");
  EXPECT_EQ(FailureTaint(kTaintDriver, "config space reads 0xffff (device off the bus)", evict).effect, "NoExecute");
  for (const std::string reason : {"driver nvidia", "IOMMU group 3 not viable", "config space unreadable: x",
                                   "in no supported Fabric Manager partition", "no /dev/vfio/3"}) {
    EXPECT_EQ(FailureTaint(kTaintDriver, reason, evict).effect, "NoSchedule") << reason;
    EXPECT_EQ(FailureTaint(kTaintDriver, reason).effect, "NoSchedule") << reason;
  }
}

TEST(DraTaintsTest, AGpuWithoutAResetMethodGetsANoneWarningAndAHealthyOneNothing) {
  testing::TempDir dir("va-dra-taints");
  testing::SysfsTree tree(dir.path() / "sys");
  tree.AddDevice({.bdf = "0000:18:00.0", .driver = "vfio-pci", .iommu_group = 10});
  tree.AddDevice({.bdf = "0000:9a:00.0", .driver = "vfio-pci", .iommu_group = 11, .reset_method = ""});
  const HostPaths paths{.sysfs_root = dir.path() / "sys", .dev_root = dir.path() / "dev"};
  EXPECT_TRUE(WarningTaints(paths, "0000:18:00.0", kTaintDriver).empty());
  const std::vector<kube::DeviceTaint> warnings = WarningTaints(paths, "0000:9a:00.0", kTaintDriver);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(Describe(warnings[0]), "gpu.example.com/no-reset-method=none:None");

  std::vector<GpuDevice> devices(2);
  devices[0].bdf = "0000:18:00.0";
  devices[0].unhealthy_reason = "driver nvidia";
  devices[1].bdf = "0000:9a:00.0";
  ApplyHealthTaints(&devices, kTaintDriver, paths, {}, /*whole_gpus=*/true);
  ASSERT_EQ(devices[0].slice.taints.size(), 1u);
  EXPECT_EQ(Describe(devices[0].slice.taints[0]), "gpu.example.com/not-vfio=nvidia:NoSchedule");
  ASSERT_EQ(devices[1].slice.taints.size(), 1u);
  EXPECT_EQ(WarningText(devices[1]), "warning gpu.example.com/no-reset-method=none");
  // vGPUs: their parent's reset method is not theirs to report.
  ApplyHealthTaints(&devices, kTaintDriver, paths, {}, /*whole_gpus=*/false);
  EXPECT_TRUE(devices[1].slice.taints.empty());
}

}  // namespace
}  // namespace vfio_agent::dra
