// Fabric Manager partitions as the agent reasons about them: the GPUs of each partition by PCI address (FM's
// own pciBusId, never PCI order: module ids are not PCI order), and the pure choices made over them.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace vfio_agent::fabric {

struct Partition {
  uint32_t id = 0;
  bool active = false;
  std::vector<std::string> gpus;     // sysfs BDFs ("0000:18:00.0"), sorted
  std::vector<uint32_t> module_ids;  // FM's physicalId of each GPU, in FM's order
  bool operator==(const Partition&) const = default;
};

// FM's pciBusId ("00000000:18:00.0", any case, 4- or 8-digit domain) as a sysfs BDF.
absl::StatusOr<std::string> BdfFromFmBusId(std::string_view bus_id);

// Supported partitions of one board, by id.
class PartitionTable {
 public:
  PartitionTable() = default;
  explicit PartitionTable(std::vector<Partition> partitions);

  const std::vector<Partition>& partitions() const { return partitions_; }
  const Partition* Find(uint32_t id) const;
  // The partition holding exactly `gpus`, if any.
  const Partition* Exact(const std::set<std::string>& gpus) const;
  bool Contains(std::string_view bdf) const;  // the GPU is in some partition
  std::set<int> Sizes() const;
  bool operator==(const PartitionTable&) const = default;

 private:
  std::vector<Partition> partitions_;
};

// GetPreferredAllocation over partitions: the GPUs of a partition of exactly `size` GPUs, all in `free` (or in
// `must`), holding every `must` GPU; of those, the one whose use breaks the fewest larger partitions that are
// free now, then the one spanning the fewest NUMA nodes (`numa`: BDF -> node; absent = no topology), then the
// lowest id. nullopt when no such partition exists (no partition of that size, or none is free).
std::optional<std::vector<std::string>> PreferredPartition(const PartitionTable& table,
                                                           const std::set<std::string>& free,
                                                           const std::set<std::string>& must, int size,
                                                           const std::map<std::string, int>& numa);

// "P3 [0000:18:00.0,0000:2a:00.0]": how a partition is named in messages and events.
std::string Describe(const Partition& partition);

}  // namespace vfio_agent::fabric
