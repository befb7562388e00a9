// The in-process `run` of the passthrough daemon tests on a plugin-harness node: no listeners, the node's
// pod-resources socket, and bind deadlines a loaded machine meets (a miss would be a failed bind, backed off).
#pragma once

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

}  // namespace vfio_agent::daemon::testing
