// Scans this machine's real /sys, read-only: the parser must cope with a kernel-made tree it did not build,
// and selection must agree with an independent reading of the same files, on a machine with NVIDIA GPUs
// (where it matters most) as well as on one without.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "vfio_gpu_agent/pci/inventory.h"
#include "vfio_gpu_agent/pci/selection.h"

namespace vfio_agent::pci {
namespace {

namespace stdfs = std::filesystem;

// One attribute as text, read with the standard library only (not the code under test).
std::string Attribute(const stdfs::path& device, const char* name) {
  std::ifstream in(device / name);
  std::string value;
  in >> value;
  return value;
}

// Every function's driver_override, to show the scan wrote nothing.
std::map<std::string, std::string> Overrides() {
  std::map<std::string, std::string> out;
  for (const auto& entry : stdfs::directory_iterator("/sys/bus/pci/devices")) {
    out[entry.path().filename().string()] = Attribute(entry.path(), "driver_override");
  }
  return out;
}

TEST(RealSysfsTest, ScansReadOnlyAndSelectsExactlyTheVendorsDisplayFunctions) {
  if (::access("/sys/bus/pci/devices", R_OK) != 0) GTEST_SKIP() << "no PCI bus in /sys here";
  const std::map<std::string, std::string> overrides_before = Overrides();

  // The oracle: NVIDIA functions of class 0300 or 0302, straight from the vendor and class files.
  std::set<std::string> expected_gpus;
  size_t functions = 0;
  for (const auto& entry : stdfs::directory_iterator("/sys/bus/pci/devices")) {
    ++functions;
    const std::string klass = Attribute(entry.path(), "class");
    if (Attribute(entry.path(), "vendor") == "0x10de" &&
        (klass.starts_with("0x0300") || klass.starts_with("0x0302"))) {
      expected_gpus.insert(entry.path().filename().string());
    }
  }
  RecordProperty("nvidia_gpus", static_cast<int>(expected_gpus.size()));

  auto inventory = Scan("/sys");
  ASSERT_TRUE(inventory.ok()) << inventory.status();
  EXPECT_EQ(inventory->functions().size(), functions);
  for (const ScanError& error : inventory->errors()) ADD_FAILURE() << error.bdf << ": " << error.status;
  for (const Function& fn : inventory->functions()) EXPECT_NE(fn.vendor_id, 0) << fn.bdf;

  const Selection selection = Select(*inventory, SelectionPolicy{});
  EXPECT_EQ(std::set<std::string>(selection.gpus.begin(), selection.gpus.end()), expected_gpus);
  for (const std::string& bdf : selection.gpus) {
    EXPECT_EQ(selection.RoleOf(bdf), Role::kGpu) << bdf;
    const Function* fn = inventory->Find(bdf);
    ASSERT_NE(fn, nullptr) << bdf;
    // Each selected GPU is in its IOMMU group's assessment (or listed as unisolated when the IOMMU is off).
    if (fn->iommu_group) {
      EXPECT_NE(selection.GroupOf(*fn), nullptr) << bdf;
    } else {
      EXPECT_NE(std::find(selection.unisolated.begin(), selection.unisolated.end(), bdf), selection.unisolated.end());
    }
  }
  // Companions are the vendor's functions that share a selected GPU's group, and nothing else.
  for (const std::string& bdf : selection.companions) {
    const Function* fn = inventory->Find(bdf);
    ASSERT_NE(fn, nullptr) << bdf;
    EXPECT_EQ(fn->vendor_id, kVendorNvidia) << bdf;
    EXPECT_NE(selection.GroupOf(*fn), nullptr) << bdf;
  }
  if (expected_gpus.empty()) {
    EXPECT_TRUE(selection.companions.empty());
    EXPECT_TRUE(selection.groups.empty());
  }
  EXPECT_EQ(Overrides(), overrides_before) << "the scan must not write to /sys";
}

}  // namespace
}  // namespace vfio_agent::pci
