#include "vfio_gpu_agent/binding/plan.h"

#include <fnmatch.h>
#include <sys/utsname.h>

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "vfio_gpu_agent/common/fs.h"

namespace vfio_agent::binding {
namespace {

constexpr absl::string_view kAliasPrefix = "alias vfio_pci:";

std::string NormalizedDriver(std::string_view name) {
  std::string out(name);
  std::replace(out.begin(), out.end(), '-', '_');
  return out;
}

std::string GroupLabel(const PlannedGroup& group) {
  return group.id ? absl::StrCat("group ", *group.id) : std::string("no IOMMU group");
}

PlannedFunction PlanMember(const pci::Function& fn, pci::Role role, const TargetDriverChooser& chooser) {
  PlannedFunction out;
  out.bdf = fn.bdf;
  out.vendor_device = fn.VendorDevice();
  out.role = role;
  out.current_driver = fn.driver;
  const std::string current = fn.driver.empty() ? "unbound" : fn.driver;
  if (role == pci::Role::kBridge) {
    out.action = Action::kStays;
    out.reason = absl::StrCat("bridge on ", current, "; does not affect viability");
    return out;
  }
  if (role == pci::Role::kForeign) {
    // Only reached for foreign endpoints that do not block the group (unbound, pci-stub, vfio).
    out.action = Action::kStays;
    out.reason = absl::StrCat("foreign endpoint ", current, "; left as is");
    return out;
  }
  const TargetDriverChooser::Choice choice = chooser.Choose(fn);
  out.target_module = choice.module;
  if (pci::IsVfioDriver(fn.driver)) {
    // Never move a device between vfio drivers on our own: a VM may hold it.
    out.action = Action::kAlreadyBound;
    out.target_driver = fn.driver;
    out.target_registered = true;
    if (!SameDriver(fn.driver, choice.driver)) {
      out.reason = absl::StrCat("on ", fn.driver, "; best vfio driver is ", choice.driver,
                                " (unbind and bind again to switch)");
    }
    return out;
  }
  out.target_driver = choice.driver;
  out.target_registered = choice.registered;
  out.action = Action::kBind;
  if (!choice.registered) {
    out.reason = absl::StrCat("driver ", choice.driver, " not registered; module ", choice.module,
                              " will be loaded");
  }
  return out;
}

}  // namespace

std::string Modalias(const pci::Function& fn) {
  return absl::StrFormat("pci:v%08Xd%08Xsv%08Xsd%08Xbc%02Xsc%02Xi%02X", fn.vendor_id, fn.device_id,
                         fn.subsystem_vendor_id, fn.subsystem_device_id, (fn.class_code >> 16) & 0xff,
                         (fn.class_code >> 8) & 0xff, fn.class_code & 0xff);
}

bool SameDriver(std::string_view a, std::string_view b) { return NormalizedDriver(a) == NormalizedDriver(b); }

VariantTable VariantTable::Parse(std::string_view modules_alias) {
  VariantTable table;
  // Debian's abseil has its own string_view type; convert at the boundary.
  const absl::string_view text(modules_alias.data(), modules_alias.size());
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (!absl::StartsWith(line, kAliasPrefix)) continue;
    std::vector<absl::string_view> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (words.size() != 3) continue;
    Entry entry;
    entry.pattern = std::string(words[1].substr(absl::string_view("vfio_").size()));
    entry.module = std::string(words[2]);
    entry.wildcards = static_cast<int>(std::count(entry.pattern.begin(), entry.pattern.end(), '*'));
    table.entries_.push_back(std::move(entry));
  }
  return table;
}

absl::StatusOr<VariantTable> VariantTable::Load(const std::filesystem::path& modules_root,
                                                std::string_view kernel_release) {
  absl::StatusOr<std::string> content =
      fs::ReadTrimmed(modules_root / std::string(kernel_release) / "modules.alias");
  if (!content.ok()) return content.status();
  return Parse(*content);
}

std::optional<std::string> VariantTable::BestVariant(std::string_view modalias) const {
  const std::string subject(modalias);
  const Entry* best = nullptr;
  for (const Entry& entry : entries_) {
    if (fnmatch(entry.pattern.c_str(), subject.c_str(), 0) != 0) continue;
    if (best == nullptr || entry.wildcards < best->wildcards) best = &entry;
  }
  if (best == nullptr) return std::nullopt;
  return best->module;
}

TargetDriverChooser::TargetDriverChooser(VariantTable variants, std::vector<std::string> registered_drivers)
    : variants_(std::move(variants)), registered_(std::move(registered_drivers)) {}

absl::StatusOr<TargetDriverChooser> TargetDriverChooser::FromHost(const HostPaths& paths,
                                                                  std::string kernel_release) {
  if (kernel_release.empty()) kernel_release = RunningKernelRelease();
  std::vector<std::string> notes;
  VariantTable variants;
  absl::StatusOr<VariantTable> loaded = VariantTable::Load(paths.modules_root, kernel_release);
  if (loaded.ok()) {
    variants = *std::move(loaded);
  } else if (absl::IsNotFound(loaded.status())) {
    notes.push_back(absl::StrCat("no modules.alias under ", (paths.modules_root / kernel_release).string(),
                                 ": vfio variant drivers not considered, using vfio-pci"));
  } else {
    return loaded.status();
  }
  absl::StatusOr<std::vector<std::string>> drivers = fs::ListDir(paths.PciDrivers());
  if (!drivers.ok() && !absl::IsNotFound(drivers.status())) return drivers.status();
  TargetDriverChooser chooser(std::move(variants), drivers.ok() ? *std::move(drivers) : std::vector<std::string>{});
  chooser.notes_ = std::move(notes);
  return chooser;
}

TargetDriverChooser::Choice TargetDriverChooser::Choose(const pci::Function& fn) const {
  Choice choice;
  choice.module = variants_.BestVariant(Modalias(fn)).value_or("vfio_pci");
  choice.driver = choice.module == "vfio_pci" ? std::string(kVfioPci) : choice.module;
  for (const std::string& dir : registered_) {
    if (SameDriver(dir, choice.module)) {
      choice.driver = dir;
      choice.registered = true;
      break;
    }
  }
  return choice;
}

std::string RunningKernelRelease() {
  struct utsname name {};
  if (uname(&name) != 0) return "";
  return name.release;
}

const char* ActionName(Action action) {
  switch (action) {
    case Action::kAlreadyBound:
      return "already-bound";
    case Action::kBind:
      return "bind";
    case Action::kBlocked:
      return "blocked";
    case Action::kStays:
      return "stays";
  }
  return "blocked";
}

bool PlannedGroup::NeedsWrites() const {
  return std::any_of(functions.begin(), functions.end(),
                     [](const PlannedFunction& fn) { return fn.action == Action::kBind; });
}

const PlannedFunction* Plan::Find(std::string_view bdf) const {
  for (const PlannedGroup& group : groups) {
    for (const PlannedFunction& fn : group.functions) {
      if (fn.bdf == bdf) return &fn;
    }
  }
  return nullptr;
}

Plan MakePlan(const pci::Inventory& inventory, const pci::Selection& selection, const TargetDriverChooser& chooser) {
  Plan plan;
  for (const pci::GroupAssessment& assessment : selection.groups) {
    PlannedGroup group;
    group.id = assessment.id;
    if (!assessment.usable) {
      group.blocked = true;
      group.reason = absl::StrCat("group shares its IOMMU group with ", absl::StrJoin(assessment.blockers, ", "),
                                  "; not touched");
    }
    for (const pci::Member& member : assessment.members) {
      const pci::Function* fn = inventory.Find(member.bdf);
      if (fn == nullptr) {
        PlannedFunction unreadable;
        unreadable.bdf = member.bdf;
        unreadable.role = member.role;
        unreadable.reason = "unreadable (see scan errors)";
        unreadable.blocked_by = Failure::kUnreadable;
        group.functions.push_back(std::move(unreadable));
        continue;
      }
      PlannedFunction planned = PlanMember(*fn, member.role, chooser);
      if (group.blocked && planned.action == Action::kBind) {
        planned.action = Action::kBlocked;
        planned.reason = group.reason;
        planned.blocked_by = Failure::kIommuGroup;
      } else if (member.role == pci::Role::kForeign && !pci::IsViableDriver(fn->driver)) {
        planned.action = Action::kBlocked;
        planned.reason = absl::StrCat("foreign endpoint bound to ", fn->driver, "; blocks the group");
        planned.blocked_by = Failure::kIommuGroup;
      }
      group.functions.push_back(std::move(planned));
    }
    plan.groups.push_back(std::move(group));
  }
  for (const std::string& bdf : selection.unisolated) {
    const pci::Function* fn = inventory.Find(bdf);
    if (fn == nullptr) continue;
    PlannedGroup group;
    group.blocked = true;
    group.reason =
        "no IOMMU group (IOMMU off, or the device is not isolated): vfio-pci cannot take it and unbinding "
        "would leave it without a driver";
    PlannedFunction planned = PlanMember(*fn, selection.RoleOf(bdf), chooser);
    planned.action = Action::kBlocked;
    planned.reason = group.reason;
    planned.blocked_by = Failure::kNoIommuGroup;
    group.functions.push_back(std::move(planned));
    plan.groups.push_back(std::move(group));
  }
  return plan;
}

absl::StatusOr<Plan> RestrictPlan(const Plan& plan, const std::vector<std::string>& bdfs) {
  std::set<std::string> wanted;
  for (const std::string& text : bdfs) {
    absl::StatusOr<std::string> bdf = pci::CanonicalBdf(text);
    if (!bdf.ok()) return bdf.status();
    if (plan.Find(*bdf) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("device ", *bdf, " is not selected (not a GPU of the selected vendor/classes, nor in "
                       "the IOMMU group of one)"));
    }
    wanted.insert(*bdf);
  }
  Plan out;
  for (const PlannedGroup& group : plan.groups) {
    if (std::any_of(group.functions.begin(), group.functions.end(),
                    [&](const PlannedFunction& fn) { return wanted.count(fn.bdf) > 0; })) {
      out.groups.push_back(group);
    }
  }
  return out;
}

std::string FormatPlan(const Plan& plan) {
  std::string out;
  for (const PlannedGroup& group : plan.groups) {
    absl::StrAppend(&out, GroupLabel(group), group.blocked ? ": BLOCKED: " + group.reason : "", "\n");
    for (const PlannedFunction& fn : group.functions) {
      absl::StrAppend(&out, "  ", fn.bdf, " ", fn.vendor_device, " ", pci::RoleName(fn.role), " ",
                      fn.current_driver.empty() ? "(no driver)" : fn.current_driver);
      switch (fn.action) {
        case Action::kBind:
          absl::StrAppend(&out, " -> ", fn.target_driver);
          break;
        case Action::kAlreadyBound:
          absl::StrAppend(&out, " already bound");
          break;
        case Action::kBlocked:
          absl::StrAppend(&out, " blocked");
          break;
        case Action::kStays:
          absl::StrAppend(&out, " stays");
          break;
      }
      if (!fn.reason.empty() && !(group.blocked && fn.reason == group.reason)) {
        absl::StrAppend(&out, " (", fn.reason, ")");
      }
      absl::StrAppend(&out, "\n");
    }
  }
  if (plan.groups.empty()) absl::StrAppend(&out, "no device selected\n");
  return out;
}

}  // namespace vfio_agent::binding
