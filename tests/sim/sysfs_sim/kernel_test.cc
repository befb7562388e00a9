// The simulated kernel's rules, in-process (no FUSE): node parsing, tree layout, bind/unbind errnos.
#include <cerrno>
#include <filesystem>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernel.h"
#include "node_spec.h"
#include "sim_process.h"
#include "tree.h"

namespace vfio_agent::sim {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr const char* kTwoGpus = R"({
  "iommu": true, "drivers": ["nvidia", "vfio-pci", "pcieport"],
  "devices": [
    {"bdf": "0000:3a:00.0", "vendor": "1000", "device": "c030", "class": "060400", "header_type": 1,
     "iommu_group": 5, "driver": "pcieport"},
    {"bdf": "0000:3b:00.0", "vendor": "10de", "device": "2236", "class": "030200", "iommu_group": 6,
     "driver": "nvidia", "parent": "0000:3a:00.0", "numa_node": 1},
    {"bdf": "0000:3b:00.1", "vendor": "10de", "device": "1aef", "class": "040300", "iommu_group": 6,
     "parent": "0000:3a:00.0"},
    {"bdf": "0000:86:00.0", "vendor": "10de", "device": "2236", "class": "030200", "driver": "nvidia"}
  ]})";

class KernelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dev_ = std::filesystem::path(::testing::TempDir()) / ("kernel_test_dev_" + std::to_string(getpid()));
    std::filesystem::remove_all(dev_);
    auto node = ParseNode(kTwoGpus, "inline");
    ASSERT_TRUE(node.ok()) << node.status();
    kernel_ = std::make_unique<Kernel>(*node, dev_);
    ASSERT_TRUE(kernel_->Start().ok());
  }
  void TearDown() override { std::filesystem::remove_all(dev_); }

  const Entry* At(const std::string& path) {
    snap_ = kernel_->Snapshot();
    auto it = snap_->find(path);
    return it == snap_->end() ? nullptr : &it->second;
  }
  std::string Link(const std::string& path) {
    const Entry* e = At(path);
    return e && e->type == Entry::Type::kLink ? e->content : "<none>";
  }
  std::string Read(const std::string& path) {
    const Entry* e = At(path);
    return e ? e->content : "<none>";
  }

  std::filesystem::path dev_;
  std::unique_ptr<Kernel> kernel_;
  std::shared_ptr<const Tree> snap_;
};

TEST(NodeSpecTest, ShippedNodeFilesLoad) {
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(NodesDir())) {
    auto node = LoadNode(e.path());
    EXPECT_TRUE(node.ok()) << node.status();
    ++files;
  }
  EXPECT_GE(files, 7);
}

TEST(NodeSpecTest, RejectsInconsistentNodes) {
  auto expect_error = [](const std::string& devices, const std::string& what, bool iommu = true) {
    auto node = ParseNode(R"({"iommu": )" + std::string(iommu ? "true" : "false") +
                              R"(, "drivers": ["nvidia", "vfio-pci"], "devices": [)" + devices + "]}",
                          "inline");
    EXPECT_FALSE(node.ok()) << devices;
    EXPECT_THAT(std::string(node.status().message()), HasSubstr(what));
  };
  const std::string gpu = R"({"bdf": "0000:3b:00.0", "vendor": "10de", "device": "2236", "class": "030200")";
  expect_error(R"({"bdf": "3b:00.0", "vendor": "10de", "device": "2236", "class": "030200"})", "bad bdf");
  expect_error(gpu + R"(, "driver": "nouveau"})", "not in drivers");
  expect_error(gpu + R"(, "iommu_group": 3})", "iommu off", /*iommu=*/false);
  expect_error(gpu + R"(, "driver": "vfio-pci"})", "without an IOMMU group");
  expect_error(gpu + R"(, "faults": {"bind_errno": "EWHAT"}})", "unknown errno");
  expect_error(gpu + R"(, "parent": "0000:00:01.0"})", "not a bridge");
  expect_error(gpu + R"(, "colour": "green"})", "colour");
  expect_error(gpu + "}," + gpu + "}", "duplicate");
  expect_error(R"({"bdf": "0000:3b:00.0", "vendor": "10dex", "device": "2236", "class": "030200"})", "vendor");
}

TEST(TreeTest, RelativeLinksClimbToTheCommonAncestor) {
  EXPECT_EQ(RelativeLink("/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0", "/bus/pci/drivers/nvidia"),
            "../../../../bus/pci/drivers/nvidia");
  EXPECT_EQ(RelativeLink("/bus/pci/devices", "/devices/pci0000:3b/0000:3b:00.0"),
            "../../../devices/pci0000:3b/0000:3b:00.0");
  EXPECT_EQ(RelativeLink("/devices/pci0000:3b/0000:3b:00.4", "/devices/pci0000:3b/0000:3b:00.0"), "../0000:3b:00.0");
}

TEST_F(KernelTest, LaysOutDevicesAsTheKernel) {
  EXPECT_EQ(Link("/bus/pci/devices/0000:3b:00.0"), "../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0");
  const std::string gpu = "/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0";
  EXPECT_EQ(Read(gpu + "/vendor"), "0x10de\n");
  EXPECT_EQ(Read(gpu + "/class"), "0x030200\n");
  EXPECT_EQ(Read(gpu + "/numa_node"), "1\n");
  EXPECT_EQ(Read(gpu + "/driver_override"), "(null)\n");
  EXPECT_EQ(Read(gpu + "/modalias"), "pci:v000010DEd00002236sv000010DEsd00000000bc03sc02i00\n");
  EXPECT_EQ(Link(gpu + "/driver"), "../../../../bus/pci/drivers/nvidia");
  EXPECT_EQ(Link(gpu + "/iommu_group"), "../../../../kernel/iommu_groups/6");
  EXPECT_EQ(Link("/kernel/iommu_groups/6/devices/0000:3b:00.1"),
            "../../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.1");
  EXPECT_EQ(At(gpu + "/0000:3b:00.1/driver"), nullptr);
  EXPECT_EQ(Read("/devices/pci0000:86/0000:86:00.0/numa_node"), "-1\n");
  EXPECT_EQ(At("/devices/pci0000:86/0000:86:00.0/iommu_group"), nullptr);
  const std::string config = Read(gpu + "/config");
  ASSERT_EQ(config.size(), 4096u);
  EXPECT_EQ(config.substr(0, 4), std::string("\xde\x10\x36\x22", 4));
  const std::string bridge_config = Read("/devices/pci0000:3a/0000:3a:00.0/config");
  EXPECT_EQ(bridge_config[0x0e], 1);
  EXPECT_EQ(bridge_config[0x19], 0x3b);  // secondary bus
  EXPECT_TRUE(std::filesystem::exists(dev_ / "vfio/vfio"));
  EXPECT_TRUE(std::filesystem::exists(dev_ / "nvidia0"));
  EXPECT_TRUE(std::filesystem::exists(dev_ / "nvidia1"));
}

TEST_F(KernelTest, BindFollowsDriverOverrideAndTheKernelsErrnos) {
  const std::string bdf = "0000:3b:00.0";
  EXPECT_EQ(kernel_->Write(Attr::kBind, "vfio-pci", bdf), ENODEV);  // vfio-pci matches only via override
  EXPECT_EQ(kernel_->Write(Attr::kBind, "nvidia", bdf + "\n"), EBUSY);
  EXPECT_EQ(kernel_->Write(Attr::kUnbind, "vfio-pci", bdf), ENODEV);  // not bound to it
  EXPECT_EQ(kernel_->Write(Attr::kBind, "nvidia", "0000:ff:00.0"), ENODEV);
  EXPECT_EQ(kernel_->Write(Attr::kDriverOverride, bdf, "vfio-pci\n"), 0);
  EXPECT_EQ(kernel_->Write(Attr::kUnbind, "nvidia", bdf + "\n"), 0);
  EXPECT_FALSE(std::filesystem::exists(dev_ / "nvidia0"));
  EXPECT_EQ(kernel_->Write(Attr::kBind, "nvidia", bdf), ENODEV);  // override names another driver
  EXPECT_EQ(kernel_->Write(Attr::kBind, "vfio-pci", bdf), 0);
  const std::string gpu = "/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0";
  EXPECT_EQ(Link(gpu + "/driver"), "../../../../bus/pci/drivers/vfio-pci");
  EXPECT_EQ(Read(gpu + "/driver_override"), "vfio-pci\n");
  EXPECT_NE(At(gpu + "/vfio-dev/vfio0/dev"), nullptr);
  EXPECT_TRUE(std::filesystem::exists(dev_ / "vfio/6"));
  EXPECT_TRUE(std::filesystem::exists(dev_ / "vfio/devices/vfio0"));
  EXPECT_EQ(kernel_->Write(Attr::kUnbind, "vfio-pci", bdf), 0);
  EXPECT_FALSE(std::filesystem::exists(dev_ / "vfio/6"));
  EXPECT_EQ(kernel_->Write(Attr::kDriverOverride, bdf, "\n"), 0);
  EXPECT_EQ(Read(gpu + "/driver_override"), "(null)\n");
  EXPECT_EQ(kernel_->Write(Attr::kDriversProbe, "", bdf), 0);
  EXPECT_EQ(Link(gpu + "/driver"), "../../../../bus/pci/drivers/nvidia");
  EXPECT_THAT(kernel_->LogText(), HasSubstr("bind 0000:3b:00.0 vfio-pci ENODEV\n"));
  EXPECT_THAT(kernel_->LogText(), HasSubstr("probe 0000:3b:00.0 nvidia\n"));
}

TEST_F(KernelTest, VfioRefusesDevicesWithoutGroupOrBridges) {
  ASSERT_EQ(kernel_->Write(Attr::kDriverOverride, "0000:86:00.0", "vfio-pci"), 0);
  ASSERT_EQ(kernel_->Write(Attr::kUnbind, "nvidia", "0000:86:00.0"), 0);
  EXPECT_EQ(kernel_->Write(Attr::kBind, "vfio-pci", "0000:86:00.0"), EINVAL);
  EXPECT_EQ(kernel_->Write(Attr::kDriversProbe, "", "0000:86:00.0"), 0);  // success, yet unbound
  EXPECT_EQ(At("/devices/pci0000:86/0000:86:00.0/driver"), nullptr);
  ASSERT_EQ(kernel_->Write(Attr::kDriverOverride, "0000:3a:00.0", "vfio-pci"), 0);
  ASSERT_EQ(kernel_->Write(Attr::kUnbind, "pcieport", "0000:3a:00.0"), 0);
  EXPECT_EQ(kernel_->Write(Attr::kBind, "vfio-pci", "0000:3a:00.0"), EINVAL);
}

TEST_F(KernelTest, NewIdBindsUnboundMatchingDevices) {
  EXPECT_EQ(kernel_->Write(Attr::kNewId, "vfio-pci", "10de 1aef\n"), 0);
  EXPECT_EQ(Link("/bus/pci/devices/0000:3b:00.1/driver"), "<none>");  // links are not followed here
  EXPECT_NE(At("/bus/pci/drivers/vfio-pci/0000:3b:00.1"), nullptr);
  EXPECT_EQ(kernel_->Write(Attr::kNewId, "vfio-pci", "10de 1aef"), EEXIST);
  EXPECT_EQ(kernel_->Write(Attr::kNewId, "vfio-pci", "zz"), EINVAL);
  EXPECT_EQ(kernel_->Write(Attr::kRemoveId, "vfio-pci", "10de 1aef"), 0);
  EXPECT_EQ(kernel_->Write(Attr::kRemoveId, "vfio-pci", "10de 1aef"), ENODEV);
}

TEST_F(KernelTest, RemoveTakesTheSubtreeAndRescanBringsItBackOnDefaultDrivers) {
  ASSERT_EQ(kernel_->Write(Attr::kDriverOverride, "0000:3b:00.0", "vfio-pci"), 0);
  EXPECT_EQ(kernel_->Write(Attr::kRemove, "0000:3a:00.0", "1"), 0);
  EXPECT_EQ(At("/bus/pci/devices/0000:3b:00.0"), nullptr);
  EXPECT_EQ(At("/kernel/iommu_groups/6"), nullptr);
  EXPECT_EQ(kernel_->Write(Attr::kRescan, "", "1\n"), 0);
  EXPECT_EQ(Read("/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/driver_override"), "(null)\n");
  EXPECT_EQ(Link("/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/driver"), "../../../../bus/pci/drivers/nvidia");
  EXPECT_EQ(kernel_->Write(Attr::kRemove, "0000:3a:00.0", "x"), EINVAL);
}

TEST(KernelStartTest, RemovedFaultKeepsTheDeviceAwayUntilRescan) {
  auto node = ParseNode(R"({"iommu": true, "drivers": ["nvidia"], "devices": [
      {"bdf": "0000:3b:00.0", "vendor": "10de", "device": "2236", "class": "030200", "iommu_group": 6,
       "driver": "nvidia", "faults": {"removed": true}}]})",
                        "inline");
  ASSERT_TRUE(node.ok()) << node.status();
  const auto dev = std::filesystem::path(::testing::TempDir()) / ("kernel_start_dev_" + std::to_string(getpid()));
  Kernel kernel(*node, dev);
  ASSERT_TRUE(kernel.Start().ok());
  EXPECT_EQ(kernel.Snapshot()->count("/bus/pci/devices/0000:3b:00.0"), 0u);
  EXPECT_FALSE(std::filesystem::exists(dev / "nvidia0"));
  EXPECT_EQ(kernel.Write(Attr::kControl, "", "rescan"), 0);
  EXPECT_EQ(kernel.Snapshot()->count("/bus/pci/drivers/nvidia/0000:3b:00.0"), 1u);
  EXPECT_TRUE(std::filesystem::exists(dev / "nvidia0"));
  std::filesystem::remove_all(dev);
}

TEST_F(KernelTest, ControlCommandsValidate) {
  EXPECT_EQ(kernel_->Write(Attr::kControl, "", "dead 0000:3b:00.0 1"), 0);
  EXPECT_EQ(Read("/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/config").substr(0, 2), "\xff\xff");
  EXPECT_EQ(kernel_->Write(Attr::kControl, "", "bind-errno 0000:3b:00.0 EBUSY\n"), 0);
  EXPECT_EQ(kernel_->Write(Attr::kControl, "", "set-driver 0000:3b:00.0 vfio-pci"), 0);
  EXPECT_TRUE(std::filesystem::exists(dev_ / "vfio/6"));
  EXPECT_EQ(kernel_->Write(Attr::kControl, "", "set-driver 0000:86:00.0 vfio-pci"), EINVAL);  // no group
  for (const char* bad : {"", "frobnicate", "dead 0000:3b:00.0 2", "bind-errno 0000:3b:00.0 EWHAT",
                          "unbind-delay 0000:3b:00.0 -2", "remove 0000:99:00.0", "set-driver 0000:3b:00.0 i915",
                          "release", "rescan now"}) {
    EXPECT_EQ(kernel_->Write(Attr::kControl, "", bad), EINVAL) << bad;
  }
  EXPECT_THAT(kernel_->LogText(), Not(HasSubstr("set-driver")));
}

}  // namespace
}  // namespace vfio_agent::sim
