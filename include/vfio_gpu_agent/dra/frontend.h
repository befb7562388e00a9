// The DRA driver as `run`'s frontend (node::Frontend): a Driver, and its side of the node's readiness (every required
// GPU published healthy, the driver registered with the kubelet, the node's slices written).
#pragma once

#include <memory>

#include "vfio_gpu_agent/dra/driver.h"
#include "vfio_gpu_agent/node/frontend.h"

namespace vfio_agent::dra {

// The driver is made now and served by Start. `options.source` should be the daemon's shared source.
std::unique_ptr<node::Frontend> MakeFrontend(DriverOptions options);

}  // namespace vfio_agent::dra
