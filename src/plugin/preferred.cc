#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "vfio_gpu_agent/plugin/allocate.h"

namespace vfio_agent::plugin {
namespace {

constexpr int kNoNuma = -1;      // devices without topology form their own pseudo node
constexpr int kNoGroup = -1000;  // ids the snapshot does not know (stale kubelet state): never grouped

struct Candidate {
  std::string id;
  int numa = kNoNuma;
  int group = kNoGroup;
  bool known = false;
};

// Candidates sharing an IOMMU group are taken together when they fit, so a group is not split between
// two VMs (the second QEMU would fail with EBUSY on /dev/vfio/<group>).
struct Unit {
  std::vector<const Candidate*> members;  // BDF order
  bool completes_must_include = false;    // shares its group with a must-include device
  bool group_split_elsewhere = false;     // some GPU of the group is neither free nor must-include
};

}  // namespace

std::vector<std::string> PreferredAllocation(const ResourceDevices& resource, const std::vector<std::string>& available,
                                             const std::vector<std::string>& must_include, int size) {
  const std::set<std::string> must(must_include.begin(), must_include.end());
  if (size <= static_cast<int>(must.size())) return {must.begin(), must.end()};
  const std::set<std::string> offered(available.begin(), available.end());
  std::set<std::string> free_or_must = offered;
  free_or_must.insert(must.begin(), must.end());

  auto describe = [&](const std::string& id) {
    Candidate c{id};
    if (const PluginDevice* device = resource.Find(id)) {
      c.known = true;
      c.numa = device->numa_node.value_or(kNoNuma);
      c.group = device->iommu_group.value_or(kNoGroup);
    }
    return c;
  };
  std::vector<Candidate> candidates;
  std::set<int> must_numa, must_groups;
  for (const std::string& id : must) {
    Candidate c = describe(id);
    must_numa.insert(c.numa);
    if (c.group != kNoGroup) must_groups.insert(c.group);
  }
  for (const std::string& id : offered) {
    if (!must.contains(id)) candidates.push_back(describe(id));
  }
  const int remaining = size - static_cast<int>(must.size());

  // Target NUMA node: the must-include devices' node if they share one, else the node that fits the
  // request most tightly (leaving bigger nodes for bigger requests), lowest id on ties.
  std::map<int, int> per_numa;
  for (const Candidate& c : candidates) {
    if (c.known) ++per_numa[c.numa];
  }
  std::optional<int> target;
  if (must_numa.size() == 1) {
    target = *must_numa.begin();
  } else if (must_numa.empty()) {
    for (const auto& [numa, count] : per_numa) {
      if (numa != kNoNuma && count >= remaining && (!target || count < per_numa[*target])) target = numa;
    }
  }
  // NUMA tiers: the target first, then nodes with more free devices (fewer nodes spanned), no-topology and
  // unknown devices last.
  auto tier_of = [&](const Candidate& c) {
    if (!c.known) return 3;
    if (target && c.numa == *target) return 0;
    return c.numa == kNoNuma ? 2 : 1;
  };
  auto node_rank = [&](const Candidate& c) { return std::make_pair(-per_numa[c.numa], c.numa); };

  std::map<int, std::set<std::string>> group_gpus;  // every GPU of the resource per group
  for (const PluginDevice& device : resource.devices) {
    if (device.iommu_group) group_gpus[*device.iommu_group].insert(device.id);
  }
  std::vector<Unit> units;
  std::map<int, size_t> unit_of_group;
  for (const Candidate& c : candidates) {
    if (c.group != kNoGroup) {
      auto [it, inserted] = unit_of_group.emplace(c.group, units.size());
      if (!inserted) {
        units[it->second].members.push_back(&c);
        continue;
      }
    }
    Unit unit;
    unit.members.push_back(&c);
    if (c.group != kNoGroup) {
      unit.completes_must_include = must_groups.contains(c.group);
      for (const std::string& gpu : group_gpus[c.group]) {
        if (!free_or_must.contains(gpu)) unit.group_split_elsewhere = true;
      }
    }
    units.push_back(std::move(unit));
  }
  auto unit_key = [&](const Unit& u) {
    const Candidate& first = *u.members.front();
    return std::make_tuple(tier_of(first), tier_of(first) == 1 ? node_rank(first) : std::make_pair(0, 0),
                           !u.completes_must_include, u.group_split_elsewhere, first.id);
  };
  std::sort(units.begin(), units.end(), [&](const Unit& a, const Unit& b) { return unit_key(a) < unit_key(b); });

  std::set<std::string> chosen(must.begin(), must.end());
  int left = remaining;
  // Per tier: whole units that fit first, then split what must be split, before spilling to the next tier.
  for (size_t begin = 0; begin < units.size() && left > 0;) {
    size_t end = begin;
    const int tier = tier_of(*units[begin].members.front());
    const auto rank = node_rank(*units[begin].members.front());
    while (end < units.size() && tier_of(*units[end].members.front()) == tier &&
           (tier != 1 || node_rank(*units[end].members.front()) == rank)) {
      ++end;
    }
    std::vector<bool> taken(end - begin, false);
    // Biggest whole groups first: what is left over are small groups, which later requests can take
    // without splitting anything.
    std::vector<size_t> by_size(end - begin);
    for (size_t i = begin; i < end; ++i) by_size[i - begin] = i;
    std::stable_sort(by_size.begin(), by_size.end(),
                     [&](size_t a, size_t b) { return units[a].members.size() > units[b].members.size(); });
    for (size_t i : by_size) {
      if (left == 0) break;
      if (static_cast<int>(units[i].members.size()) <= left) {
        for (const Candidate* c : units[i].members) chosen.insert(c->id);
        left -= static_cast<int>(units[i].members.size());
        taken[i - begin] = true;
      }
    }
    for (size_t i = begin; i < end && left > 0; ++i) {
      if (taken[i - begin]) continue;
      for (const Candidate* c : units[i].members) {
        if (left == 0) break;
        chosen.insert(c->id);
        --left;
      }
    }
    begin = end;
  }
  return {chosen.begin(), chosen.end()};
}

}  // namespace vfio_agent::plugin
