// The in-process `run` of the passthrough daemon tests on a plugin-harness node: no listeners, the node's
// pod-resources socket, and bind deadlines a loaded machine meets (a miss would be a failed bind, backed off).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "run_harness.h"
#include "vfio_gpu_agent/daemon/daemon.h"

namespace vfio_agent::daemon::testing {

inline DaemonOptions PassthroughDaemonOptions(const plugin::testing::Node& node) {
  DaemonOptions options;
  options.serve = node.options;
  options.serve.paths.pod_resources_socket = PodResourcesSocket(node);
  options.bind.paths = options.serve.paths;
  options.bind.targets = binding::Targets::EverySelected();
  options.bind.write_timeout = absl::Seconds(30);
  options.bind.devnode_wait = absl::Seconds(30);
  options.health_port = 0;
  options.metrics_port = 0;
  return options;
}

// A plugin-harness node from `fixture` with its kubelet simulator serving pod-resources, as the in-process daemon
// tests start from.
inline absl::StatusOr<std::unique_ptr<plugin::testing::Node>> NodeWithKubelet(const std::string& fixture) {
  absl::StatusOr<std::unique_ptr<plugin::testing::Node>> node = plugin::testing::Node::Create(fixture);
  if (!node.ok()) return node.status();
  kubeletsim::Options kubelet;
  kubelet.pod_resources_socket = PodResourcesSocket(**node);
  if (absl::Status started = (*node)->StartKubelet(kubelet); !started.ok()) return started;
  return node;
}

}  // namespace vfio_agent::daemon::testing
