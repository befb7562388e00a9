// A healthy GPU alone in its IOMMU group, as the plugin's tests build their device snapshots.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

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

}  // namespace vfio_agent::plugin::fixtures
