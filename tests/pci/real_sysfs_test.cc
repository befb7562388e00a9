// Scans this machine's real /sys, read-only: the parser must cope with a kernel-made tree it did not build.
#include <unistd.h>

#include <gtest/gtest.h>

#include "vfio_gpu_agent/pci/inventory.h"
#include "vfio_gpu_agent/pci/selection.h"

namespace vfio_agent::pci {
namespace {

TEST(RealSysfsTest, ScansReadOnlyAndSelectsNoGpuOnAMachineWithoutNvidia) {
  if (::access("/sys/bus/pci/devices", R_OK) != 0) GTEST_SKIP() << "no PCI bus in /sys here";
  auto inventory = Scan("/sys");
  ASSERT_TRUE(inventory.ok()) << inventory.status();
  EXPECT_GT(inventory->functions().size(), 0u);
  for (const ScanError& error : inventory->errors()) ADD_FAILURE() << error.bdf << ": " << error.status;
  for (const Function& fn : inventory->functions()) {
    EXPECT_NE(fn.vendor_id, 0) << fn.bdf;
    if (fn.vendor_id == kVendorNvidia) GTEST_SKIP() << "this machine has NVIDIA devices; nothing to assert";
  }
  Selection selection = Select(*inventory, SelectionPolicy{});
  EXPECT_TRUE(selection.gpus.empty());
  EXPECT_TRUE(selection.companions.empty());
  EXPECT_TRUE(selection.groups.empty());
}

}  // namespace
}  // namespace vfio_agent::pci
