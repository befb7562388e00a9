// `unbind`: give devices back to their host driver. Only ever run on an explicit request; a group that a
// process (a VM) has open is refused unless forced.
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "concurrency.h"
#include "device_steps.h"
#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/binding/binder.h"
#include "vfio_gpu_agent/binding/plan.h"
#include "vfio_gpu_agent/pci/inventory.h"

namespace vfio_agent::binding {
namespace {

struct Target {
  const pci::Function* fn;
  pci::Role role;
};

// Devices to restore, grouped by IOMMU group (-1: no group) so each group is checked for openers once.
absl::StatusOr<std::map<int, std::vector<Target>>> ChooseTargets(const UnbindOptions& options,
                                                                 const pci::Inventory& inventory,
                                                                 const pci::Selection& selection) {
  std::map<int, std::vector<Target>> targets;
  auto add = [&](const pci::Function& fn) {
    targets[fn.iommu_group.value_or(-1)].push_back({&fn, selection.RoleOf(fn.bdf)});
  };
  for (const std::string& text : options.targets.bdfs()) {
    absl::StatusOr<std::string> bdf = pci::CanonicalBdf(text);
    if (!bdf.ok()) return bdf.status();
    const pci::Function* fn = inventory.Find(*bdf);
    if (fn == nullptr) return absl::NotFoundError(absl::StrCat("device ", *bdf, " not found under ", options.paths.PciDevices().string()));
    add(*fn);
  }
  for (int id : options.groups) {
    const pci::IommuGroup* group = inventory.Group(id);
    if (group == nullptr) return absl::NotFoundError(absl::StrCat("IOMMU group ", id, " not found"));
    for (const std::string& bdf : group->members) {
      const pci::Function* fn = inventory.Find(bdf);
      if (fn != nullptr && !fn->IsBridge()) add(*fn);
    }
  }
  for (const auto& [bdf, driver] : options.return_to) {
    const pci::Function* fn = inventory.Find(bdf);
    if (fn == nullptr) return absl::NotFoundError(absl::StrCat("device ", bdf, " not found under ", options.paths.PciDevices().string()));
    add(*fn);
  }
  if (options.targets.every_selected()) {
    for (const auto& [bdf, role] : selection.roles) {
      const pci::Function* fn = inventory.Find(bdf);
      if (fn != nullptr && IsManagedRole(role)) add(*fn);
    }
  }
  for (auto& [group, list] : targets) {
    std::sort(list.begin(), list.end(), [](const Target& a, const Target& b) { return a.fn->bdf < b.fn->bdf; });
    list.erase(std::unique(list.begin(), list.end(), [](const Target& a, const Target& b) { return a.fn == b.fn; }),
               list.end());
  }
  return targets;
}

DeviceResult ResultFor(const Target& target) {
  DeviceResult result;
  result.bdf = target.fn->bdf;
  result.vendor_device = target.fn->VendorDevice();
  result.role = target.role;
  result.iommu_group = target.fn->iommu_group;
  result.driver_before = target.fn->driver;
  result.driver_after = target.fn->driver;
  return result;
}

bool OnVfio(const pci::Function& fn) {
  return pci::IsVfioDriver(fn.driver) || pci::IsVfioDriver(fn.driver_override);
}

void Restore(const UnbindOptions& options, const pci::Function& fn, DeviceResult* result) {
  DeviceWriter writer(options.paths, options.write_timeout, result, options.deadline);
  auto fail = [&](Outcome outcome, std::string reason) {
    result->outcome = outcome;
    result->reason = std::move(reason);
    result->driver_after = CurrentDriver(options.paths, fn.bdf);
  };
  // Clearing the override first makes the reprobe pick the host driver, not vfio again.
  if (absl::Status s = writer.SetOverride(""); !s.ok()) return fail(absl::IsDeadlineExceeded(s) ? Outcome::kBlocked : Outcome::kFailed, absl::StrCat("clearing driver_override: ", s.message()));
  if (pci::IsVfioDriver(fn.driver)) {
    if (absl::Status s = writer.Unbind(fn.driver); !s.ok()) {
      if (fn.iommu_group) result->holders = VfioGroupOpeners(options.paths, *fn.iommu_group);
      return fail(absl::IsDeadlineExceeded(s) ? Outcome::kBlocked : Outcome::kFailed,
                  absl::StrCat("unbind from ", fn.driver, ": ", s.message()));
    }
  }
  if (absl::Status s = writer.Probe(); absl::IsDeadlineExceeded(s)) {
    return fail(Outcome::kBlocked, absl::StrCat("drivers_probe: ", s.message()));
  }
  result->driver_after = CurrentDriver(options.paths, fn.bdf);
  if (pci::IsVfioDriver(result->driver_after)) {
    return fail(Outcome::kFailed, absl::StrCat("still on ", result->driver_after, " after unbind and reprobe"));
  }
  result->outcome = Outcome::kRestored;
  result->reason = result->driver_after.empty() ? "no host driver claimed it (is the host driver loaded?)"
                                                : absl::StrCat("now on ", result->driver_after);
}

// Back onto `target` ("" = no driver), as return_to describes.
void ReturnTo(const UnbindOptions& options, const pci::Function& fn, const std::string& target, DeviceResult* result) {
  DeviceWriter writer(options.paths, options.write_timeout, result, options.deadline);
  auto fail = [&](const absl::Status& s, const std::string& what) {
    result->outcome = absl::IsDeadlineExceeded(s) ? Outcome::kBlocked : Outcome::kFailed;
    result->reason = absl::StrCat(what, ": ", s.message());
    result->driver_after = CurrentDriver(options.paths, fn.bdf);
  };
  // Only the target may take it from here on, so no probe in between hands it to another driver.
  if (absl::Status s = writer.SetOverride(target); !s.ok()) return fail(s, "setting driver_override");
  if (!fn.driver.empty() && !SameDriver(fn.driver, target)) {
    if (absl::Status s = writer.Unbind(fn.driver); !s.ok()) {
      if (fn.iommu_group && pci::IsVfioDriver(fn.driver)) result->holders = VfioGroupOpeners(options.paths, *fn.iommu_group);
      return fail(s, absl::StrCat("unbind from ", fn.driver));
    }
  }
  if (!target.empty() && !SameDriver(CurrentDriver(options.paths, fn.bdf), target)) {
    // bind reports the driver's probe error; drivers_probe (the override names the target) is the fallback.
    if (absl::Status bind = writer.BindTo(target); !bind.ok()) {
      if (absl::IsDeadlineExceeded(bind)) return fail(bind, absl::StrCat("bind to ", target));
      if (absl::Status probe = writer.Probe(); absl::IsDeadlineExceeded(probe)) return fail(probe, "drivers_probe");
    }
  }
  // Cleared, so a later reprobe or rescan is the host's normal one again.
  if (absl::Status s = writer.SetOverride(""); !s.ok()) return fail(s, "clearing driver_override");
  result->driver_after = CurrentDriver(options.paths, fn.bdf);
  if (!SameDriver(result->driver_after, target)) {
    result->outcome = Outcome::kFailed;
    result->reason = absl::StrCat("on ", result->driver_after.empty() ? "no driver" : result->driver_after,
                                  " after returning it to ", target.empty() ? "no driver" : target);
    return;
  }
  result->outcome = Outcome::kRestored;
  result->reason = target.empty() ? "left without a driver" : absl::StrCat("returned to ", target);
}

std::vector<DeviceResult> UnbindGroup(const UnbindOptions& options, int group, const std::vector<Target>& targets) {
  std::vector<DeviceResult> results;
  std::vector<Holder> openers;
  const bool any_on_vfio =
      std::any_of(targets.begin(), targets.end(), [](const Target& t) { return OnVfio(*t.fn); });
  if (group >= 0 && any_on_vfio) openers = VfioGroupOpeners(options.paths, group);
  std::vector<std::string> opener_text;
  for (const Holder& holder : openers) opener_text.push_back(holder.ToString());
  for (const Target& target : targets) {
    DeviceResult result = ResultFor(target);
    const absl::Time start = absl::Now();
    auto return_to = options.return_to.find(target.fn->bdf);
    const bool named = return_to != options.return_to.end();
    if (named) result.target_driver = return_to->second;
    if (!named && !OnVfio(*target.fn)) {
      result.outcome = Outcome::kNotBound;
      result.reason = "not on a vfio driver; left as is";
    } else if (!openers.empty() && !options.force) {
      result.outcome = Outcome::kRefused;
      result.holders = openers;
      result.reason = absl::StrCat((options.paths.VfioDir() / std::to_string(group)).string(), " is open by ",
                                   absl::StrJoin(opener_text, ", "), " (a running VM?); --force to unbind anyway");
    } else {
      if (!openers.empty()) result.steps.push_back("forced although open by " + absl::StrJoin(opener_text, ", "));
      if (named) {
        ReturnTo(options, *target.fn, return_to->second, &result);
      } else {
        Restore(options, *target.fn, &result);
      }
    }
    result.elapsed = absl::Now() - start;
    spdlog::info("unbind {}: {}{}{}", result.bdf, OutcomeName(result.outcome), result.reason.empty() ? "" : ": ",
                 result.reason);
    results.push_back(std::move(result));
  }
  return results;
}

}  // namespace

absl::StatusOr<BindReport> Unbind(const UnbindOptions& options) {
  if (options.targets.none() && options.groups.empty() && options.return_to.empty()) {
    return absl::InvalidArgumentError("unbind: no device named");
  }
  absl::StatusOr<pci::Inventory> inventory =
      pci::Scan(options.paths.sysfs_root, {.driver_override = options.return_to.empty()});
  if (!inventory.ok()) return inventory.status();
  const pci::Selection selection = pci::Select(*inventory, options.policy);
  absl::StatusOr<std::map<int, std::vector<Target>>> targets = ChooseTargets(options, *inventory, selection);
  if (!targets.ok()) return targets.status();

  std::vector<std::pair<int, const std::vector<Target>*>> groups;
  for (const auto& [group, list] : *targets) groups.emplace_back(group, &list);
  std::vector<std::vector<DeviceResult>> per_group(groups.size());
  RunParallel(groups.size(), options.parallelism,
              [&](size_t i) { per_group[i] = UnbindGroup(options, groups[i].first, *groups[i].second); });

  BindReport report;
  report.operation = "unbind";
  for (std::vector<DeviceResult>& group : per_group) {
    for (DeviceResult& device : group) report.devices.push_back(std::move(device));
  }
  return report;
}

}  // namespace vfio_agent::binding
