// Bind and unbind against the FUSE sysfs simulator, which reacts like the kernel (driver_override,
// bind/unbind/drivers_probe semantics, /dev/vfio nodes) and injects faults through its control file.
#include <fcntl.h>
#include <google/protobuf/util/json_util.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "report/v1/bind.pb.h"
#include "sim_process.h"
#include "support/fuse.h"
#include "support/holding_process.h"
#include "vfio_gpu_agent/binding/binder.h"
#include "vfio_gpu_agent/common/fs.h"

namespace vfio_agent::binding {
namespace {

namespace stdfs = std::filesystem;
using ::testing::Contains;
using ::testing::Each;
using ::testing::Field;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

constexpr absl::Duration kGenerous = absl::Seconds(20);

class BinderSimTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!vfio_agent::testing::FuseAvailable()) GTEST_SKIP() << vfio_agent::testing::kNeedsFuse;
    std::string tmpl = (stdfs::temp_directory_path() / "va-binder-XXXXXX").string();
    tmp_ = mkdtemp(tmpl.data());
  }
  void TearDown() override {
    sim_.reset();
    if (!tmp_.empty()) stdfs::remove_all(tmp_);
  }

  void Start(const stdfs::path& node_file) {
    stdfs::create_directories(tmp_ / "root");
    absl::StatusOr<std::unique_ptr<sim::SimProcess>> sim = sim::SimProcess::Start(node_file, tmp_ / "root");
    ASSERT_TRUE(sim.ok()) << sim.status();
    sim_ = *std::move(sim);
    paths_.sysfs_root = sim_->sysfs_root();
    paths_.dev_root = sim_->dev_root();
    paths_.proc_root = "/proc";
    paths_.modules_root = tmp_ / "modules";  // empty: no variants, and no module could ever be loaded
  }
  void StartNode(const std::string& name) { Start(sim::NodeFile(name)); }

  // Deadlines a test wants met are generous: a loaded machine must make a test slower, never fail it. A
  // deadline a test wants hit is made certain by the simulator instead (unbind-delay -1 blocks until release).
  BinderOptions BindOptions() const {
    BinderOptions options;
    options.paths = paths_;
    options.targets = vfio_agent::binding::Targets::EverySelected();
    options.write_timeout = kGenerous;
    options.devnode_wait = kGenerous;
    options.kernel_release = "6.1.0-sim";
    return options;
  }
  UnbindOptions RestoreOptions() const {
    UnbindOptions options;
    options.paths = paths_;
    options.targets = vfio_agent::binding::Targets::EverySelected();
    options.write_timeout = kGenerous;
    return options;
  }

  BindReport MustBind(const BinderOptions& options) {
    absl::StatusOr<BindReport> report = Bind(options);
    EXPECT_TRUE(report.ok()) << report.status();
    return report.ok() ? *std::move(report) : BindReport{};
  }
  BindReport MustUnbind(const UnbindOptions& options) {
    absl::StatusOr<BindReport> report = Unbind(options);
    EXPECT_TRUE(report.ok()) << report.status();
    return report.ok() ? *std::move(report) : BindReport{};
  }

  std::string Driver(const std::string& bdf) const {
    absl::StatusOr<std::string> driver = fs::ReadLinkBasename(paths_.PciDevice(bdf) / "driver");
    return driver.ok() ? *driver : "";
  }
  std::string Override(const std::string& bdf) const {
    return fs::ReadTrimmed(paths_.PciDevice(bdf) / "driver_override").value_or("?");
  }
  // Polls the simulator's log until a line equal to `line` appears (the simulator got there); false after a
  // generous limit.
  bool WaitForLogLine(const std::string& line) const {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      const std::vector<std::string> log = sim_->Log();
      if (std::find(log.begin(), log.end(), line) != log.end()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }
  std::vector<std::string> LogAbout(const std::string& bdf) const {
    std::vector<std::string> lines;
    for (const std::string& line : sim_->Log()) {
      if (line.find(bdf) != std::string::npos) lines.push_back(line);
    }
    return lines;
  }
  static const DeviceResult& Device(const BindReport& report, const std::string& bdf) {
    for (const DeviceResult& device : report.devices) {
      if (device.bdf == bdf) return device;
    }
    static const DeviceResult missing;
    ADD_FAILURE() << bdf << " not in report:\n" << FormatBindReport(report);
    return missing;
  }
  static std::map<Outcome, int> Count(const BindReport& report) {
    std::map<Outcome, int> counts;
    for (const DeviceResult& device : report.devices) ++counts[device.outcome];
    return counts;
  }

  stdfs::path tmp_;
  std::unique_ptr<sim::SimProcess> sim_;
  HostPaths paths_;
};

struct NodeCase {
  std::string node;
  int bound = 0;
  int already = 0;
  int blocked = 0;
};

class EveryNodeTest : public BinderSimTest, public ::testing::WithParamInterface<NodeCase> {};

// Every shipped node: the outcome counts, the kernel-visible result of each bound device, no sysfs write for
// a device that was not to be moved, and a second run that writes nothing at all.
TEST_P(EveryNodeTest, BindsWhatCanBeBoundAndRerunIsANoOp) {
  const NodeCase& node = GetParam();
  StartNode(node.node);
  const BindReport report = MustBind(BindOptions());
  SCOPED_TRACE(FormatBindReport(report));
  std::map<Outcome, int> counts = Count(report);
  EXPECT_EQ(counts[Outcome::kBound], node.bound);
  EXPECT_EQ(counts[Outcome::kAlreadyBound], node.already);
  EXPECT_EQ(counts[Outcome::kBlocked], node.blocked);
  EXPECT_EQ(counts[Outcome::kFailed], 0);
  EXPECT_EQ(report.ok(), node.blocked == 0);
  for (const DeviceResult& device : report.devices) {
    if (device.outcome == Outcome::kBound || device.outcome == Outcome::kAlreadyBound) {
      EXPECT_EQ(Driver(device.bdf), "vfio-pci") << device.bdf;
      ASSERT_TRUE(device.iommu_group.has_value());
      EXPECT_TRUE(fs::Exists(paths_.VfioDir() / std::to_string(*device.iommu_group))) << device.bdf;
    } else {
      EXPECT_THAT(LogAbout(device.bdf), IsEmpty()) << device.bdf;
      EXPECT_NE(Driver(device.bdf), "vfio-pci");
    }
    if (device.outcome == Outcome::kAlreadyBound) {
      EXPECT_THAT(LogAbout(device.bdf), IsEmpty());
    }
  }

  const std::vector<std::string> log_before = sim_->Log();
  const BindReport again = MustBind(BindOptions());
  EXPECT_EQ(sim_->Log(), log_before) << "a second bind must not write to sysfs";
  std::map<Outcome, int> again_counts = Count(again);
  EXPECT_EQ(again_counts[Outcome::kAlreadyBound], node.bound + node.already);
  EXPECT_EQ(again_counts[Outcome::kBlocked], node.blocked);
  EXPECT_EQ(again.ok(), node.blocked == 0);
}

INSTANTIATE_TEST_SUITE_P(Nodes, EveryNodeTest,
                         ::testing::Values(NodeCase{"hgx-h200-8gpu.json", 8, 0, 0}, NodeCase{"a10x2-nvidia.json", 2, 0, 0},
                                           NodeCase{"workstation-gpu-audio-usb.json", 4, 0, 0},
                                           NodeCase{"gpu-foreign-nic.json", 1, 0, 1},
                                           NodeCase{"gpu-behind-bridge.json", 1, 0, 0},
                                           NodeCase{"iommu-off.json", 0, 0, 2}, NodeCase{"a10-t4-mixed.json", 0, 4, 0}),
                         [](const auto& info) {
                           std::string name = info.param.node.substr(0, info.param.node.find('.'));
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST_F(BinderSimTest, ForeignDeviceInGroupIsReportedAndUntouched) {
  StartNode("gpu-foreign-nic.json");
  const BindReport report = MustBind(BindOptions());
  const DeviceResult& gpu = Device(report, "0000:3b:00.0");
  EXPECT_EQ(gpu.outcome, Outcome::kBlocked);
  EXPECT_EQ(gpu.failure, Failure::kIommuGroup);
  EXPECT_THAT(gpu.reason, HasSubstr("0000:3c:00.0 8086:1572 bound to i40e"));
  EXPECT_EQ(Driver("0000:3b:00.0"), "nvidia");
  EXPECT_EQ(Driver("0000:3c:00.0"), "i40e");
  EXPECT_THAT(LogAbout("0000:3c:00.0"), IsEmpty());
  EXPECT_EQ(Device(report, "0000:86:00.0").outcome, Outcome::kBound);
  EXPECT_THAT(FormatBindReport(report), HasSubstr("0000:3b:00.0 10de:2236 gpu group 30: blocked"));
}

TEST_F(BinderSimTest, BridgeInGroupStaysOnItsDriver) {
  StartNode("gpu-behind-bridge.json");
  const BindReport report = MustBind(BindOptions());
  EXPECT_EQ(Device(report, "0000:5e:00.0").outcome, Outcome::kBound);
  EXPECT_EQ(Driver("0000:5d:00.0"), "pcieport");
  EXPECT_THAT(LogAbout("0000:5d:00.0"), IsEmpty());
}

TEST_F(BinderSimTest, NvSwitchesOnlyWithTheSwitch) {
  StartNode("hgx-h200-8gpu.json");
  BinderOptions options = BindOptions();
  options.policy.include_nvswitches = true;
  const BindReport report = MustBind(options);
  EXPECT_EQ(Count(report)[Outcome::kBound], 12);
  EXPECT_EQ(Device(report, "0000:05:00.0").role, pci::Role::kNvSwitch);
  EXPECT_EQ(Driver("0000:05:00.0"), "vfio-pci");
}

TEST_F(BinderSimTest, DryRunWritesNothing) {
  StartNode("a10x2-nvidia.json");
  BinderOptions options = BindOptions();
  options.dry_run = true;
  const BindReport report = MustBind(options);
  EXPECT_THAT(report.devices, Each(Field(&DeviceResult::outcome, Outcome::kWouldBind)));
  EXPECT_EQ(report.devices.size(), 2u);
  EXPECT_TRUE(report.ok());
  EXPECT_THAT(sim_->Log(), IsEmpty());
  EXPECT_EQ(Driver("0000:3b:00.0"), "nvidia");
}

TEST_F(BinderSimTest, OnlyBindsTheNamedDevice) {
  StartNode("a10x2-nvidia.json");
  BinderOptions options = BindOptions();
  options.targets = vfio_agent::binding::Targets::Devices({"86:00.0"});
  const BindReport report = MustBind(options);
  ASSERT_EQ(report.devices.size(), 1u);
  EXPECT_EQ(report.devices[0].outcome, Outcome::kBound);
  EXPECT_EQ(Driver("0000:86:00.0"), "vfio-pci");
  EXPECT_EQ(Driver("0000:3b:00.0"), "nvidia");
  options.targets = vfio_agent::binding::Targets::Devices({"0000:99:00.0"});
  EXPECT_FALSE(Bind(options).ok());
}

// An empty list of devices is nothing, never the whole node: a DRA claim of vGPUs once gave the binder no BDF and
// every GPU of the node left its host driver (issue 31, defect 1).
TEST_F(BinderSimTest, NoNamedDeviceBindsNothing) {
  StartNode("a10x2-nvidia.json");
  BinderOptions options = BindOptions();
  options.targets = vfio_agent::binding::Targets::Devices({});
  const absl::StatusOr<BindReport> report = Bind(options);
  ASSERT_FALSE(report.ok());
  EXPECT_THAT(std::string(report.status().message()), HasSubstr("no device named"));
  EXPECT_THAT(sim_->Log(), IsEmpty());
  EXPECT_EQ(Driver("0000:3b:00.0"), "nvidia");
  EXPECT_EQ(Driver("0000:86:00.0"), "nvidia");
  UnbindOptions unbind = RestoreOptions();
  unbind.targets = vfio_agent::binding::Targets::Devices({});
  EXPECT_FALSE(Unbind(unbind).ok());
}

// One GPU's unbind never returns (nvidia waiting for its clients): that device is abandoned at the
// deadline and reported with who holds it; the seven other groups are bound meanwhile. The stuck unbind is
// blocked by the simulator until released, so its deadline is hit however fast the machine is; every other
// write has the same deadline, which at 5 s is still far more than a loaded machine needs.
TEST_F(BinderSimTest, BlockedUnbindIsAbandonedAndHolderReported) {
  StartNode("hgx-h200-8gpu.json");
  const std::string stuck = "0000:3b:00.0";
  ASSERT_TRUE(sim_->Control("unbind-delay " + stuck + " -1").ok());
  vfio_agent::testing::HoldingProcess cuda_app(paths_.dev_root / "nvidia0");
  BinderOptions options = BindOptions();
  options.write_timeout = absl::Seconds(5);
  const BindReport report = MustBind(options);
  SCOPED_TRACE(FormatBindReport(report));

  const DeviceResult& blocked = Device(report, stuck);
  EXPECT_EQ(blocked.outcome, Outcome::kBlocked);
  EXPECT_EQ(blocked.failure, Failure::kWriteDeadline);
  EXPECT_THAT(blocked.reason, HasSubstr("did not return within 5s"));
  EXPECT_THAT(blocked.reason, HasSubstr(absl::StrCat("pid ", cuda_app.pid())));
  EXPECT_THAT(blocked.holders, Contains(Field(&Holder::pid, cuda_app.pid())));
  EXPECT_FALSE(report.ok());
  EXPECT_EQ(Count(report)[Outcome::kBound], 7);
  EXPECT_THAT(BindReportToJson(report), HasSubstr("\"OUTCOME_BLOCKED\""));
  EXPECT_EQ(Driver(stuck), "nvidia") << "the unbind is still held";

  // The kernel finishes the unbind once the clients go; the abandoned writer thread then returns.
  ASSERT_TRUE(sim_->Control("release " + stuck).ok());
  EXPECT_TRUE(WaitForLogLine("unbind " + stuck + " nvidia"));
}

class BindErrnoTest : public BinderSimTest, public ::testing::WithParamInterface<std::pair<std::string, std::string>> {};

TEST_P(BindErrnoTest, FailedProbeIsReportedAndOtherGroupsBind) {
  const auto& [errno_name, text] = GetParam();
  StartNode("a10x2-nvidia.json");
  ASSERT_TRUE(sim_->Control("bind-errno 0000:3b:00.0 " + errno_name).ok());
  const BindReport report = MustBind(BindOptions());
  SCOPED_TRACE(FormatBindReport(report));
  const DeviceResult& failed = Device(report, "0000:3b:00.0");
  EXPECT_EQ(failed.outcome, Outcome::kFailed);
  EXPECT_EQ(failed.failure, Failure::kBindFailed);
  EXPECT_TRUE(failed.holders.empty());
  EXPECT_THAT(failed.reason, HasSubstr(text));
  EXPECT_THAT(failed.steps, Contains(HasSubstr("drivers_probe")));  // the fallback is visible, not silent
  EXPECT_EQ(failed.driver_after, Driver("0000:3b:00.0"));
  EXPECT_NE(Driver("0000:3b:00.0"), "vfio-pci");
  EXPECT_EQ(Device(report, "0000:86:00.0").outcome, Outcome::kBound);
  EXPECT_FALSE(report.ok());
}

INSTANTIATE_TEST_SUITE_P(Errnos, BindErrnoTest,
                         ::testing::Values(std::pair{"EBUSY", "Device or resource busy"},
                                           std::pair{"ENODEV", "No such device"},
                                           std::pair{"EINVAL", "Invalid argument"}),
                         [](const auto& info) { return info.param.first; });

TEST_F(BinderSimTest, DeviceRemovedMidBind) {
  StartNode("a10x2-nvidia.json");
  // The unbind blocks until the device goes: the removal lands while the bind is inside it, on any machine.
  ASSERT_TRUE(sim_->Control("unbind-delay 0000:3b:00.0 -1").ok());
  absl::StatusOr<BindReport> report;
  std::thread bind([&] { report = Bind(BindOptions()); });
  const bool waiting = WaitForLogLine("unbind-wait 0000:3b:00.0 nvidia");
  ASSERT_TRUE(sim_->Control("remove 0000:3b:00.0").ok());  // also ends the wait: never leaves the thread hanging
  bind.join();
  ASSERT_TRUE(waiting) << "the bind never reached the unbind";
  ASSERT_TRUE(report.ok()) << report.status();
  SCOPED_TRACE(FormatBindReport(*report));
  const DeviceResult& removed = Device(*report, "0000:3b:00.0");
  EXPECT_EQ(removed.outcome, Outcome::kFailed);
  EXPECT_EQ(removed.failure, Failure::kDeviceRemoved);
  EXPECT_THAT(removed.reason, HasSubstr("removed"));
  EXPECT_EQ(Device(*report, "0000:86:00.0").outcome, Outcome::kBound);
  EXPECT_FALSE(report->ok());
}

TEST_F(BinderSimTest, MissingVfioDriverIsReportedWithoutTouchingDevices) {
  std::ifstream in(sim::NodeFile("a10x2-nvidia.json"));
  std::string node((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string entry = "\"vfio-pci\"";
  const size_t at = node.find(entry);
  ASSERT_NE(at, std::string::npos);
  node.replace(at, entry.size(), "\"snd_hda_intel\"");
  std::ofstream(tmp_ / "no-vfio.json") << node;
  Start(tmp_ / "no-vfio.json");
  const BindReport report = MustBind(BindOptions());
  SCOPED_TRACE(FormatBindReport(report));
  EXPECT_THAT(report.devices, Each(Field(&DeviceResult::outcome, Outcome::kBlocked)));
  EXPECT_THAT(report.devices, Each(Field(&DeviceResult::failure, Failure::kDriver)));
  EXPECT_THAT(report.devices, Each(Field(&DeviceResult::reason, HasSubstr("vfio_pci"))));
  EXPECT_THAT(sim_->Log(), IsEmpty());
}

TEST_F(BinderSimTest, UnbindRefusesAGroupAVmHoldsUnlessForced) {
  StartNode("a10x2-nvidia.json");
  ASSERT_TRUE(MustBind(BindOptions()).ok());
  vfio_agent::testing::HoldingProcess vm(paths_.VfioDir() / "33");  // 0000:3b:00.0's group
  const size_t log_size = sim_->Log().size();

  const BindReport refused = MustUnbind(RestoreOptions());
  SCOPED_TRACE(FormatBindReport(refused));
  const DeviceResult& held = Device(refused, "0000:3b:00.0");
  EXPECT_EQ(held.outcome, Outcome::kRefused);
  EXPECT_THAT(held.reason, HasSubstr(absl::StrCat("pid ", vm.pid())));
  EXPECT_THAT(held.holders, Contains(Field(&Holder::pid, vm.pid())));
  EXPECT_EQ(Driver("0000:3b:00.0"), "vfio-pci");
  EXPECT_EQ(Device(refused, "0000:86:00.0").outcome, Outcome::kRestored);
  EXPECT_FALSE(refused.ok());
  const std::vector<std::string> log = sim_->Log();
  for (size_t i = log_size; i < log.size(); ++i) EXPECT_THAT(log[i], Not(HasSubstr("0000:3b:00.0")));

  UnbindOptions force = RestoreOptions();
  force.force = true;
  const BindReport forced = MustUnbind(force);
  EXPECT_EQ(Device(forced, "0000:3b:00.0").outcome, Outcome::kRestored);
  EXPECT_EQ(Driver("0000:3b:00.0"), "nvidia");
}

TEST_F(BinderSimTest, UnbindRestoresEveryFunctionToItsOriginalDriver) {
  StartNode("workstation-gpu-audio-usb.json");
  const std::map<std::string, std::string> original = {{"0000:01:00.0", "nvidia"},
                                                       {"0000:01:00.1", "snd_hda_intel"},
                                                       {"0000:01:00.2", "xhci_hcd"},
                                                       {"0000:01:00.3", "nvidia-gpu"}};
  ASSERT_TRUE(MustBind(BindOptions()).ok());
  for (const auto& [bdf, driver] : original) ASSERT_EQ(Driver(bdf), "vfio-pci") << bdf;

  const BindReport report = MustUnbind(RestoreOptions());
  SCOPED_TRACE(FormatBindReport(report));
  EXPECT_TRUE(report.ok());
  for (const auto& [bdf, driver] : original) {
    EXPECT_EQ(Driver(bdf), driver) << bdf;
    EXPECT_EQ(Device(report, bdf).outcome, Outcome::kRestored);
    EXPECT_EQ(Device(report, bdf).driver_after, driver);
    EXPECT_EQ(Override(bdf), "(null)") << bdf;
  }
  EXPECT_EQ(Driver("0000:00:01.0"), "pcieport");
  EXPECT_THAT(LogAbout("0000:00:01.0"), IsEmpty());
}

// return_to: each function goes back to the driver the caller recorded, not to what a reprobe would pick: the
// USB controller, unbound before (say the host had no use for it), stays without a driver although xhci_hcd would
// take it on a reprobe; the UCSI function goes to the driver named even though it differs from its default.
TEST_F(BinderSimTest, UnbindReturnsEachFunctionToTheDriverNamed) {
  StartNode("workstation-gpu-audio-usb.json");
  ASSERT_TRUE(MustBind(BindOptions()).ok());
  UnbindOptions options = RestoreOptions();
  options.return_to = {{"0000:01:00.0", "nvidia"}, {"0000:01:00.1", "snd_hda_intel"}, {"0000:01:00.2", ""},
                       {"0000:01:00.3", "nvidia-gpu"}};
  const BindReport report = MustUnbind(options);
  SCOPED_TRACE(FormatBindReport(report));
  EXPECT_TRUE(report.ok());
  ASSERT_EQ(report.devices.size(), 4u);
  for (const auto& [bdf, driver] : options.return_to) {
    EXPECT_EQ(Driver(bdf), driver) << bdf;
    EXPECT_EQ(Device(report, bdf).outcome, Outcome::kRestored) << bdf;
    EXPECT_EQ(Device(report, bdf).target_driver, driver) << bdf;
    EXPECT_EQ(Override(bdf), "(null)") << bdf << ": a later reprobe is the host's normal one";
  }
  EXPECT_THAT(LogAbout("0000:01:00.2"), Not(Contains(HasSubstr("probe 0000:01:00.2"))));
  // The override was the named driver while the function moved: nothing else could take it in between.
  EXPECT_THAT(LogAbout("0000:01:00.1"), Contains("override 0000:01:00.1 snd_hda_intel"));
  EXPECT_EQ(Driver("0000:00:01.0"), "pcieport");
}

// A function still on its recorded driver (its unbind never completed) gets only its override cleared.
TEST_F(BinderSimTest, ReturnToAFunctionAlreadyOnItsDriverClearsTheOverrideOnly) {
  StartNode("a10x2-nvidia.json");
  ASSERT_TRUE(sim_->Control("unbind-delay 0000:3b:00.0 -1").ok());
  BinderOptions bind = BindOptions();
  bind.targets = vfio_agent::binding::Targets::Devices({"0000:3b:00.0"});
  bind.write_timeout = absl::Seconds(1);  // hit for certain: the unbind blocks until released
  const BindReport stuck = MustBind(bind);
  ASSERT_EQ(Device(stuck, "0000:3b:00.0").outcome, Outcome::kBlocked);
  ASSERT_EQ(Override("0000:3b:00.0"), "vfio-pci");
  UnbindOptions options = RestoreOptions();
  options.return_to = {{"0000:3b:00.0", "nvidia"}};
  const BindReport report = MustUnbind(options);
  SCOPED_TRACE(FormatBindReport(report));
  EXPECT_EQ(Device(report, "0000:3b:00.0").outcome, Outcome::kRestored);
  EXPECT_EQ(Override("0000:3b:00.0"), "(null)");
  EXPECT_EQ(Driver("0000:3b:00.0"), "nvidia");
  EXPECT_THAT(LogAbout("0000:3b:00.0"), Not(Contains("bind 0000:3b:00.0 nvidia")));
  ASSERT_TRUE(sim_->Control("release 0000:3b:00.0").ok());
}

// The caller's deadline bounds the whole bind, however long each write may wait: the blocked unbind is abandoned
// when the deadline comes (the simulator holds it until released), not after write_timeout.
TEST_F(BinderSimTest, TheCallersDeadlineEndsABlockedWriteBeforeItsOwnTimeout) {
  StartNode("a10x2-nvidia.json");
  ASSERT_TRUE(sim_->Control("unbind-delay 0000:3b:00.0 -1").ok());
  BinderOptions options = BindOptions();  // writes may wait 20 s
  options.targets = vfio_agent::binding::Targets::Devices({"0000:3b:00.0"});
  const absl::Time start = absl::Now();
  options.deadline = start + absl::Seconds(2);
  const BindReport report = MustBind(options);
  const absl::Duration took = absl::Now() - start;
  SCOPED_TRACE(FormatBindReport(report));
  const DeviceResult& blocked = Device(report, "0000:3b:00.0");
  EXPECT_EQ(blocked.outcome, Outcome::kBlocked);
  EXPECT_EQ(blocked.failure, Failure::kWriteDeadline);
  EXPECT_GE(took, absl::Seconds(2));
  EXPECT_LT(took, kGenerous);
  // Past the deadline no write starts at all.
  const size_t log_size = sim_->Log().size();
  options.targets = vfio_agent::binding::Targets::Devices({"0000:86:00.0"});
  const BindReport late = MustBind(options);
  EXPECT_EQ(Device(late, "0000:86:00.0").outcome, Outcome::kBlocked);
  EXPECT_THAT(Device(late, "0000:86:00.0").reason, HasSubstr("deadline has passed"));
  EXPECT_EQ(sim_->Log().size(), log_size);
  ASSERT_TRUE(sim_->Control("release 0000:3b:00.0").ok());
}

TEST_F(BinderSimTest, UnbindOneDeviceOrOneGroup) {
  StartNode("a10-t4-mixed.json");  // all four on vfio-pci already
  UnbindOptions one = RestoreOptions();
  one.targets = vfio_agent::binding::Targets::Devices({"0000:af:00.0"});
  BindReport report = MustUnbind(one);
  ASSERT_EQ(report.devices.size(), 1u);
  EXPECT_EQ(report.devices[0].outcome, Outcome::kRestored);
  EXPECT_EQ(Driver("0000:af:00.0"), "nvidia");

  UnbindOptions group = RestoreOptions();
  group.targets = vfio_agent::binding::Targets::Devices({});  // the group alone
  group.groups = {47};
  report = MustUnbind(group);
  ASSERT_EQ(report.devices.size(), 1u);
  EXPECT_EQ(report.devices[0].bdf, "0000:5e:00.0");
  EXPECT_EQ(Driver("0000:5e:00.0"), "nvidia");
  EXPECT_EQ(Driver("0000:3b:00.0"), "vfio-pci");
  EXPECT_EQ(Driver("0000:d8:00.0"), "vfio-pci");

  group.groups = {999};
  EXPECT_FALSE(Unbind(group).ok());
}

TEST_F(BinderSimTest, JsonReportRoundTrips) {
  StartNode("gpu-foreign-nic.json");
  const BindReport report = MustBind(BindOptions());
  report::v1::BindReport parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(BindReportToJson(report), &parsed).ok());
  EXPECT_EQ(parsed.schema(), "vfio-gpu-agent.bind/v1");
  EXPECT_EQ(parsed.operation(), "bind");
  EXPECT_FALSE(parsed.ok());
  ASSERT_EQ(parsed.devices_size(), 2);
  EXPECT_EQ(parsed.devices(0).bdf(), "0000:3b:00.0");
  EXPECT_EQ(parsed.devices(0).outcome(), report::v1::OUTCOME_BLOCKED);
  EXPECT_EQ(parsed.devices(0).iommu_group(), 30);
  EXPECT_EQ(parsed.devices(1).outcome(), report::v1::OUTCOME_BOUND);
  EXPECT_EQ(parsed.devices(1).driver_after(), "vfio-pci");
  EXPECT_EQ(parsed.devices(1).role(), report::v1::GPU);
  EXPECT_GE(parsed.devices(1).steps_size(), 3);
  EXPECT_THAT(parsed.summary(), HasSubstr("1 bound"));
}

}  // namespace
}  // namespace vfio_agent::binding
