// Allocate and GetPreferredAllocation request handling on a fuzzed device snapshot: ids, health, NUMA
// nodes, IOMMU groups and cdevs from the input, requests of arbitrary (also unknown or malformed) ids.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "vfio_gpu_agent/plugin/allocate.h"
#include "vfio_gpu_agent/plugin/devices.h"

using namespace vfio_agent;

namespace {

// Mostly BDFs of a small bus, so requests name known devices; sometimes arbitrary text.
std::string ConsumeId(FuzzedDataProvider& input) {
  if (input.ConsumeIntegralInRange<int>(0, 7) == 0) return input.ConsumeRandomLengthString(24);
  return absl::StrFormat("0000:%02x:00.%d", input.ConsumeIntegralInRange<int>(0, 15),
                         input.ConsumeIntegralInRange<int>(0, 7));
}

std::vector<std::string> ConsumeIds(FuzzedDataProvider& input, size_t max) {
  std::vector<std::string> ids(input.ConsumeIntegralInRange<size_t>(0, max));
  for (auto& id : ids) id = ConsumeId(input);
  return ids;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider input(data, size);
  plugin::ResourceDevices resource;
  resource.resource_name = "nvidia.com/GH100_H200_SXM_141GB";
  resource.env_name = "PCI_RESOURCE_NVIDIA_COM_GH100_H200_SXM_141GB";
  std::set<std::string> ids;
  for (int n = input.ConsumeIntegralInRange<int>(0, 16); n > 0; --n) ids.insert(ConsumeId(input));
  for (const auto& id : ids) {  // sorted by id, as the snapshot keeps them
    plugin::PluginDevice device;
    device.id = id;
    device.healthy = input.ConsumeBool();
    if (!device.healthy) device.unhealthy_reason = "driver nvidia";
    if (input.ConsumeBool()) device.numa_node = input.ConsumeIntegralInRange<int>(0, 3);
    if (input.ConsumeBool()) device.iommu_group = input.ConsumeIntegralInRange<int>(0, 5);
    device.group_functions = {id};
    if (input.ConsumeBool()) device.vfio_cdevs.push_back(absl::StrFormat("vfio%d", input.ConsumeIntegral<uint8_t>()));
    resource.devices.push_back(std::move(device));
  }
  plugin::AllocateConfig config{
      .node_set = static_cast<pci::VfioNodeSet>(input.ConsumeIntegralInRange<int>(0, 2)),
      .host_iommufd = input.ConsumeBool(),
      .cdi = input.ConsumeBool()};

  std::vector<std::string> request = ConsumeIds(input, 10);
  auto allocation = plugin::AllocateContainer(resource, config, request);
  if (allocation.ok()) {
    // Only known, healthy devices are handed out, and the same request gives the same answer.
    for (const auto& id : request) {
      const plugin::PluginDevice* device = resource.Find(id);
      if (device == nullptr || !device->healthy) std::abort();
    }
    auto again = plugin::AllocateContainer(resource, config, request);
    if (!again.ok() || !(*again == *allocation)) std::abort();
  }

  std::vector<std::string> available = ConsumeIds(input, 16);
  std::vector<std::string> must_include = ConsumeIds(input, 4);
  int want = input.ConsumeIntegralInRange<int>(-2, 18);
  std::vector<std::string> preferred = plugin::PreferredAllocation(resource, available, must_include, want);
  // No duplicates, every must-include id, only ids the kubelet offered.
  std::set<std::string> offered(available.begin(), available.end());
  offered.insert(must_include.begin(), must_include.end());
  std::set<std::string> distinct(preferred.begin(), preferred.end());
  if (distinct.size() != preferred.size()) std::abort();
  // More than asked only when the kubelet itself must-includes more (the kubelet never does; the plugin then
  // returns exactly the must-include set).
  const std::set<std::string> must(must_include.begin(), must_include.end());
  if (static_cast<int>(preferred.size()) > std::max({want, 0, static_cast<int>(must.size())})) std::abort();
  for (const auto& id : must) {
    if (std::find(preferred.begin(), preferred.end(), id) == preferred.end()) std::abort();
  }
  for (const auto& id : preferred) {
    if (!offered.count(id)) std::abort();
  }
  // Order of the inputs does not matter.
  std::reverse(available.begin(), available.end());
  std::reverse(must_include.begin(), must_include.end());
  if (plugin::PreferredAllocation(resource, available, must_include, want) != preferred) std::abort();
  return 0;
}
