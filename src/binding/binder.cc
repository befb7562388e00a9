#include "vfio_gpu_agent/binding/binder.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "concurrency.h"
#include "device_steps.h"
#include "driver_loader.h"
#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/binding/plan.h"
#include "vfio_gpu_agent/common/fs.h"
#include "vfio_gpu_agent/pci/inventory.h"

namespace vfio_agent::binding {
namespace {

constexpr absl::Duration kDevnodePoll = absl::Milliseconds(10);

DeviceResult ResultFor(const PlannedFunction& fn, std::optional<int> group) {
  DeviceResult result;
  result.bdf = fn.bdf;
  result.vendor_device = fn.vendor_device;
  result.role = fn.role;
  result.iommu_group = group;
  result.driver_before = fn.current_driver;
  result.driver_after = fn.current_driver;
  result.target_driver = fn.target_driver;
  result.reason = fn.reason;
  return result;
}

bool IsNvidiaDriver(const std::string& driver) { return driver.rfind("nvidia", 0) == 0; }

// The node a VM opens: /dev/vfio/<group>, or on a host with iommufd and no legacy group nodes every cdev of
// the function under /dev/vfio/devices (the rule the plugin's health applies, so the two agree).
bool DevnodePresent(const HostPaths& paths, const std::string& bdf, int group) {
  if (fs::Exists(paths.VfioDir() / std::to_string(group))) return true;
  if (!fs::Exists(paths.dev_root / "iommu")) return false;
  absl::StatusOr<pci::Function> fn = pci::ReadFunction(paths.sysfs_root, bdf);
  if (!fn.ok() || fn->vfio_cdevs.empty()) return false;
  return std::all_of(fn->vfio_cdevs.begin(), fn->vfio_cdevs.end(),
                     [&](const std::string& cdev) { return fs::Exists(paths.VfioDir() / "devices" / cdev); });
}

bool WaitForDevnode(const HostPaths& paths, const std::string& bdf, int group, absl::Duration wait) {
  const absl::Time deadline = absl::Now() + wait;
  while (!DevnodePresent(paths, bdf, group)) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(kDevnodePoll);
  }
  return true;
}

class DeviceBinder {
 public:
  DeviceBinder(const BinderOptions& options, const PlannedFunction& planned, int group)
      : options_(options), paths_(options.paths), group_(group), result_(ResultFor(planned, group)),
        writer_(paths_, options.write_timeout, &result_, options.deadline) {}

  DeviceResult Run() && {
    const absl::Time start = absl::Now();
    Bind();
    result_.elapsed = absl::Now() - start;
    spdlog::info("bind {}: {} ({} -> {}){}{}", result_.bdf, OutcomeName(result_.outcome),
                 result_.driver_before.empty() ? "no driver" : result_.driver_before,
                 result_.driver_after.empty() ? "no driver" : result_.driver_after,
                 result_.reason.empty() ? "" : ": ", result_.reason);
    return std::move(result_);
  }

 private:
  void Bind() {
    // The plan is a snapshot; act on the device as it is now.
    absl::StatusOr<pci::Function> now = pci::ReadFunction(paths_.sysfs_root, result_.bdf);
    if (!now.ok()) return Finish(Outcome::kFailed, Failure::kUnreadable, absl::StrCat("cannot read the device: ", now.status().message()));
    result_.driver_before = now->driver;
    result_.driver_after = now->driver;
    if (pci::IsVfioDriver(now->driver)) return Finish(Outcome::kAlreadyBound, Failure::kNone, "");
    if (!now->iommu_group) {
      return Finish(Outcome::kBlocked, Failure::kNoIommuGroup,
                    "no IOMMU group: vfio cannot take it and unbinding would leave it driverless");
    }
    const std::string& target = result_.target_driver;
    const std::string previous_override = now->driver_override;

    if (absl::Status s = writer_.SetOverride(target); !s.ok()) return Abort(s, "setting driver_override");
    if (!now->driver.empty()) {
      if (absl::Status s = writer_.Unbind(now->driver); !s.ok()) {
        if (IsNvidiaDriver(now->driver)) result_.holders = NvidiaHolders(paths_);
        if (absl::IsDeadlineExceeded(s)) return Abort(s, absl::StrCat("unbind from ", now->driver));
        writer_.SetOverride(previous_override).IgnoreError();  // best effort; the result is in steps
        return Finish(Outcome::kFailed, Failure::kUnbindFailed,
                      absl::StrCat("unbind from ", now->driver, " failed: ", s.message()));
      }
    }
    // drivers/<target>/bind reports vfio's probe error; drivers_probe is tried once more when it fails
    // (listed in steps) and then only the driver link decides, since drivers_probe succeeds regardless.
    absl::Status bind = writer_.BindTo(target);
    if (absl::IsDeadlineExceeded(bind)) return Abort(bind, absl::StrCat("bind to ", target));
    if (!bind.ok()) {
      if (absl::Status probe = writer_.Probe(); absl::IsDeadlineExceeded(probe)) return Abort(probe, "drivers_probe");
    }
    Verify(bind, previous_override);
  }

  void Verify(const absl::Status& bind, const std::string& previous_override) {
    const std::filesystem::path device = paths_.PciDevice(result_.bdf);
    result_.driver_after = CurrentDriver(paths_, result_.bdf);
    if (!fs::Exists(device)) return Finish(Outcome::kFailed, Failure::kDeviceRemoved, "device removed during bind");
    const std::string bind_note = bind.ok() ? "" : absl::StrCat(" (bind: ", bind.message(), ")");
    if (result_.driver_after != result_.target_driver) {
      std::string reason = absl::StrCat("driver after bind is ", DriverText(result_.driver_after), bind_note);
      // Give the device back to its host driver rather than leave it parked without one.
      writer_.SetOverride(previous_override).IgnoreError();  // results of both are in steps
      writer_.Probe().IgnoreError();
      result_.driver_after = CurrentDriver(paths_, result_.bdf);
      absl::StrAppend(&reason, "; reprobed, now ", DriverText(result_.driver_after));
      return Finish(Outcome::kFailed, Failure::kBindFailed, reason);
    }
    const std::filesystem::path node = paths_.VfioDir() / std::to_string(group_);
    const absl::Duration wait = std::min(options_.devnode_wait, options_.deadline - absl::Now());
    if (!WaitForDevnode(paths_, result_.bdf, group_, wait)) {
      return Finish(Outcome::kFailed, Failure::kDevnodeMissing, absl::StrCat("on ", result_.target_driver, " but neither ", node.string(),
                                                   " nor (with ", (paths_.dev_root / "iommu").string(),
                                                   ") its cdevs under ", (paths_.VfioDir() / "devices").string(),
                                                   " appeared within ", absl::FormatDuration(wait)));
    }
    Finish(Outcome::kBound, Failure::kNone, bind.ok() ? "" : absl::StrCat("bound via drivers_probe", bind_note));
  }

  // A failed or abandoned write: a write still blocked in the kernel means the device's state is unknown,
  // so nothing more is written to it.
  void Abort(const absl::Status& status, const std::string& what) {
    result_.driver_after = CurrentDriver(paths_, result_.bdf);
    if (absl::IsDeadlineExceeded(status)) {
      // The write's own text: it says how long it waited, or that the caller's deadline came first.
      return Finish(Outcome::kBlocked, Failure::kWriteDeadline,
                    absl::StrCat(what, ": ", status.message(),
                                 status.message() == kNotStarted ? "" : ", the kernel may still complete it"));
    }
    if (!fs::Exists(paths_.PciDevice(result_.bdf))) {
      return Finish(Outcome::kFailed, Failure::kDeviceRemoved, "device removed during bind");
    }
    Finish(Outcome::kFailed, Failure::kBindFailed, absl::StrCat(what, " failed: ", status.message()));
  }

  void Finish(Outcome outcome, Failure failure, std::string reason) {
    result_.outcome = outcome;
    result_.failure = failure;
    result_.reason = std::move(reason);
    if (!result_.holders.empty()) {
      std::vector<std::string> held;
      for (const Holder& holder : result_.holders) held.push_back(holder.ToString());
      absl::StrAppend(&result_.reason, "; held by ", absl::StrJoin(held, ", "));
    }
  }

  static std::string DriverText(const std::string& driver) { return driver.empty() ? "none" : driver; }

  const BinderOptions& options_;
  const HostPaths& paths_;
  int group_;
  DeviceResult result_;
  DeviceWriter writer_;
};

// Members in order; after a member fails, the rest of its group is not attempted (a half-moved group is
// reported, not made worse).
std::vector<DeviceResult> BindGroup(const BinderOptions& options, const PlannedGroup& group) {
  std::vector<DeviceResult> results;
  std::string stopped_by;
  for (const PlannedFunction& fn : group.functions) {
    if (!IsManagedRole(fn.role)) continue;
    DeviceResult result = ResultFor(fn, group.id);
    if (fn.action == Action::kAlreadyBound) {
      result.outcome = Outcome::kAlreadyBound;
    } else if (fn.action != Action::kBind) {
      result.outcome = Outcome::kBlocked;
      result.failure = fn.blocked_by != Failure::kNone ? fn.blocked_by : Failure::kIommuGroup;
      if (result.reason.empty()) result.reason = group.reason;
    } else if (!stopped_by.empty()) {
      result.outcome = Outcome::kBlocked;
      result.failure = Failure::kIommuGroup;
      result.reason = absl::StrCat("not attempted: ", stopped_by);
    } else if (options.dry_run) {
      result.outcome = Outcome::kWouldBind;
    } else {
      result = DeviceBinder(options, fn, *group.id).Run();
      if (result.outcome == Outcome::kFailed || result.outcome == Outcome::kBlocked) {
        stopped_by = absl::StrCat(fn.bdf, " in the same group was ", OutcomeName(result.outcome));
      }
    }
    results.push_back(std::move(result));
  }
  return results;
}

// Makes each target driver of the plan available (loading modules when needed) and rewrites the plan's
// target names to the registered directory names. A driver that cannot be made available blocks its
// functions with the reason.
void PrepareDrivers(const BinderOptions& options, Plan* plan, std::vector<std::string>* notes) {
  std::map<std::string, absl::StatusOr<std::string>> by_module;
  for (PlannedGroup& group : plan->groups) {
    for (PlannedFunction& fn : group.functions) {
      if (fn.action != Action::kBind) continue;
      auto [it, inserted] = by_module.try_emplace(fn.target_module, absl::UnknownError(""));
      if (inserted) {
        it->second = EnsureDriverRegistered(options.paths, options.kernel_release, fn.target_module);
        if (it->second.ok() && !fn.target_registered) {
          notes->push_back(absl::StrCat("loaded module ", fn.target_module, " (driver ", *it->second, ")"));
        }
      }
      if (it->second.ok()) {
        fn.target_driver = *it->second;
        fn.target_registered = true;
      } else {
        fn.action = Action::kBlocked;
        fn.blocked_by = Failure::kDriver;
        fn.reason = std::string(it->second.status().message());
      }
    }
  }
}

}  // namespace

const char* FailureName(Failure failure) {
  switch (failure) {
    case Failure::kNone: return "";
    case Failure::kWriteDeadline: return "write_deadline";
    case Failure::kNoIommuGroup: return "no_iommu_group";
    case Failure::kIommuGroup: return "iommu_group";
    case Failure::kDevnodeMissing: return "devnode_missing";
    case Failure::kDeviceRemoved: return "device_removed";
    case Failure::kUnbindFailed: return "unbind_failed";
    case Failure::kDriver: return "driver";
    case Failure::kUnreadable: return "unreadable";
    case Failure::kBindFailed: return "bind_failed";
  }
  return "bind_failed";
}

const char* OutcomeName(Outcome outcome) {
  switch (outcome) {
    case Outcome::kBound:
      return "bound";
    case Outcome::kAlreadyBound:
      return "already bound";
    case Outcome::kWouldBind:
      return "would bind";
    case Outcome::kBlocked:
      return "blocked";
    case Outcome::kFailed:
      return "failed";
    case Outcome::kRestored:
      return "restored";
    case Outcome::kNotBound:
      return "not bound";
    case Outcome::kRefused:
      return "refused";
  }
  return "failed";
}

bool BindReport::ok() const {
  for (const DeviceResult& device : devices) {
    switch (device.outcome) {
      case Outcome::kBound:
      case Outcome::kAlreadyBound:
      case Outcome::kWouldBind:
      case Outcome::kRestored:
      case Outcome::kNotBound:
        continue;
      case Outcome::kBlocked:
      case Outcome::kFailed:
      case Outcome::kRefused:
        return false;
    }
  }
  return true;
}

absl::StatusOr<BindReport> Bind(const BinderOptions& options) {
  if (options.targets.none()) return absl::InvalidArgumentError("bind: no device named");
  // The plan never looks at driver_override, and its read waits out a write still blocked on that device.
  absl::StatusOr<pci::Inventory> inventory =
      pci::Scan(options.paths.sysfs_root, {.detail_vendor = options.policy.vendor_id, .driver_override = false});
  if (!inventory.ok()) return inventory.status();
  const pci::Selection selection = pci::Select(*inventory, options.policy);
  absl::StatusOr<TargetDriverChooser> chooser = TargetDriverChooser::FromHost(options.paths, options.kernel_release);
  if (!chooser.ok()) return chooser.status();
  Plan full = MakePlan(*inventory, selection, *chooser);
  absl::StatusOr<Plan> plan =
      options.targets.every_selected() ? std::move(full) : RestrictPlan(full, options.targets.bdfs());
  if (!plan.ok()) return plan.status();

  BindReport report;
  report.operation = "bind";
  report.dry_run = options.dry_run;
  report.notes = chooser->notes();
  if (!inventory->iommu_enabled()) {
    report.notes.push_back("no IOMMU groups under " + options.paths.IommuGroups().string() +
                           ": the IOMMU is off (enable intel_iommu=on / amd_iommu=on); nothing can be bound");
  }
  if (!options.dry_run) PrepareDrivers(options, &*plan, &report.notes);

  std::vector<std::vector<DeviceResult>> per_group(plan->groups.size());
  std::vector<size_t> active;  // groups that need writes go to workers; the rest are answered here
  for (size_t i = 0; i < plan->groups.size(); ++i) {
    const PlannedGroup& group = plan->groups[i];
    if (!options.dry_run && !group.blocked && group.NeedsWrites()) {
      active.push_back(i);
    } else {
      per_group[i] = BindGroup(options, group);
    }
  }
  RunParallel(active.size(), options.parallelism,
              [&](size_t k) { per_group[active[k]] = BindGroup(options, plan->groups[active[k]]); });
  for (std::vector<DeviceResult>& group : per_group) {
    for (DeviceResult& device : group) report.devices.push_back(std::move(device));
  }
  return report;
}

}  // namespace vfio_agent::binding
