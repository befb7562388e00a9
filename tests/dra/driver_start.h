// Test support for the DRA driver tests: the driver started and registered with kubelet-dra-sim.
#pragma once

#include <chrono>
#include <memory>

#include <gtest/gtest.h>

#include "kubelet_dra_sim.h"
#include "vfio_gpu_agent/dra/driver.h"

namespace vfio_agent::testing {

// Starts a Driver on `options` into `driver`, and the first time (`kubelet` empty) the kubelet simulator watching
// its registry directory; returns once the kubelet has the plugin. Call under ASSERT_NO_FATAL_FAILURE.
inline void StartRegistered(const dra::DriverOptions& options, std::unique_ptr<dra::Driver>* driver,
                            std::unique_ptr<kubeletsim::dra::KubeletDraSim>* kubelet) {
  *driver = std::make_unique<dra::Driver>(options);
  ASSERT_TRUE((*driver)->Start().ok());
  if (!*kubelet) {
    *kubelet = std::make_unique<kubeletsim::dra::KubeletDraSim>(
        kubeletsim::dra::Options{.registry_dir = options.registry_dir});
    ASSERT_TRUE((*kubelet)->Start().ok());
  }
  ASSERT_TRUE((*kubelet)->WaitFor([](const kubeletsim::dra::KubeletDraSim& k) { return !k.Plugins().empty(); },
                                  std::chrono::seconds(30)));
}

}  // namespace vfio_agent::testing
