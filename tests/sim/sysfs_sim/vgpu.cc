#include "vgpu.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <numeric>

#include "absl/strings/str_format.h"

namespace vfio_agent::sim {
namespace {

bool IsVfOf(const DeviceState& vf, const DeviceState& card) { return vf.present && vf.spec.physfn == card.spec.bdf; }

// Instances per type id on the card, over the PF and all its VFs.
std::map<std::string, int> CardUsage(const KernelState& state, const DeviceState& card) {
  std::map<std::string, int> used;
  for (const MdevState& mdev : state.mdevs) {
    const DeviceState* parent = state.Find(mdev.parent);
    if (parent && (parent == &card || IsVfOf(*parent, card))) ++used[mdev.type_id];
  }
  for (const DeviceState& dev : state.devices) {
    if (IsVfOf(dev, card) && dev.vgpu_type != 0) ++used[std::to_string(dev.vgpu_type)];
  }
  return used;
}

// How many more instances of `type` fit on the card. Shares are counted in units of 1/L of the card, L the
// lcm of the max_instances of the types involved, so mixed sizes add up exactly.
int CardAvailable(const KernelState& state, const DeviceState& card, const VgpuTypeSpec& type) {
  const std::map<std::string, int> used = CardUsage(state, card);
  uint64_t lcm = static_cast<uint64_t>(type.max_instances);
  for (const VgpuTypeSpec& t : card.spec.vgpu.types) {
    auto it = used.find(t.id);
    if (it == used.end() || it->second == 0) continue;
    if (card.spec.vgpu.one_type_at_a_time && t.id != type.id) return 0;
    lcm = std::lcm(lcm, static_cast<uint64_t>(t.max_instances));
  }
  uint64_t used_units = 0;
  for (const VgpuTypeSpec& t : card.spec.vgpu.types) {
    auto it = used.find(t.id);
    if (it != used.end()) used_units += static_cast<uint64_t>(it->second) * (lcm / static_cast<uint64_t>(t.max_instances));
  }
  if (used_units >= lcm) return 0;
  return static_cast<int>((lcm - used_units) / (lcm / static_cast<uint64_t>(type.max_instances)));
}

}  // namespace

const DeviceState* CardOf(const KernelState& state, const DeviceState& dev) {
  const DeviceState* card = dev.spec.physfn.empty() ? &dev : state.Find(dev.spec.physfn);
  return card && card->spec.vgpu.framework != VgpuFramework::kNone ? card : nullptr;
}

bool IsMdevParent(const KernelState& state, const DeviceState& dev) {
  const DeviceState* card = CardOf(state, dev);
  if (!card || !dev.present || dev.driver != "nvidia") return false;
  const bool is_vf = !dev.spec.physfn.empty();
  return (card->spec.vgpu.framework == VgpuFramework::kMdev && !is_vf) ||
         (card->spec.vgpu.framework == VgpuFramework::kMdevVf && is_vf);
}

bool HasSriovVgpuFiles(const KernelState& state, const DeviceState& dev) {
  const DeviceState* card = CardOf(state, dev);
  return card && dev.present && dev.driver == "nvidia" && card->spec.vgpu.framework == VgpuFramework::kSriov;
}

int AvailableInstances(const KernelState& state, const DeviceState& parent, const VgpuTypeSpec& type) {
  const DeviceState* card = CardOf(state, parent);
  if (!card) return 0;
  const int on_card = CardAvailable(state, *card, type);
  if (card == &parent) return on_card;
  // Ampere: a VF parent hosts one vGPU.
  const bool vf_busy = std::any_of(state.mdevs.begin(), state.mdevs.end(),
                                   [&](const MdevState& m) { return m.parent == parent.spec.bdf; });
  return vf_busy ? 0 : std::min(on_card, 1);
}

std::vector<const VgpuTypeSpec*> CreatableTypes(const KernelState& state, const DeviceState& dev) {
  std::vector<const VgpuTypeSpec*> types;
  const DeviceState* card = CardOf(state, dev);
  if (!card || dev.vgpu_type != 0) return types;
  for (const VgpuTypeSpec& t : card->spec.vgpu.types) {
    if (CardAvailable(state, *card, t) > 0) types.push_back(&t);
  }
  return types;
}

std::string CreatableVgpuTypesText(const std::vector<const VgpuTypeSpec*>& types) {
  std::string out = "ID    : vGPU Name\n";
  for (const VgpuTypeSpec* t : types) absl::StrAppendFormat(&out, "%-6s: %s\n", t->id, t->name);
  return out;
}

int AllocateIommuGroup(const KernelState& state) {
  for (int group = state.first_dynamic_group;; ++group) {
    const bool taken =
        std::any_of(state.devices.begin(), state.devices.end(),
                    [&](const DeviceState& d) { return d.present && d.spec.iommu_group == group; }) ||
        std::any_of(state.mdevs.begin(), state.mdevs.end(), [&](const MdevState& m) { return m.iommu_group == group; });
    if (!taken) return group;
  }
}

std::string ParseUuid(const std::string& text) {
  if (text.size() != 36) return "";
  std::string out = text;
  for (size_t i = 0; i < out.size(); ++i) {
    const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash ? out[i] != '-' : !std::isxdigit(static_cast<unsigned char>(out[i]))) return "";
    out[i] = static_cast<char>(std::tolower(static_cast<unsigned char>(out[i])));
  }
  return out;
}

}  // namespace vfio_agent::sim
