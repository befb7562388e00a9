#include "vfio_gpu_agent/pci/selection.h"

#include <algorithm>
#include <charconv>
#include <set>

#include "absl/strings/str_cat.h"
#include "device_reader.h"

namespace vfio_agent::pci {
namespace {

constexpr uint32_t kNvSwitchClassBase = kClassBridgeOther >> 8;

bool IsSelectedKind(const Function& fn, const SelectionPolicy& policy, Role* role) {
  if (fn.vendor_id != policy.vendor_id || fn.IsVirtualFunction()) return false;
  if (std::any_of(policy.classes.begin(), policy.classes.end(),
                  [&](const ClassPrefix& prefix) { return prefix.Matches(fn.class_code); })) {
    *role = Role::kGpu;
    return true;
  }
  if (policy.include_nvswitches && (fn.class_code >> 8) == kNvSwitchClassBase) {
    *role = Role::kNvSwitch;
    return true;
  }
  return false;
}

GroupAssessment Assess(const Inventory& inventory, const IommuGroup& group, const SelectionPolicy& policy,
                       const std::map<std::string, Role, std::less<>>& selected) {
  GroupAssessment out;
  out.id = group.id;
  out.viable = true;
  out.usable = true;
  for (const std::string& bdf : group.members) {
    const Function* fn = inventory.Find(bdf);
    if (fn == nullptr) {
      // The kernel lists it but its attributes could not be read: nothing proves it is safe to share.
      out.members.push_back({bdf, Role::kForeign});
      out.viable = false;
      out.usable = false;
      out.blockers.push_back(absl::StrCat(bdf, " unreadable (see scan errors)"));
      continue;
    }
    Role role = Role::kForeign;
    if (auto it = selected.find(bdf); it != selected.end()) {
      role = it->second;
    } else if (fn->IsBridge()) {
      role = Role::kBridge;
    } else if (fn->vendor_id == policy.vendor_id) {
      role = Role::kCompanion;
    }
    out.members.push_back({bdf, role});
    if (role == Role::kBridge || IsViableDriver(fn->driver)) continue;
    out.viable = false;
    if (role == Role::kForeign) {
      out.usable = false;
      out.blockers.push_back(absl::StrCat(bdf, " ", fn->VendorDevice(), " bound to ", fn->driver));
    }
  }
  return out;
}

}  // namespace

bool ClassPrefix::Matches(uint32_t class_code) const {
  if (bits <= 0) return true;
  const int shift = 24 - std::min(bits, 24);
  return (class_code >> shift) == (value >> shift);
}

absl::StatusOr<std::vector<ClassPrefix>> ParseClassPrefixes(std::string_view text) {
  std::vector<ClassPrefix> prefixes;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = std::min(text.find(',', start), text.size());
    std::string_view item = internal::TrimWhitespace(text.substr(start, comma - start));
    start = comma + 1;
    if (item.starts_with("0x") || item.starts_with("0X")) item.remove_prefix(2);
    uint32_t value = 0;
    auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), value, 16);
    const bool even_width = item.size() == 2 || item.size() == 4 || item.size() == 6;
    if (!even_width || ec != std::errc() || ptr != item.data() + item.size()) {
      return absl::InvalidArgumentError(absl::StrCat("invalid class prefix \"", std::string(item), "\" in \"",
                                                     std::string(text), "\" (want 2, 4 or 6 hex digits)"));
    }
    const int bits = static_cast<int>(item.size()) * 4;
    prefixes.push_back({value << (24 - bits), bits});
  }
  return prefixes;
}

const char* RoleName(Role role) {
  switch (role) {
    case Role::kGpu:
      return "gpu";
    case Role::kCompanion:
      return "companion";
    case Role::kNvSwitch:
      return "nvswitch";
    case Role::kBridge:
      return "bridge";
    case Role::kForeign:
      return "foreign";
  }
  return "foreign";
}

bool IsVfioDriver(std::string_view driver) {
  return driver == "vfio-pci" || driver.ends_with("vfio_pci") || driver.ends_with("vfio-pci");
}

bool IsViableDriver(std::string_view driver) { return driver.empty() || driver == "pci-stub" || IsVfioDriver(driver); }

const GroupAssessment* Selection::GroupOf(const Function& fn) const {
  if (!fn.iommu_group) return nullptr;
  auto it = std::lower_bound(groups.begin(), groups.end(), *fn.iommu_group,
                             [](const GroupAssessment& g, int id) { return g.id < id; });
  return it != groups.end() && it->id == *fn.iommu_group ? &*it : nullptr;
}

Role Selection::RoleOf(std::string_view bdf) const {
  auto it = roles.find(bdf);
  return it == roles.end() ? Role::kForeign : it->second;
}

Selection Select(const Inventory& inventory, const SelectionPolicy& policy) {
  Selection selection;
  std::map<std::string, Role, std::less<>> selected;
  std::set<int> group_ids;
  for (const Function& fn : inventory.functions()) {
    Role role = Role::kGpu;
    if (!IsSelectedKind(fn, policy, &role)) continue;
    selected.emplace(fn.bdf, role);
    selection.gpus.push_back(fn.bdf);
    if (fn.iommu_group && inventory.Group(*fn.iommu_group) != nullptr) {
      group_ids.insert(*fn.iommu_group);
    } else {
      selection.unisolated.push_back(fn.bdf);
    }
  }
  selection.roles = selected;
  for (int id : group_ids) {
    GroupAssessment assessment = Assess(inventory, *inventory.Group(id), policy, selected);
    for (const Member& member : assessment.members) {
      if (member.role == Role::kCompanion) selection.companions.push_back(member.bdf);
      selection.roles.emplace(member.bdf, member.role);
    }
    selection.groups.push_back(std::move(assessment));
  }
  std::sort(selection.companions.begin(), selection.companions.end());
  return selection;
}

}  // namespace vfio_agent::pci
