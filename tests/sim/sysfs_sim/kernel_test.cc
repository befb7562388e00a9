// The simulated kernel's rules, in-process (no FUSE): node parsing, tree layout, bind/unbind errnos.
#include <cerrno>
#include <filesystem>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernel.h"
#include "node_spec.h"
#include "sim_process.h"
#include "support/holding_process.h"
#include "tree.h"

namespace vfio_agent::sim {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::ElementsAre;
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
  expect_error(gpu + R"(, "vgpu": {"framework": "grid"}})", "framework is mdev, mdev_vf or sriov");
  expect_error(gpu + R"(, "vgpu": {"framework": "sriov", "types": [{"id": "1414", "name": "x", "max_instances": 7}]}})",
               "needs sriov_totalvfs");
  expect_error(gpu + R"(, "vgpu": {"framework": "mdev", "types": [{"id": "222", "name": "x", "max_instances": 1}]}})",
               "unique id");
  expect_error(gpu + R"(, "sriov_totalvfs": 8, "vgpu": {"framework": "sriov", "types": [{"id": "nvidia-1", "name": "x",
               "max_instances": 1}]}})", "unique id");
  expect_error(gpu + R"(, "vgpu": {"framework": "mdev", "types": [{"id": "nvidia-1", "name": "x"}]}})", "max_instances");
  expect_error(gpu + R"(}, {"bdf": "0000:3b:00.4", "vendor": "10de", "device": "2236", "class": "030200",
               "physfn": "0000:3b:00.0", "vgpu": {"framework": "mdev"}})", "on the PF");
}

TEST(NodeSpecTest, BothVgpuFrameworksOnOneNodeAreExpressible) {
  auto node = LoadNode(NodeFile("vgpu-mixed-t4-l40s.json"));
  ASSERT_TRUE(node.ok()) << node.status();
  std::set<VgpuFramework> frameworks;
  for (const auto& d : node->devices) frameworks.insert(d.vgpu.framework);
  EXPECT_THAT(frameworks, ElementsAre(VgpuFramework::kMdev, VgpuFramework::kSriov));
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

// vGPU: the shipped vGPU nodes, in-process. Holding a group open is done by a real process, as the simulator
// finds openers through /proc like the kernel's vfio refcount would see them.
class VgpuKernelTest : public KernelTest {
 protected:
  void SetUp() override {}
  void Load(const std::string& node_file) {
    dev_ = std::filesystem::path(::testing::TempDir()) / ("vgpu_kernel_test_dev_" + std::to_string(getpid()));
    std::filesystem::remove_all(dev_);
    auto node = LoadNode(NodeFile(node_file));
    ASSERT_TRUE(node.ok()) << node.status();
    kernel_ = std::make_unique<Kernel>(*node, dev_);
    ASSERT_TRUE(kernel_->Start().ok());
  }
  int Write(Attr attr, const std::string& key, const std::string& data) { return kernel_->Write(attr, key, data); }
  bool DevNode(const std::string& name) const { return std::filesystem::exists(dev_ / name); }
  std::string Catalog(const std::string& dir) { return Read(dir + "/nvidia/creatable_vgpu_types"); }

  static constexpr const char* kT4 = "/devices/pci0000:3b/0000:3b:00.0";
  static constexpr const char* kA10 = "/devices/pci0000:86/0000:86:00.0";
  static constexpr const char* kUuid = "c0ffee00-0000-4000-8000-000000000001";
};

TEST_F(VgpuKernelTest, TuringPfIsTheMdevParentAndCountsInstances) {
  Load("vgpu-mdev-t4-a10.json");
  const std::string types = std::string(kT4) + "/mdev_supported_types/";
  EXPECT_EQ(Link("/class/mdev_bus/0000:3b:00.0"), "../../devices/pci0000:3b/0000:3b:00.0");
  EXPECT_EQ(At("/class/mdev_bus/0000:86:00.0"), nullptr);  // Ampere: the VFs are the parents
  EXPECT_EQ(Read(types + "nvidia-230/name"), "GRID T4-1Q\n");
  EXPECT_EQ(Read(types + "nvidia-230/available_instances"), "16\n");
  EXPECT_EQ(Read(types + "nvidia-230/device_api"), "vfio-pci\n");
  EXPECT_THAT(Read(types + "nvidia-230/description"), HasSubstr("max_instance=16"));
  EXPECT_EQ(At(types + "nvidia-230/create")->mode, 0200u);

  ASSERT_EQ(Write(Attr::kMdevCreate, "0000:3b:00.0/nvidia-230", std::string(kUuid) + "\n"), 0);
  const std::string mdev = std::string(kT4) + "/" + kUuid;
  EXPECT_EQ(Link(mdev + "/mdev_type"), "../mdev_supported_types/nvidia-230");
  EXPECT_EQ(Link(mdev + "/iommu_group"), "../../../../kernel/iommu_groups/78");  // above the node's highest (77)
  EXPECT_EQ(Link(mdev + "/driver"), "../../../../bus/mdev/drivers/nvidia-vgpu-vfio");
  EXPECT_EQ(Link(mdev + "/subsystem"), "../../../../bus/mdev");
  EXPECT_EQ(Link(std::string("/bus/mdev/devices/") + kUuid), std::string("../../../devices/pci0000:3b/0000:3b:00.0/") + kUuid);
  EXPECT_NE(At(std::string("/kernel/iommu_groups/78/devices/") + kUuid), nullptr);
  EXPECT_NE(At(types + "nvidia-230/devices/" + kUuid), nullptr);
  EXPECT_TRUE(DevNode("vfio/78"));
  EXPECT_EQ(Read(types + "nvidia-230/available_instances"), "15\n");
  EXPECT_EQ(Read(types + "nvidia-231/available_instances"), "0\n");  // one type per GPU at a time

  EXPECT_EQ(Write(Attr::kMdevCreate, "0000:3b:00.0/nvidia-230", "C0FFEE00-0000-4000-8000-000000000001"), EEXIST);
  EXPECT_EQ(Write(Attr::kMdevCreate, "0000:3b:00.0/nvidia-230", "c0ffee00-0000-4000-8000-00000000000"), EINVAL);
  EXPECT_EQ(Write(Attr::kMdevCreate, "0000:3b:00.0/nvidia-230", "c0ffee00x0000-4000-8000-000000000002"), EINVAL);
  for (int i = 2; i <= 16; ++i) {
    ASSERT_EQ(Write(Attr::kMdevCreate, "0000:3b:00.0/nvidia-230", absl::StrFormat("c0ffee00-0000-4000-8000-%012d", i)), 0);
  }
  EXPECT_EQ(Read(types + "nvidia-230/available_instances"), "0\n");
  EXPECT_EQ(Write(Attr::kMdevCreate, "0000:3b:00.0/nvidia-230", "c0ffee00-0000-4000-8000-000000000017"), EUSERS);
  EXPECT_TRUE(DevNode("vfio/93"));

  EXPECT_EQ(Write(Attr::kMdevRemove, kUuid, "x"), EINVAL);
  EXPECT_EQ(Write(Attr::kMdevRemove, kUuid, "0"), 0);
  EXPECT_NE(At(mdev), nullptr);
  EXPECT_EQ(Write(Attr::kMdevRemove, kUuid, "1\n"), 0);
  EXPECT_EQ(At(mdev), nullptr);
  EXPECT_EQ(At(std::string("/bus/mdev/devices/") + kUuid), nullptr);
  EXPECT_EQ(At("/kernel/iommu_groups/78"), nullptr);
  EXPECT_FALSE(DevNode("vfio/78"));
  EXPECT_EQ(Read(types + "nvidia-230/available_instances"), "1\n");
  EXPECT_THAT(kernel_->LogText(), HasSubstr("mdev-create 0000:3b:00.0 nvidia-230 c0ffee00-0000-4000-8000-000000000017 EUSERS\n"));
  EXPECT_THAT(kernel_->LogText(), HasSubstr(std::string("mdev-remove ") + kUuid + "\n"));
}

TEST_F(VgpuKernelTest, MdevRemoveIsRefusedWhileItsGroupIsOpen) {
  Load("vgpu-mdev-t4-a10.json");
  ASSERT_EQ(Write(Attr::kMdevCreate, "0000:3b:00.0/nvidia-233", kUuid), 0);
  {
    vfio_agent::testing::HoldingProcess vm(dev_ / "vfio/78");
    EXPECT_EQ(Write(Attr::kMdevRemove, kUuid, "1"), EBUSY);
    EXPECT_NE(At(std::string("/bus/mdev/devices/") + kUuid), nullptr);
  }
  EXPECT_EQ(Write(Attr::kMdevRemove, kUuid, "1"), 0);
  EXPECT_THAT(kernel_->LogText(), HasSubstr(std::string("mdev-remove ") + kUuid + " EBUSY\n"));
}

TEST_F(VgpuKernelTest, ParentLosingItsDriverTakesItsMdevs) {
  Load("vgpu-mdev-t4-a10.json");
  ASSERT_EQ(Write(Attr::kMdevCreate, "0000:3b:00.0/nvidia-233", kUuid), 0);
  ASSERT_EQ(Write(Attr::kControl, "", "set-driver 0000:3b:00.0 none"), 0);
  EXPECT_EQ(At(std::string("/bus/mdev/devices/") + kUuid), nullptr);
  EXPECT_EQ(At("/class/mdev_bus/0000:3b:00.0"), nullptr);
  EXPECT_EQ(At(std::string(kT4) + "/mdev_supported_types"), nullptr);
  EXPECT_FALSE(DevNode("vfio/78"));
  ASSERT_EQ(Write(Attr::kControl, "", "set-driver 0000:3b:00.0 nvidia"), 0);
  EXPECT_EQ(Read(std::string(kT4) + "/mdev_supported_types/nvidia-233/available_instances"), "2\n");
  ASSERT_EQ(Write(Attr::kMdevCreate, "0000:3b:00.0/nvidia-233", kUuid), 0);
  ASSERT_EQ(Write(Attr::kUnbind, "nvidia", "0000:3b:00.0"), 0);
  EXPECT_EQ(At(std::string("/bus/mdev/devices/") + kUuid), nullptr);
}

TEST_F(VgpuKernelTest, AmpereVfsAreEnabledAndEachHostsOneMdev) {
  Load("vgpu-mdev-t4-a10.json");
  EXPECT_EQ(Read(std::string(kA10) + "/sriov_numvfs"), "0\n");
  EXPECT_EQ(Write(Attr::kSriovNumvfs, "0000:86:00.0", "33"), ERANGE);
  EXPECT_EQ(Write(Attr::kSriovNumvfs, "0000:86:00.0", "four"), EINVAL);
  ASSERT_EQ(Write(Attr::kSriovNumvfs, "0000:86:00.0", "4\n"), 0);
  EXPECT_EQ(Read(std::string(kA10) + "/sriov_numvfs"), "4\n");
  EXPECT_EQ(Write(Attr::kSriovNumvfs, "0000:86:00.0", "4"), 0);  // the current count: nothing to do
  EXPECT_EQ(Write(Attr::kSriovNumvfs, "0000:86:00.0", "2"), EBUSY);
  for (int i = 0; i < 4; ++i) {
    const std::string vf = absl::StrCat("0000:86:00.", 4 + i);
    EXPECT_EQ(Link(absl::StrCat(kA10, "/virtfn", i)), "../" + vf);
    EXPECT_EQ(Link("/devices/pci0000:86/" + vf + "/physfn"), "../0000:86:00.0");
    EXPECT_EQ(Link("/devices/pci0000:86/" + vf + "/iommu_group"), absl::StrCat("../../../kernel/iommu_groups/", 78 + i));
    EXPECT_EQ(Link("/devices/pci0000:86/" + vf + "/driver"), "../../../bus/pci/drivers/nvidia");
    EXPECT_EQ(Read("/devices/pci0000:86/" + vf + "/device"), "0x2236\n");
    EXPECT_NE(At("/class/mdev_bus/" + vf), nullptr);
  }
  EXPECT_FALSE(DevNode("nvidia2"));  // VFs get no /dev/nvidiaN
  const std::string vf0_types = "/devices/pci0000:86/0000:86:00.4/mdev_supported_types/";
  const std::string vf1_types = "/devices/pci0000:86/0000:86:00.5/mdev_supported_types/";
  EXPECT_EQ(Read(vf0_types + "nvidia-591/available_instances"), "1\n");
  ASSERT_EQ(Write(Attr::kMdevCreate, "0000:86:00.4/nvidia-591", kUuid), 0);
  EXPECT_EQ(Read(vf0_types + "nvidia-591/available_instances"), "0\n");
  EXPECT_EQ(Read(vf1_types + "nvidia-591/available_instances"), "1\n");
  EXPECT_EQ(Read(vf1_types + "nvidia-595/available_instances"), "0\n");
  EXPECT_EQ(Write(Attr::kMdevCreate, "0000:86:00.4/nvidia-591", "c0ffee00-0000-4000-8000-000000000002"), EUSERS);
  {
    vfio_agent::testing::HoldingProcess vm(dev_ / "vfio/82");
    EXPECT_EQ(Write(Attr::kSriovNumvfs, "0000:86:00.0", "0"), EBUSY);
  }
  ASSERT_EQ(Write(Attr::kSriovNumvfs, "0000:86:00.0", "0"), 0);
  EXPECT_EQ(At("/bus/pci/devices/0000:86:00.4"), nullptr);
  EXPECT_EQ(At(std::string("/bus/mdev/devices/") + kUuid), nullptr);
  EXPECT_EQ(At(std::string(kA10) + "/virtfn0"), nullptr);
  EXPECT_FALSE(DevNode("vfio/82"));
  EXPECT_EQ(Write(Attr::kControl, "", "rescan"), 0);
  EXPECT_EQ(At("/bus/pci/devices/0000:86:00.4"), nullptr);  // disabled VFs do not come back
  ASSERT_EQ(Write(Attr::kControl, "", "set-driver 0000:86:00.0 none"), 0);
  EXPECT_EQ(Write(Attr::kSriovNumvfs, "0000:86:00.0", "1"), ENOENT);  // no PF driver
  EXPECT_THAT(kernel_->LogText(), HasSubstr("sriov_numvfs 0000:86:00.0 2 EBUSY\n"));
}

TEST_F(VgpuKernelTest, SriovVgpuTypesFillTheCardAndShrinkItsCatalog) {
  Load("vgpu-sriov-l40s-h200.json");
  const std::string pf = "/devices/pci0000:86/0000:86:00.0";
  auto vf = [](int i) { return absl::StrCat("/devices/pci0000:86/0000:86:00.", 4 + i); };
  auto vf_bdf = [](int i) { return absl::StrCat("0000:86:00.", 4 + i); };
  EXPECT_EQ(At("/bus/mdev"), nullptr);  // no mdev bus on a vendor-VFIO host
  EXPECT_THAT(Catalog(pf), HasSubstr("1414  : NVIDIA H200X-1-18C\n"));
  EXPECT_EQ(At(pf + "/nvidia/current_vgpu_type"), nullptr);
  ASSERT_EQ(Write(Attr::kSriovNumvfs, "0000:86:00.0", "3"), 0);
  const std::string full_catalog = Catalog(pf);
  EXPECT_EQ(Catalog(vf(0)), full_catalog);
  EXPECT_TRUE(absl::StartsWith(full_catalog, "ID    : vGPU Name\n1414  : NVIDIA H200X-1-18C\n")) << full_catalog;
  EXPECT_EQ(Read(vf(0) + "/nvidia/current_vgpu_type"), "0\n");
  EXPECT_EQ(Write(Attr::kCurrentVgpuType, vf_bdf(0), "1155"), EINVAL);  // an L40S id: not this card's
  EXPECT_EQ(Write(Attr::kCurrentVgpuType, vf_bdf(0), "seventy"), EINVAL);

  ASSERT_EQ(Write(Attr::kCurrentVgpuType, vf_bdf(0), "1427"), 0);
  EXPECT_EQ(Read(vf(0) + "/nvidia/current_vgpu_type"), "1427\n");
  const int group0 = 91;  // above the node's highest group (90)
  EXPECT_TRUE(DevNode(absl::StrCat("vfio/", group0)));
  EXPECT_NE(At(vf(0) + "/vfio-dev/vfio0/dev"), nullptr);
  EXPECT_TRUE(DevNode("vfio/devices/vfio0"));
  EXPECT_EQ(Catalog(vf(0)), "ID    : vGPU Name\n");  // this VF is taken
  EXPECT_EQ(Catalog(vf(1)), "ID    : vGPU Name\n1427  : NVIDIA H200X-70C\n");
  EXPECT_EQ(Write(Attr::kCurrentVgpuType, vf_bdf(0), "1428"), EBUSY);
  ASSERT_EQ(Write(Attr::kCurrentVgpuType, vf_bdf(1), "1427\n"), 0);
  for (const std::string& f : {pf, vf(0), vf(1), vf(2)}) EXPECT_EQ(Catalog(f), "ID    : vGPU Name\n") << f;
  EXPECT_EQ(Write(Attr::kCurrentVgpuType, vf_bdf(2), "1427"), EINVAL);  // the card is full
  EXPECT_EQ(Catalog("/devices/pci0000:af/0000:af:00.0"), full_catalog);  // the other H200 is not

  {
    vfio_agent::testing::HoldingProcess vm(dev_ / absl::StrCat("vfio/", group0));
    EXPECT_EQ(Write(Attr::kCurrentVgpuType, vf_bdf(0), "0"), EBUSY);
    EXPECT_EQ(Read(vf(0) + "/nvidia/current_vgpu_type"), "1427\n");
  }
  ASSERT_EQ(Write(Attr::kCurrentVgpuType, vf_bdf(0), "0\n"), 0);
  EXPECT_FALSE(DevNode(absl::StrCat("vfio/", group0)));
  EXPECT_EQ(At(vf(0) + "/vfio-dev"), nullptr);
  EXPECT_EQ(Catalog(vf(2)), "ID    : vGPU Name\n1427  : NVIDIA H200X-70C\n");
  ASSERT_EQ(Write(Attr::kCurrentVgpuType, vf_bdf(1), "0"), 0);
  EXPECT_EQ(Catalog(vf(2)), full_catalog);
  EXPECT_EQ(Write(Attr::kCurrentVgpuType, vf_bdf(1), "0"), 0);  // already none
  EXPECT_THAT(kernel_->LogText(), HasSubstr("vgpu-type 0000:86:00.4 0 EBUSY\n"));
}

TEST_F(VgpuKernelTest, MixedSizesShareTheCardWhenTheRuleIsOff) {
  auto node = LoadNode(NodeFile("vgpu-sriov-l40s-h200.json"));
  ASSERT_TRUE(node.ok()) << node.status();
  for (auto& d : node->devices) d.vgpu.one_type_at_a_time = false;
  dev_ = std::filesystem::path(::testing::TempDir()) / ("vgpu_kernel_test_dev_" + std::to_string(getpid()));
  kernel_ = std::make_unique<Kernel>(*node, dev_);
  ASSERT_TRUE(kernel_->Start().ok());
  ASSERT_EQ(Write(Attr::kSriovNumvfs, "0000:86:00.0", "4"), 0);
  ASSERT_EQ(Write(Attr::kCurrentVgpuType, "0000:86:00.4", "1427"), 0);  // half the card
  ASSERT_EQ(Write(Attr::kCurrentVgpuType, "0000:86:00.5", "1426"), 0);  // a quarter
  EXPECT_EQ(Catalog("/devices/pci0000:86/0000:86:00.6"),
            "ID    : vGPU Name\n1414  : NVIDIA H200X-1-18C\n1425  : NVIDIA H200X-17C\n1426  : NVIDIA H200X-35C\n");
}

}  // namespace
}  // namespace vfio_agent::sim
