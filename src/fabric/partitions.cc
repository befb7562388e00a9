#include "vfio_gpu_agent/fabric/partitions.h"

#include <algorithm>
#include <charconv>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace vfio_agent::fabric {
namespace {

bool ParseHex(std::string_view text, size_t max_digits, unsigned int* value) {
  if (text.empty() || text.size() > max_digits) return false;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *value, 16);
  return ec == std::errc() && end == text.data() + text.size();
}

bool Subset(const std::vector<std::string>& gpus, const std::set<std::string>& of) {
  return std::all_of(gpus.begin(), gpus.end(), [&](const std::string& gpu) { return of.contains(gpu); });
}

bool Overlaps(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  return std::any_of(a.begin(), a.end(), [&](const std::string& gpu) {
    return std::binary_search(b.begin(), b.end(), gpu);
  });
}

}  // namespace

absl::StatusOr<std::string> BdfFromFmBusId(std::string_view bus_id) {
  // domain:bus:device.function, with the NVML 8-digit domain.
  const size_t first = bus_id.find(':');
  const size_t second = first == std::string_view::npos ? first : bus_id.find(':', first + 1);
  const size_t dot = second == std::string_view::npos ? second : bus_id.find('.', second + 1);
  unsigned int domain = 0, bus = 0, device = 0, function = 0;
  if (dot == std::string_view::npos || !ParseHex(bus_id.substr(0, first), 8, &domain) ||
      !ParseHex(bus_id.substr(first + 1, second - first - 1), 2, &bus) ||
      !ParseHex(bus_id.substr(second + 1, dot - second - 1), 2, &device) ||
      !ParseHex(bus_id.substr(dot + 1), 1, &function) || domain > 0xffff || device > 0x1f || function > 7) {
    return absl::InvalidArgumentError(absl::StrCat("Fabric Manager reported a malformed pciBusId \"", std::string(bus_id), "\""));
  }
  return absl::StrFormat("%04x:%02x:%02x.%x", domain, bus, device, function);
}

PartitionTable::PartitionTable(std::vector<Partition> partitions) : partitions_(std::move(partitions)) {
  for (Partition& partition : partitions_) std::sort(partition.gpus.begin(), partition.gpus.end());
  std::sort(partitions_.begin(), partitions_.end(), [](const Partition& a, const Partition& b) { return a.id < b.id; });
}

const Partition* PartitionTable::Find(uint32_t id) const {
  for (const Partition& partition : partitions_) {
    if (partition.id == id) return &partition;
  }
  return nullptr;
}

const Partition* PartitionTable::Exact(const std::set<std::string>& gpus) const {
  for (const Partition& partition : partitions_) {
    if (partition.gpus.size() == gpus.size() && std::equal(partition.gpus.begin(), partition.gpus.end(), gpus.begin())) {
      return &partition;
    }
  }
  return nullptr;
}

bool PartitionTable::Contains(std::string_view bdf) const {
  return std::any_of(partitions_.begin(), partitions_.end(), [&](const Partition& partition) {
    return std::binary_search(partition.gpus.begin(), partition.gpus.end(), bdf);
  });
}

std::set<int> PartitionTable::Sizes() const {
  std::set<int> sizes;
  for (const Partition& partition : partitions_) sizes.insert(static_cast<int>(partition.gpus.size()));
  return sizes;
}

std::optional<std::vector<std::string>> PreferredPartition(const PartitionTable& table,
                                                           const std::set<std::string>& free,
                                                           const std::set<std::string>& must, int size,
                                                           const std::map<std::string, int>& numa) {
  std::set<std::string> usable = free;
  usable.insert(must.begin(), must.end());
  std::vector<const Partition*> free_partitions;
  for (const Partition& partition : table.partitions()) {
    if (Subset(partition.gpus, usable)) free_partitions.push_back(&partition);
  }
  const Partition* best = nullptr;
  std::tuple<int, int, uint32_t> best_key;
  for (const Partition* candidate : free_partitions) {
    if (static_cast<int>(candidate->gpus.size()) != size) continue;
    if (!std::all_of(must.begin(), must.end(), [&](const std::string& gpu) {
          return std::binary_search(candidate->gpus.begin(), candidate->gpus.end(), gpu);
        })) {
      continue;
    }
    int broken = 0;
    for (const Partition* larger : free_partitions) {
      if (larger->gpus.size() > candidate->gpus.size() && Overlaps(candidate->gpus, larger->gpus)) ++broken;
    }
    std::set<int> nodes;
    for (const std::string& gpu : candidate->gpus) {
      auto it = numa.find(gpu);
      nodes.insert(it == numa.end() ? -1 : it->second);
    }
    const auto key = std::make_tuple(broken, static_cast<int>(nodes.size()), candidate->id);
    if (best == nullptr || key < best_key) {
      best = candidate;
      best_key = key;
    }
  }
  if (best == nullptr) return std::nullopt;
  return best->gpus;
}

std::string Describe(const Partition& partition) {
  return absl::StrCat("P", partition.id, " [", absl::StrJoin(partition.gpus, ","), "]");
}

}  // namespace vfio_agent::fabric
