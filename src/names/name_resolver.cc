// Picks one valid, node-unique name per device id: override > pinned table > pci.ids slug > hex id,
// then repairs invalid names and separates ids that would share a name (one socket per name in the
// plugin: two ids on one name would fight over it).
#include <algorithm>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "string_views.h"
#include "vfio_gpu_agent/names/resource_names.h"

namespace vfio_agent::names {
namespace {

constexpr uint16_t kNvidiaVendor = 0x10de;
// Each round gives colliding ids a longer, key-unique suffix; real inputs settle in one or two.
constexpr int kMaxCollisionRounds = 8;

std::string LowerHex(uint16_t id) { return absl::StrFormat("%04x", id); }
std::string UpperHex(uint16_t id) { return absl::StrFormat("%04X", id); }
std::string IdText(uint16_t vendor, uint16_t device) { return absl::StrCat(LowerHex(vendor), ":", LowerHex(device)); }

// Lower is stronger: only an operator's or Cozystack's name may keep its name over another's.
int Strength(NameSource source) { return static_cast<int>(source); }
bool MayKeepName(NameSource source) { return source == NameSource::kOverride || source == NameSource::kPinned; }

bool IsNameChar(char c) { return absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.'; }

// Drops characters the kubelet refuses, cuts to 63 and trims non-alphanumeric ends.
std::string RepairNamePart(std::string_view name, uint16_t device_id) {
  std::string kept;
  for (char c : name) {
    if (IsNameChar(c)) kept.push_back(c);
  }
  if (kept.size() > kMaxResourceNamePart) kept.resize(kMaxResourceNamePart);
  size_t first = 0;
  while (first < kept.size() && !absl::ascii_isalnum(kept[first])) ++first;
  size_t last = kept.size();
  while (last > first && !absl::ascii_isalnum(kept[last - 1])) --last;
  kept = kept.substr(first, last - first);
  return kept.empty() ? LowerHex(device_id) : kept;
}

// `name` is valid, so it starts with an alphanumeric character and the cut base is never empty.
std::string WithSuffix(std::string_view name, std::string_view suffix) {
  std::string base(name.substr(0, std::min(name.size(), kMaxResourceNamePart - suffix.size())));
  while (base.size() > 1 && !absl::ascii_isalnum(base.back())) base.pop_back();
  return absl::StrCat(base, AsAbsl(suffix));
}

struct Candidate {
  ResolvedName resolved;
  std::vector<std::string> issues;
};

// `fixed` names were given earlier and never change: an id sharing one always moves.
void SeparateCollisions(std::map<uint32_t, Candidate>& candidates, const std::set<uint32_t>& fixed) {
  for (int round = 0; round < kMaxCollisionRounds; ++round) {
    std::map<std::string, std::vector<uint32_t>> keys_by_name;
    for (const auto& [key, candidate] : candidates) keys_by_name[candidate.resolved.name].push_back(key);

    bool renamed = false;
    for (const auto& [name, keys] : keys_by_name) {
      if (keys.size() < 2) continue;
      auto source_of = [&](uint32_t key) { return candidates.at(key).resolved.source; };
      int strongest = Strength(source_of(keys.front()));
      for (uint32_t key : keys) strongest = std::min(strongest, Strength(source_of(key)));
      std::vector<uint32_t> strongest_keys;
      std::copy_if(keys.begin(), keys.end(), std::back_inserter(strongest_keys),
                   [&](uint32_t key) { return Strength(source_of(key)) == strongest; });
      std::optional<uint32_t> keeper;
      if (strongest_keys.size() == 1 && MayKeepName(source_of(strongest_keys.front()))) keeper = strongest_keys.front();
      for (uint32_t key : keys) {
        if (fixed.contains(key)) keeper = key;
      }

      std::multiset<uint16_t> device_ids;
      std::vector<std::string> sharers;
      for (uint32_t key : keys) {
        const ResolvedName& r = candidates.at(key).resolved;
        device_ids.insert(r.device_id);
        sharers.push_back(absl::StrCat(IdText(r.vendor_id, r.device_id), " (", NameSourceName(r.source), ")"));
      }
      std::string shared_by = absl::StrJoin(sharers, ", ");

      for (uint32_t key : keys) {
        if (keeper == key) continue;
        ResolvedName& r = candidates.at(key).resolved;
        // The device id alone is the readable choice; the vendor joins it when that is not unique
        // (same device id under two vendors) or a first suffix already collided.
        std::string suffix = round == 0 && device_ids.count(r.device_id) == 1
                                 ? absl::StrCat("_", UpperHex(r.device_id))
                                 : absl::StrCat("_", UpperHex(r.vendor_id), "_", UpperHex(r.device_id));
        std::string renamed_to = WithSuffix(r.name, suffix);
        candidates.at(key).issues.push_back(absl::StrCat("name \"", name, "\" is shared by ", shared_by,
                                                         "; registered as \"", renamed_to, "\""));
        r.name = std::move(renamed_to);
        renamed = true;
      }
    }
    if (!renamed) return;
  }
}

}  // namespace

struct NameResolver::Given {
  std::mutex mu;
  bool universe_resolved = false;
  std::map<uint32_t, ResolvedName> names;
};

NameResolver::NameResolver(const PciIdsDatabase* db, std::string domain, std::vector<NameOverride> overrides)
    : db_(db), domain_(std::move(domain)), overrides_(std::move(overrides)), given_(std::make_shared<Given>()) {}

std::map<uint32_t, ResolvedName> NameResolver::Resolve(const std::vector<std::pair<uint16_t, uint16_t>>& ids) const {
  std::lock_guard lock(given_->mu);
  std::map<uint32_t, ResolvedName>& given = given_->names;

  std::vector<std::pair<uint16_t, uint16_t>> fresh;
  for (const auto& [vendor, device] : ids) {
    if (!given.contains(NameKey(vendor, device))) fresh.emplace_back(vendor, device);
  }
  if (!given_->universe_resolved) {
    given_->universe_resolved = true;
    for (const auto& [device, name] : PinnedNames()) fresh.emplace_back(kNvidiaVendor, device);
    for (const NameOverride& o : overrides_) fresh.emplace_back(o.vendor_id, o.device_id);
  }
  if (!fresh.empty()) {
    std::map<uint32_t, std::string> override_by_key;
    for (const NameOverride& o : overrides_) override_by_key[NameKey(o.vendor_id, o.device_id)] = o.name;
    const auto& pinned = PinnedNames();

    std::map<uint32_t, Candidate> candidates;
    std::set<uint32_t> fixed;
    for (const auto& [key, name] : given) {
      candidates[key].resolved = name;
      fixed.insert(key);
    }
    for (const auto& [vendor, device] : fresh) {
      uint32_t key = NameKey(vendor, device);
      if (candidates.contains(key)) continue;
      Candidate& c = candidates[key];
      ResolvedName& r = c.resolved;
      r.vendor_id = vendor;
      r.device_id = device;
      auto pinned_it = vendor == kNvidiaVendor ? pinned.find(device) : pinned.end();
      if (auto it = override_by_key.find(key); it != override_by_key.end()) {
        r.name = it->second;
        r.source = NameSource::kOverride;
      } else if (pinned_it != pinned.end()) {
        r.name = pinned_it->second;
        r.source = NameSource::kPinned;
      } else {
        // The only lookup: a node whose GPUs all have pinned or overridden names never needs pci.ids loaded.
        if (db_ != nullptr) r.pci_ids_name = db_->DeviceName(vendor, device).value_or("");
        r.name = Slug(r.pci_ids_name);
        r.source = NameSource::kPciIds;
        if (r.name.empty()) {
          r.name = LowerHex(device);
          r.source = NameSource::kDeviceId;
        }
      }

      if (absl::Status valid = ValidateResourceNamePart(r.name); !valid.ok()) {
        std::string repaired = RepairNamePart(r.name, device);
        c.issues.push_back(absl::StrCat(NameSourceName(r.source), " name \"", r.name, "\" for ",
                                        IdText(vendor, device), " is invalid (", valid.message(), "); using \"",
                                        repaired, "\""));
        r.name = std::move(repaired);
      }
    }

    SeparateCollisions(candidates, fixed);

    absl::Status domain_valid = ValidateResourceDomain(domain_);
    for (auto& [key, c] : candidates) {
      if (fixed.contains(key)) continue;
      if (!domain_valid.ok()) c.issues.push_back(std::string(domain_valid.message()));
      c.resolved.resource_name = absl::StrCat(domain_, "/", c.resolved.name);
      c.resolved.issue = absl::StrJoin(c.issues, "; ");
      given.emplace(key, std::move(c.resolved));
    }
  }

  std::map<uint32_t, ResolvedName> resolved;
  for (const auto& [vendor, device] : ids) {
    const uint32_t key = NameKey(vendor, device);
    resolved.emplace(key, given.at(key));
  }
  return resolved;
}

}  // namespace vfio_agent::names
