// The simulator's node description (JSON, proto/sim/v1/node.proto), as sysfs-sim and the tests load it.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>

#include "node_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto node = vfio_agent::sim::ParseNode(absl::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
  if (!node.ok()) return 0;
  // ParseNode's promises: valid, distinct BDFs, parents listed before their children.
  std::set<std::string> seen;
  for (const auto& device : node->devices) {
    if (!vfio_agent::sim::IsValidBdf(device.bdf)) std::abort();
    if (!device.parent.empty() && !seen.count(device.parent)) std::abort();
    if (!seen.insert(device.bdf).second) std::abort();
    (void)vfio_agent::sim::ErrnoName(device.bind_errno);
  }
  return 0;
}
