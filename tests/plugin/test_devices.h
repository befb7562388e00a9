// Healthy devices as the plugin's tests build their device snapshots: a GPU alone in its IOMMU group, and the
// NVSwitches of a group.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "vfio_gpu_agent/plugin/devices.h"

namespace vfio_agent::plugin::fixtures {

inline PluginDevice Gpu(std::string id, int group, std::optional<int> numa = std::nullopt,
                        std::vector<std::string> cdevs = {}) {
  PluginDevice d;
  d.id = std::move(id);
  d.healthy = true;
  d.iommu_group = group;
  d.numa_node = numa;
  d.group_functions = {d.id};
  d.vfio_cdevs = std::move(cdevs);
  return d;
}

// The NVSwitches of one IOMMU group, healthy, each listing the others as the peers Allocate requires with it.
inline std::vector<PluginDevice> NvSwitchGroup(const std::vector<std::string>& ids, int group,
                                               std::optional<int> numa = std::nullopt) {
  std::vector<PluginDevice> out;
  for (const std::string& id : ids) {
    PluginDevice d = Gpu(id, group, numa);
    d.group_functions = ids;
    for (const std::string& peer : ids) {
      if (peer != id) d.group_peers.push_back(peer);
    }
    out.push_back(std::move(d));
  }
  return out;
}

// The device `id` of `resource` in `snapshot`; a test failure (and an empty device) when either is missing.
inline PluginDevice DeviceIn(const DeviceSnapshot& snapshot, const std::string& resource, const std::string& id) {
  auto it = snapshot.resources.find(resource);
  const PluginDevice* device = it != snapshot.resources.end() ? it->second.Find(id) : nullptr;
  EXPECT_NE(device, nullptr) << resource << " " << id;
  return device != nullptr ? *device : PluginDevice{};
}

}  // namespace vfio_agent::plugin::fixtures
