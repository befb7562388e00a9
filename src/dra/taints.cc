#include "vfio_gpu_agent/dra/taints.h"

#include <algorithm>
#include <cctype>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "vfio_gpu_agent/common/fs.h"

namespace vfio_agent::dra {
namespace {

constexpr size_t kMaxLabelValue = 63;

// A label value (the API's rule for a taint's value): [A-Za-z0-9._-], alphanumeric at both ends, at most 63.
std::string LabelValue(std::string_view text) {
  std::string value;
  for (char c : text) {
    const bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
    value.push_back(ok ? c : '-');
    if (value.size() == kMaxLabelValue) break;
  }
  while (!value.empty() && !std::isalnum(static_cast<unsigned char>(value.back()))) value.pop_back();
  while (!value.empty() && !std::isalnum(static_cast<unsigned char>(value.front()))) value.erase(0, 1);
  return value;
}

kube::DeviceTaint Taint(std::string_view driver, std::string_view kind, std::string_view value,
                        std::string_view effect = "NoSchedule") {
  return {.key = Qualified(driver, kind), .value = LabelValue(value), .effect = std::string(effect)};
}

// "IOMMU group 12 not viable: ..." / "IOMMU group 12 cannot be bound to vfio-pci": the group's number.
std::string GroupOf(std::string_view reason) {
  std::string_view rest = reason.substr(std::string_view("IOMMU group ").size());
  return std::string(rest.substr(0, rest.find(' ')));
}

}  // namespace

kube::DeviceTaint FailureTaint(std::string_view driver, std::string_view reason, const TaintPolicy& policy) {
  const std::string_view gone_effect = policy.no_execute_when_gone ? "NoExecute" : "NoSchedule";
  if (reason == "gone from sysfs") return Taint(driver, kTaintGone, "sysfs", gone_effect);
  if (reason == "no driver") return Taint(driver, kTaintNotVfio, "none");
  if (reason.starts_with("driver ")) return Taint(driver, kTaintNotVfio, reason.substr(7));
  if (reason.starts_with("no ") && (reason.find("/vfio/") != std::string_view::npos)) {
    return Taint(driver, kTaintNotVfio, "no-node");
  }
  if (reason == "no IOMMU group") return Taint(driver, kTaintGroupNotViable, "none");
  if (reason.starts_with("IOMMU group ")) return Taint(driver, kTaintGroupNotViable, GroupOf(reason));
  if (reason.starts_with("config space reads 0xffff")) return Taint(driver, kTaintConfigSpace, "off-bus", gone_effect);
  if (reason.starts_with("config space unreadable")) return Taint(driver, kTaintConfigSpace, "unreadable");
  if (reason.starts_with("Fabric Manager at ")) return Taint(driver, kTaintFabric, "fm-unusable");
  if ((reason.find("Fabric Manager partition") != std::string_view::npos)) return Taint(driver, kTaintFabric, "no-partition");
  return Taint(driver, kTaintOther, "");
}

std::vector<std::string> FailureTaintKeys(std::string_view driver) {
  std::vector<std::string> keys;
  for (std::string_view kind : {kTaintNotVfio, kTaintGroupNotViable, kTaintGone, kTaintFabric, kTaintConfigSpace,
                                kTaintOther}) {
    keys.push_back(Qualified(driver, kind));
  }
  return keys;
}

std::vector<kube::DeviceTaint> WarningTaints(const HostPaths& paths, const std::string& bdf, std::string_view driver) {
  std::vector<kube::DeviceTaint> warnings;
  const std::filesystem::path dir = paths.PciDevice(bdf);
  if (!fs::Exists(dir)) return warnings;
  // validate's device.reset_method: an empty reset_method, or neither it nor `reset` (kernels before 5.15).
  absl::StatusOr<std::string> methods = fs::ReadTrimmed(dir / "reset_method");
  const bool resettable = methods.ok() ? !methods->empty() : fs::Exists(dir / "reset");
  if (!resettable) warnings.push_back(Taint(driver, kTaintNoReset, "none", "None"));
  return warnings;
}

void ApplyHealthTaints(std::vector<GpuDevice>* devices, std::string_view driver, const HostPaths& paths,
                       const TaintPolicy& policy, bool whole_gpus) {
  for (GpuDevice& device : *devices) {
    std::vector<kube::DeviceTaint> taints;
    if (!device.healthy()) taints.push_back(FailureTaint(driver, device.unhealthy_reason, policy));
    if (whole_gpus && device.unhealthy_reason != "gone from sysfs") {
      for (kube::DeviceTaint& warning : WarningTaints(paths, device.bdf, driver)) taints.push_back(std::move(warning));
    }
    device.slice.taints = std::move(taints);
  }
}

std::map<std::string, HeldSibling> ApplyGroupHeldTaints(std::vector<kube::SliceDevice>* devices,
                                                        const std::vector<GroupHold>& holds, std::string_view driver) {
  std::map<std::string, HeldSibling> tainted;
  if (holds.empty()) return tainted;
  const std::string group_key = Qualified(driver, kIommuGroupAttribute);
  const std::string bdf_key(kPciBusIdAttribute);
  auto share_pod = [](const GroupHold& a, const GroupHold& b) {
    return std::any_of(a.consumers.begin(), a.consumers.end(), [&](const std::string& pod) {
      return std::find(b.consumers.begin(), b.consumers.end(), pod) != b.consumers.end();
    });
  };
  for (kube::SliceDevice& device : *devices) {
    auto group = device.attributes.find(group_key);
    auto bdf = device.attributes.find(bdf_key);
    if (group == device.attributes.end() || group->second.kind != kube::DeviceAttribute::Kind::kInt ||
        bdf == device.attributes.end()) {
      continue;  // no IOMMU group (or not a whole GPU): nothing to split
    }
    for (const GroupHold& hold : holds) {
      if (hold.group != group->second.number || hold.bdf == bdf->second.text) continue;
      // The device is free to go with the holder's VM only if that VM already has it: held by the same claim or by
      // a claim of the same pod. Anything else (free, or held by another pod's claim) stays off new allocations.
      const bool same_vm = std::any_of(holds.begin(), holds.end(), [&](const GroupHold& own) {
        return own.bdf == bdf->second.text && (own.claim == hold.claim || share_pod(own, hold));
      });
      if (same_vm) continue;
      device.taints.push_back(Taint(driver, kTaintGroupHeld, std::to_string(hold.group)));
      tainted[device.name] = {.bdf = bdf->second.text, .group = hold.group, .claim = hold.claim};
      break;
    }
  }
  return tainted;
}

std::string WarningText(const GpuDevice& device) {
  std::vector<std::string> warnings;
  for (const kube::DeviceTaint& taint : device.slice.taints) {
    if (taint.effect == "None") warnings.push_back(absl::StrCat("warning ", taint.key, "=", taint.value));
  }
  return absl::StrJoin(warnings, "; ");
}

}  // namespace vfio_agent::dra
