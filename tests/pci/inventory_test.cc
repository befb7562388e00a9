#include "vfio_gpu_agent/pci/inventory.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "absl/strings/str_format.h"
#include "device_reader.h"
#include "support/sysfs_tree.h"

namespace vfio_agent::pci {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using vfio_agent::testing::FakePciDevice;
using vfio_agent::testing::SysfsTree;
using vfio_agent::testing::TempDir;

class InventoryTest : public ::testing::Test {
 protected:
  Inventory MustScan() {
    auto inventory = Scan(tree_.root());
    EXPECT_TRUE(inventory.ok()) << inventory.status();
    return inventory.ok() ? std::move(*inventory) : MakeInventory({}, {}, false);
  }

  TempDir dir_;
  SysfsTree tree_{dir_.path()};
};

TEST_F(InventoryTest, ReadsEveryAttributeOfABoundGpu) {
  tree_.AddDevice({.bdf = "0000:3b:00.1", .device = 0x22ba, .class_code = kClassHdAudio, .numa_node = 1,
                   .driver = "vfio-pci", .iommu_group = 7});
  tree_.AddDevice({.bdf = "0000:3b:00.0",
                   .vendor = 0x10de,
                   .device = 0x2335,
                   .subsystem_vendor = 0x10de,
                   .subsystem_device = 0x18be,
                   .class_code = 0x030200,
                   .multifunction = true,
                   .numa_node = 1,
                   .driver = "vfio-pci",
                   .driver_override = "vfio-pci",
                   .iommu_group = 7,
                   .consumers = {"0000:3b:00.1"},
                   .vfio_cdevs = {"vfio3"}});

  Inventory inventory = MustScan();
  EXPECT_THAT(inventory.errors(), IsEmpty());
  EXPECT_TRUE(inventory.iommu_enabled());
  ASSERT_EQ(inventory.functions().size(), 2u);
  const Function* gpu = inventory.Find("0000:3b:00.0");
  ASSERT_NE(gpu, nullptr);
  EXPECT_EQ(gpu->vendor_id, 0x10de);
  EXPECT_EQ(gpu->device_id, 0x2335);
  EXPECT_EQ(gpu->subsystem_vendor_id, 0x10de);
  EXPECT_EQ(gpu->subsystem_device_id, 0x18be);
  EXPECT_EQ(gpu->class_code, 0x030200u);
  EXPECT_EQ(gpu->header_type, 0);
  EXPECT_EQ(gpu->numa_node, 1);
  EXPECT_EQ(gpu->driver, "vfio-pci");
  EXPECT_EQ(gpu->driver_override, "vfio-pci");
  EXPECT_EQ(gpu->iommu_group, 7);
  EXPECT_FALSE(gpu->IsVirtualFunction());
  EXPECT_FALSE(gpu->IsBridge());
  EXPECT_THAT(gpu->consumers, ElementsAre("0000:3b:00.1"));
  EXPECT_THAT(gpu->vfio_cdevs, ElementsAre("vfio3"));
  EXPECT_EQ(gpu->VendorDevice(), "10de:2335");
  EXPECT_EQ(gpu->ClassHex(), "030200");

  const IommuGroup* group = inventory.Group(7);
  ASSERT_NE(group, nullptr);
  EXPECT_THAT(group->members, ElementsAre("0000:3b:00.0", "0000:3b:00.1"));
  EXPECT_EQ(inventory.functions()[0].bdf, "0000:3b:00.0") << "functions are sorted by BDF";
}

TEST_F(InventoryTest, UnboundDeviceWithoutOverrideHasEmptyDriverFields) {
  tree_.AddDevice({.bdf = "0000:01:00.0"});
  Inventory inventory = MustScan();
  ASSERT_EQ(inventory.functions().size(), 1u);
  const Function& fn = inventory.functions()[0];
  EXPECT_EQ(fn.driver, "");
  EXPECT_EQ(fn.driver_override, "") << "\"(null)\" means no override";
  EXPECT_TRUE(fn.consumers.empty());
  EXPECT_TRUE(fn.vfio_cdevs.empty());
}

TEST_F(InventoryTest, NumaNodeMinusOneOrAbsentOrMalformedIsNoAffinity) {
  tree_.AddDevice({.bdf = "0000:01:00.0", .numa_node = -1});
  tree_.AddDevice({.bdf = "0000:02:00.0", .numa_node = std::nullopt});
  tree_.AddDevice({.bdf = "0000:03:00.0"});
  tree_.WriteAttribute("0000:03:00.0", "numa_node", "one\n");
  tree_.AddDevice({.bdf = "0000:04:00.0", .numa_node = 0});
  Inventory inventory = MustScan();
  EXPECT_THAT(inventory.errors(), IsEmpty());
  EXPECT_EQ(inventory.Find("0000:01:00.0")->numa_node, std::nullopt);
  EXPECT_EQ(inventory.Find("0000:02:00.0")->numa_node, std::nullopt);
  EXPECT_EQ(inventory.Find("0000:03:00.0")->numa_node, std::nullopt);
  EXPECT_EQ(inventory.Find("0000:04:00.0")->numa_node, 0);
}

TEST_F(InventoryTest, MalformedOrMissingRequiredAttributeIsAPerDeviceErrorAndTheScanContinues) {
  tree_.AddDevice({.bdf = "0000:01:00.0"});
  tree_.AddDevice({.bdf = "0000:02:00.0"});
  tree_.AddDevice({.bdf = "0000:03:00.0"});
  tree_.AddDevice({.bdf = "0000:04:00.0"});
  tree_.AddDevice({.bdf = "0000:05:00.0"});
  tree_.WriteAttribute("0000:01:00.0", "vendor", "nvidia\n");
  tree_.RemoveAttribute("0000:02:00.0", "class");
  tree_.WriteAttribute("0000:03:00.0", "device", "0x123456\n");
  tree_.WriteAttribute("0000:04:00.0", "class", "\n");

  Inventory inventory = MustScan();
  ASSERT_EQ(inventory.functions().size(), 1u);
  EXPECT_EQ(inventory.functions()[0].bdf, "0000:05:00.0");
  ASSERT_EQ(inventory.errors().size(), 4u);

  const ScanError& vendor = inventory.errors()[0];
  EXPECT_EQ(vendor.bdf, "0000:01:00.0");
  EXPECT_EQ(vendor.path, tree_.root() / "bus/pci/devices/0000:01:00.0/vendor");
  EXPECT_EQ(vendor.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(vendor.status.message(), HasSubstr("0000:01:00.0/vendor"));
  EXPECT_THAT(vendor.status.message(), HasSubstr("nvidia"));

  const ScanError& missing = inventory.errors()[1];
  EXPECT_EQ(missing.bdf, "0000:02:00.0");
  EXPECT_EQ(missing.path.filename(), "class");
  EXPECT_EQ(missing.status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status.message(), HasSubstr("0000:02:00.0/class"));

  EXPECT_EQ(inventory.errors()[2].path.filename(), "device") << "a 24-bit device id is out of range";
  EXPECT_EQ(inventory.errors()[3].path.filename(), "class");
}

TEST_F(InventoryTest, OptionalAttributesFallBackSilently) {
  tree_.AddDevice({.bdf = "0000:01:00.0", .config = false});
  tree_.RemoveAttribute("0000:01:00.0", "subsystem_vendor");
  tree_.WriteAttribute("0000:01:00.0", "subsystem_device", "garbage\n");
  tree_.RemoveAttribute("0000:01:00.0", "driver_override");
  Inventory inventory = MustScan();
  EXPECT_THAT(inventory.errors(), IsEmpty());
  const Function* fn = inventory.Find("0000:01:00.0");
  ASSERT_NE(fn, nullptr);
  EXPECT_EQ(fn->subsystem_vendor_id, 0);
  EXPECT_EQ(fn->subsystem_device_id, 0);
  EXPECT_EQ(fn->header_type, 0);
  EXPECT_EQ(fn->driver_override, "");
}

TEST_F(InventoryTest, BridgesFromHeaderTypeOrFromClassWhenConfigIsUnreadable) {
  tree_.AddDevice({.bdf = "0000:00:01.0", .vendor = 0x8086, .class_code = 0x060400, .header_type = 1,
                   .multifunction = true, .driver = "pcieport"});
  tree_.AddDevice({.bdf = "0000:00:02.0", .vendor = 0x8086, .class_code = 0x060400, .config = false});
  tree_.AddDevice({.bdf = "0000:00:03.0", .vendor = 0x10b5, .class_code = 0x068000, .header_type = 1});
  tree_.AddDevice({.bdf = "0000:00:04.0", .vendor = 0x8086, .class_code = 0x060400});
  tree_.WriteAttribute("0000:00:04.0", "config", std::string(8, '\0'));  // short read: header type unknown
  tree_.AddDevice({.bdf = "0000:01:00.0", .parent = "0000:00:01.0"});
  Inventory inventory = MustScan();
  EXPECT_THAT(inventory.errors(), IsEmpty());
  EXPECT_EQ(inventory.Find("0000:00:01.0")->header_type, 1) << "multi-function bit must be masked off";
  EXPECT_TRUE(inventory.Find("0000:00:01.0")->IsBridge());
  EXPECT_TRUE(inventory.Find("0000:00:02.0")->IsBridge());
  EXPECT_TRUE(inventory.Find("0000:00:03.0")->IsBridge()) << "header type 1 with a non-0604 class";
  EXPECT_TRUE(inventory.Find("0000:00:04.0")->IsBridge());
  EXPECT_FALSE(inventory.Find("0000:01:00.0")->IsBridge());
  EXPECT_EQ(inventory.Find("0000:00:01.0")->driver, "pcieport");
}

// Reading config wakes a function from D3cold: a sleeping bridge-class function keeps its header type unread
// (config here claims a bridge header, so a read would show), and one that is awake is read as before.
TEST_F(InventoryTest, ConfigOfABridgeClassFunctionInD3coldIsNeverRead) {
  tree_.AddDevice({.bdf = "0000:05:00.0", .device = 0x22a3, .class_code = 0x068000, .header_type = 1});
  tree_.AddDevice({.bdf = "0000:06:00.0", .device = 0x22a3, .class_code = 0x068000, .header_type = 1});
  tree_.WriteAttribute("0000:05:00.0", "power_state", "D3cold\n");
  tree_.WriteAttribute("0000:06:00.0", "power_state", "D0\n");
  Inventory inventory = MustScan();
  EXPECT_EQ(inventory.Find("0000:05:00.0")->header_type, 0);
  EXPECT_EQ(inventory.Find("0000:06:00.0")->header_type, 1);
  auto single = ReadFunction(tree_.root(), "0000:05:00.0");
  ASSERT_TRUE(single.ok()) << single.status();
  EXPECT_EQ(single->header_type, 0);
}

TEST_F(InventoryTest, OtherVendorsAreReadOnlyAsFarAsSelectionNeeds) {
  tree_.AddDevice({.bdf = "0000:3b:00.0", .numa_node = 1, .driver = "vfio-pci", .driver_override = "vfio-pci",
                   .iommu_group = 7, .consumers = {"0000:3b:00.1"}, .vfio_cdevs = {"vfio0"}});
  tree_.AddDevice({.bdf = "0000:3b:00.1", .vendor = 0x8086, .device = 0x1572, .class_code = 0x020000,
                   .numa_node = 1, .driver = "i40e", .driver_override = "i40e", .iommu_group = 7,
                   .consumers = {"0000:3b:00.0"}, .vfio_cdevs = {"vfio1"}});
  // PCIe switch ports with a non-0604 class: only header type 1 makes them bridges.
  tree_.AddDevice({.bdf = "0000:3a:00.0", .vendor = 0x1000, .device = 0xc030, .class_code = 0x068000,
                   .header_type = 1, .numa_node = 1, .driver = "pcieport", .iommu_group = 7});
  tree_.AddDevice({.bdf = "0000:5a:00.0", .vendor = 0x1000, .device = 0xc030, .class_code = 0x068000,
                   .header_type = 1, .driver = "pcieport", .iommu_group = 9});
  auto scoped = Scan(tree_.root(), {.detail_vendor = kVendorNvidia});
  ASSERT_TRUE(scoped.ok()) << scoped.status();
  EXPECT_THAT(scoped->errors(), IsEmpty());

  const Function* nic = scoped->Find("0000:3b:00.1");
  ASSERT_NE(nic, nullptr);
  EXPECT_EQ(nic->VendorDevice(), "8086:1572");
  EXPECT_EQ(nic->class_code, 0x020000u);
  EXPECT_EQ(nic->driver, "i40e");
  EXPECT_EQ(nic->iommu_group, 7);
  EXPECT_EQ(nic->numa_node, std::nullopt);
  EXPECT_EQ(nic->driver_override, "");
  EXPECT_THAT(nic->consumers, IsEmpty());
  EXPECT_THAT(nic->vfio_cdevs, IsEmpty());
  const Function* bridge = scoped->Find("0000:3a:00.0");
  ASSERT_NE(bridge, nullptr);
  EXPECT_EQ(bridge->header_type, 1) << "a bridge in a group with the vendor's GPU";
  EXPECT_TRUE(bridge->IsBridge());
  EXPECT_EQ(scoped->Find("0000:5a:00.0")->header_type, 0) << "no config read outside the vendor's groups";
  EXPECT_THAT(scoped->Group(7)->members, ElementsAre("0000:3a:00.0", "0000:3b:00.0", "0000:3b:00.1"));

  const Function* gpu = scoped->Find("0000:3b:00.0");
  ASSERT_NE(gpu, nullptr);
  EXPECT_EQ(gpu->numa_node, 1);
  EXPECT_EQ(gpu->driver_override, "vfio-pci");
  EXPECT_THAT(gpu->consumers, ElementsAre("0000:3b:00.1"));
  EXPECT_THAT(gpu->vfio_cdevs, ElementsAre("vfio0"));

  // driver_override (the device-locked attribute) only when asked for.
  auto unlocked = Scan(tree_.root(), {.detail_vendor = kVendorNvidia, .driver_override = false});
  ASSERT_TRUE(unlocked.ok());
  EXPECT_EQ(unlocked->Find("0000:3b:00.0")->driver_override, "");
  EXPECT_EQ(unlocked->Find("0000:3b:00.0")->numa_node, 1);

  // Without a vendor every function is read in full.
  Inventory full = MustScan();
  EXPECT_EQ(full.Find("0000:3b:00.1")->numa_node, 1);
  EXPECT_EQ(full.Find("0000:3b:00.1")->driver_override, "i40e");
  EXPECT_THAT(full.Find("0000:3b:00.1")->vfio_cdevs, ElementsAre("vfio1"));
  EXPECT_EQ(full.Find("0000:5a:00.0")->header_type, 1);
}

TEST_F(InventoryTest, DriversComeFromTheDriverDirectoriesAndFromEachLinkWithoutThem) {
  tree_.AddDevice({.bdf = "0000:3b:00.0", .driver = "vfio-pci", .iommu_group = 7});
  tree_.AddDevice({.bdf = "0000:3c:00.0", .vendor = 0x8086, .class_code = 0x020000, .driver = "i40e"});
  tree_.AddDevice({.bdf = "0000:3d:00.0"});
  auto drivers_of = [&](const Inventory& inventory) {
    std::vector<std::string> drivers;
    for (const Function& fn : inventory.functions()) drivers.push_back(fn.driver);
    return drivers;
  };
  EXPECT_THAT(drivers_of(MustScan()), ElementsAre("vfio-pci", "i40e", ""));
  auto scoped = Scan(tree_.root(), {.detail_vendor = kVendorNvidia});
  ASSERT_TRUE(scoped.ok());
  EXPECT_THAT(drivers_of(*scoped), ElementsAre("vfio-pci", "i40e", ""));
  // A driver directory that cannot be listed: every device's own link is read instead.
  std::filesystem::remove_all(tree_.root() / "bus/pci/drivers/i40e");
  std::ofstream(tree_.root() / "bus/pci/drivers/i40e") << "not a directory\n";
  EXPECT_THAT(drivers_of(MustScan()), ElementsAre("vfio-pci", "i40e", ""));
  // No driver directories at all.
  std::filesystem::remove_all(tree_.root() / "bus/pci/drivers");
  EXPECT_THAT(drivers_of(MustScan()), ElementsAre("vfio-pci", "i40e", ""));
}

TEST_F(InventoryTest, VirtualFunctionNamesItsPhysicalFunction) {
  tree_.AddDevice({.bdf = "0000:3b:00.0", .iommu_group = 1});
  tree_.AddDevice({.bdf = "0000:3b:00.4", .iommu_group = 2, .physfn = "0000:3b:00.0"});
  Inventory inventory = MustScan();
  EXPECT_FALSE(inventory.Find("0000:3b:00.0")->IsVirtualFunction());
  const Function* vf = inventory.Find("0000:3b:00.4");
  ASSERT_NE(vf, nullptr);
  EXPECT_TRUE(vf->IsVirtualFunction());
  EXPECT_EQ(vf->physfn, "0000:3b:00.0");
}

TEST_F(InventoryTest, IommuOffMeansNoGroupsAndNoGroupLinks) {
  tree_.AddDevice({.bdf = "0000:01:00.0"});
  Inventory inventory = MustScan();
  EXPECT_FALSE(inventory.iommu_enabled());
  EXPECT_TRUE(inventory.groups().empty());
  EXPECT_EQ(inventory.functions()[0].iommu_group, std::nullopt);
}

TEST_F(InventoryTest, GroupListsAMemberWhoseAttributesCouldNotBeRead) {
  tree_.AddDevice({.bdf = "0000:01:00.0", .iommu_group = 4});
  tree_.AddDevice({.bdf = "0000:01:00.1", .iommu_group = 4});
  tree_.RemoveAttribute("0000:01:00.1", "vendor");
  Inventory inventory = MustScan();
  ASSERT_EQ(inventory.errors().size(), 1u);
  EXPECT_EQ(inventory.Find("0000:01:00.1"), nullptr);
  ASSERT_NE(inventory.Group(4), nullptr);
  EXPECT_THAT(inventory.Group(4)->members, ElementsAre("0000:01:00.0", "0000:01:00.1"));
}

TEST_F(InventoryTest, CorruptGroupLinkIsAnError) {
  tree_.AddDevice({.bdf = "0000:01:00.0", .iommu_group = 4});
  tree_.RemoveAttribute("0000:01:00.0", "iommu_group");
  std::filesystem::create_symlink("../../../kernel/iommu_groups/four",
                                  tree_.DeviceDir("0000:01:00.0") / "iommu_group");
  Inventory inventory = MustScan();
  ASSERT_EQ(inventory.errors().size(), 1u);
  EXPECT_EQ(inventory.errors()[0].path.filename(), "iommu_group");
}

TEST_F(InventoryTest, UnexpectedEntryInDeviceListIsReported) {
  tree_.AddDevice({.bdf = "0000:01:00.0"});
  std::filesystem::create_directory(tree_.root() / "bus/pci/devices/not-a-bdf");
  Inventory inventory = MustScan();
  EXPECT_EQ(inventory.functions().size(), 1u);
  ASSERT_EQ(inventory.errors().size(), 1u);
  EXPECT_EQ(inventory.errors()[0].bdf, "not-a-bdf");
}

TEST_F(InventoryTest, ScanFailsOnlyWithoutADeviceList) {
  TempDir empty;
  auto inventory = Scan(empty.path());
  ASSERT_FALSE(inventory.ok());
  EXPECT_THAT(inventory.status().message(), HasSubstr("bus/pci/devices"));
}

TEST_F(InventoryTest, ReadFunctionRereadsOneDevice) {
  tree_.AddDevice({.bdf = "0000:3b:00.0", .driver = "nvidia", .iommu_group = 3});
  auto fn = ReadFunction(tree_.root(), "0000:3B:00.0");
  ASSERT_TRUE(fn.ok()) << fn.status();
  EXPECT_EQ(fn->bdf, "0000:3b:00.0");
  EXPECT_EQ(fn->driver, "nvidia");

  tree_.BindDriver("0000:3b:00.0", "vfio-pci");
  fn = ReadFunction(tree_.root(), "0000:3b:00.0");
  ASSERT_TRUE(fn.ok()) << fn.status();
  EXPECT_EQ(fn->driver, "vfio-pci");

  auto missing = ReadFunction(tree_.root(), "0000:3c:00.0");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("0000:3c:00.0"));
  EXPECT_EQ(ReadFunction(tree_.root(), "bogus").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MakeInventoryTest, SortsFunctionsAndDerivesGroups) {
  Function b{.bdf = "0000:02:00.0", .iommu_group = 5};
  Function a{.bdf = "0000:01:00.0", .iommu_group = 5};
  Function c{.bdf = "0000:03:00.0"};
  Inventory inventory = MakeInventory({b, c, a}, {}, true);
  ASSERT_EQ(inventory.functions().size(), 3u);
  EXPECT_EQ(inventory.functions()[0].bdf, "0000:01:00.0");
  EXPECT_EQ(inventory.functions()[2].bdf, "0000:03:00.0");
  ASSERT_NE(inventory.Group(5), nullptr);
  EXPECT_THAT(inventory.Group(5)->members, ElementsAre("0000:01:00.0", "0000:02:00.0"));
  EXPECT_EQ(inventory.Group(6), nullptr);
  EXPECT_EQ(inventory.Find("0000:04:00.0"), nullptr);
  EXPECT_NE(inventory.Find("0000:02:00.0"), nullptr);
}

TEST_F(InventoryTest, IdsAndClassComeFromModaliasWhenItIsPresent) {
  tree_.AddDevice({.bdf = "0000:3b:00.0", .subsystem_device = 0x18be, .class_code = 0x030201});
  // Only modalias is left to tell the ids: the scan must not need the individual files.
  for (const char* name : {"vendor", "device", "subsystem_vendor", "subsystem_device", "class"}) {
    std::filesystem::remove(tree_.DeviceDir("0000:3b:00.0") / name);
  }
  Inventory inventory = MustScan();
  EXPECT_THAT(inventory.errors(), IsEmpty());
  const Function* fn = inventory.Find("0000:3b:00.0");
  ASSERT_NE(fn, nullptr);
  EXPECT_EQ(fn->VendorDevice(), "10de:2335");
  EXPECT_EQ(fn->subsystem_vendor_id, 0x10de);
  EXPECT_EQ(fn->subsystem_device_id, 0x18be);
  EXPECT_EQ(fn->class_code, 0x030201u);
}

TEST_F(InventoryTest, WithoutModaliasIdsComeFromTheIndividualFiles) {
  tree_.AddDevice({.bdf = "0000:3b:00.0", .vendor = 0x8086, .device = 0x1572, .subsystem_vendor = 0x8086,
                   .subsystem_device = 0x0001, .class_code = 0x020000, .modalias = false});
  Inventory inventory = MustScan();
  EXPECT_THAT(inventory.errors(), IsEmpty());
  const Function* fn = inventory.Find("0000:3b:00.0");
  ASSERT_NE(fn, nullptr);
  EXPECT_EQ(fn->VendorDevice(), "8086:1572");
  EXPECT_EQ(fn->subsystem_vendor_id, 0x8086);
  EXPECT_EQ(fn->subsystem_device_id, 0x0001);
  EXPECT_EQ(fn->class_code, 0x020000u);
}

TEST_F(InventoryTest, MalformedModaliasFallsBackToTheIndividualFiles) {
  const char* malformed[] = {
      "",
      "garbage\n",
      "pci:v000010DEd00002335\n",                                  // truncated
      "pci:v000010DEd00002335sv000010DEsd000018BEbc03sc02i00x\n",  // trailing junk
      "pci:v000110DEd00002335sv000010DEsd000018BEbc03sc02i00\n",   // vendor wider than 16 bits
      "pci:v000010DEd0000233Gsv000010DEsd000018BEbc03sc02i00\n",   // not hex
      "pci:i00\n",
      "usb:v000010DEd00002335sv000010DEsd000018BEbc03sc02i00\n",
  };
  int bus = 1;
  for (const char* text : malformed) {
    const std::string bdf = absl::StrFormat("0000:%02x:00.0", bus++);
    tree_.AddDevice({.bdf = bdf, .vendor = 0x1234, .device = 0x5678, .class_code = 0x030000});
    tree_.WriteAttribute(bdf, "modalias", text);
  }
  Inventory inventory = MustScan();
  EXPECT_THAT(inventory.errors(), IsEmpty());
  ASSERT_EQ(inventory.functions().size(), std::size(malformed));
  for (size_t i = 0; i < std::size(malformed); ++i) {
    const Function& fn = inventory.functions()[i];
    EXPECT_EQ(fn.VendorDevice(), "1234:5678") << malformed[i];
    EXPECT_EQ(fn.class_code, 0x030000u) << malformed[i];
    EXPECT_EQ(fn.subsystem_device_id, 0x18be) << malformed[i];
  }
}

TEST(CanonicalBdfTest, AcceptsAndNormalises) {
  EXPECT_EQ(*CanonicalBdf("0000:3B:00.0"), "0000:3b:00.0");
  EXPECT_EQ(*CanonicalBdf("3b:00.1"), "0000:3b:00.1");
  EXPECT_EQ(*CanonicalBdf(" 0000:00:1f.7\n"), "0000:00:1f.7");
  EXPECT_EQ(*CanonicalBdf("10000:e1:00.0"), "10000:e1:00.0") << "VMD domains are wider than 16 bits";
}

// The scan's allocation-free check must agree with CanonicalBdf on what a device-list entry may be called.
TEST(CanonicalBdfTest, ScanCheckAcceptsExactlyTheCanonicalSpelling) {
  for (const char* text : {"0000:3b:00.0", "0000:00:1f.7", "10000:e1:00.0", "ffffffff:ff:1f.7", "0001:00:00.0",
                           "0000:3B:00.0", "3b:00.0", " 0000:3b:00.0", "0000:3b:00.0\n", "00000:3b:00.0",
                           "010000:e1:00.0", "0000:3b:20.0", "0000:3b:00.8", "0000:3b:0.0", "0000:3g:00.0",
                           "0000-3b-00.0", "0000:3b:00.", "", "123456789:00:00.0", "0000:3b:1f.0", "0000:3b:2f.0"}) {
    auto canonical = CanonicalBdf(text);
    EXPECT_EQ(internal::IsCanonicalBdf(text), canonical.ok() && *canonical == text) << '"' << text << '"';
  }
}

TEST(CanonicalBdfTest, RejectsMalformed) {
  for (const char* text : {"", "3b:00", "0000:3b:00", "0000:3b:20.0", "0000:3b:00.8", "000:3b:00.0",
                           "0000:3b:0.0", "0000:3g:00.0", "0000:3b:00.0.1", "0000-3b-00.0", "3b.00:0",
                           "0000:3b:00.", ":3b:00.0", "0000:0000:3b:00.0"}) {
    EXPECT_FALSE(CanonicalBdf(text).ok()) << text;
  }
}

}  // namespace
}  // namespace vfio_agent::pci
