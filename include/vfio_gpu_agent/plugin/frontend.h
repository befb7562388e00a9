// The device plugin as `run`'s frontend (node::Frontend): an Agent, and its side of the node's readiness (every
// required GPU advertised and healthy, every resource with devices registered; the kubelet's allocatable set is then
// compared by the daemon, which asks validation).
#pragma once

#include <memory>

#include "vfio_gpu_agent/node/frontend.h"
#include "vfio_gpu_agent/plugin/agent.h"

namespace vfio_agent::plugin {

// The agent is made now and served by Start. `options.source` should be the daemon's shared source.
std::unique_ptr<node::Frontend> MakeFrontend(ServeOptions options);

// The devices of `snapshot`, in its order (resource name, then id).
node::ServedDevices ServedOf(const DeviceSnapshot& snapshot);

}  // namespace vfio_agent::plugin
