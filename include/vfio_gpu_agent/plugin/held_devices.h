// Which of our devices the kubelet has assigned to a pod right now (pod-resources List): what must not be
// released under a running VM.
#pragma once

#include <chrono>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace vfio_agent::plugin {

// Per container pod-resources lists, the device ids it holds of `resource_names` (containers holding none left
// out). Unavailable with the socket and gRPC's reason when the kubelet does not answer within `deadline`.
absl::StatusOr<std::vector<std::set<std::string>>> HeldDeviceSets(const std::filesystem::path& socket,
                                                                 const std::set<std::string>& resource_names,
                                                                 std::chrono::milliseconds deadline);

// The same List, with whose they are: per container holding any of `resource_names`, its pod and the ids.
struct HeldByContainer {
  std::string pod_namespace;
  std::string pod_name;
  std::set<std::string> ids;
};
absl::StatusOr<std::vector<HeldByContainer>> HeldDevicesByPod(const std::filesystem::path& socket,
                                                              const std::set<std::string>& resource_names,
                                                              std::chrono::milliseconds deadline);

}  // namespace vfio_agent::plugin
