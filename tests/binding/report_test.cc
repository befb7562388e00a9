#include <google/protobuf/util/json_util.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "report/v1/bind.pb.h"
#include "vfio_gpu_agent/binding/binder.h"

namespace vfio_agent::binding {
namespace {

using ::testing::HasSubstr;

DeviceResult Device(std::string bdf, Outcome outcome, std::string before, std::string after, std::string reason = "") {
  DeviceResult device;
  device.bdf = std::move(bdf);
  device.vendor_device = "10de:2236";
  device.iommu_group = 33;
  device.driver_before = std::move(before);
  device.driver_after = std::move(after);
  device.target_driver = "vfio-pci";
  device.outcome = outcome;
  device.reason = std::move(reason);
  return device;
}

TEST(BindReportTest, OkOnlyWhenEveryDeviceIsOnTarget) {
  BindReport report;
  report.operation = "bind";
  report.devices = {Device("0000:3b:00.0", Outcome::kBound, "nvidia", "vfio-pci"),
                    Device("0000:86:00.0", Outcome::kAlreadyBound, "vfio-pci", "vfio-pci")};
  EXPECT_TRUE(report.ok());
  for (Outcome bad : {Outcome::kBlocked, Outcome::kFailed, Outcome::kRefused}) {
    BindReport with_bad = report;
    with_bad.devices.push_back(Device("0000:d8:00.0", bad, "nvidia", "nvidia"));
    EXPECT_FALSE(with_bad.ok()) << OutcomeName(bad);
  }
}

TEST(BindReportTest, TextHasOneLinePerDeviceAndASummary) {
  BindReport report;
  report.operation = "bind";
  report.notes = {"no modules.alias"};
  report.devices = {Device("0000:3b:00.0", Outcome::kBound, "nvidia", "vfio-pci"),
                    Device("0000:86:00.0", Outcome::kFailed, "nvidia", "", "driver after bind is none")};
  const std::string text = FormatBindReport(report);
  EXPECT_THAT(text, HasSubstr("note: no modules.alias\n"));
  EXPECT_THAT(text, HasSubstr("0000:3b:00.0 10de:2236 gpu group 33: bound nvidia -> vfio-pci\n"));
  EXPECT_THAT(text, HasSubstr("0000:86:00.0 10de:2236 gpu group 33: failed (on (no driver)): driver after bind is none\n"));
  EXPECT_THAT(text, HasSubstr("bind: 2 device(s): 1 bound, 1 failed - NOT OK\n"));
}

TEST(BindReportTest, JsonCarriesHoldersAndSteps) {
  BindReport report;
  report.operation = "unbind";
  DeviceResult device = Device("0000:3b:00.0", Outcome::kRefused, "vfio-pci", "vfio-pci", "open");
  device.holders = {{.pid = 4242, .comm = "qemu-kvm", .what = "/dev/vfio/33 open"}};
  device.steps = {"bus/pci/drivers_probe <- 0000:3b:00.0: ok"};
  report.devices = {device};
  report::v1::BindReport parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(BindReportToJson(report), &parsed).ok());
  EXPECT_FALSE(parsed.ok());
  ASSERT_EQ(parsed.devices_size(), 1);
  EXPECT_EQ(parsed.devices(0).outcome(), report::v1::OUTCOME_REFUSED);
  ASSERT_EQ(parsed.devices(0).holders_size(), 1);
  EXPECT_EQ(parsed.devices(0).holders(0).pid(), 4242);
  EXPECT_EQ(parsed.devices(0).holders(0).comm(), "qemu-kvm");
  EXPECT_EQ(parsed.devices(0).steps(0), "bus/pci/drivers_probe <- 0000:3b:00.0: ok");
}

}  // namespace
}  // namespace vfio_agent::binding
