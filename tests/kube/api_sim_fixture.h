// The fixture of the tests that talk to a fake kube-apiserver: one server per test, in the test's own directory.
#pragma once

#include <memory>
#include <utility>

#include "gtest/gtest.h"
#include "kube_api_sim.h"
#include "support/sysfs_tree.h"

namespace vfio_agent::kube::testing {

class KubeApiSimTest : public ::testing::Test {
 protected:
  // A derived SetUp calls this first and returns when it skipped or failed (IsSkipped(), HasFatalFailure()).
  void SetUp() override {
    if (!sim::KubeApiSim::Available()) GTEST_SKIP() << "python3 not found";
    auto api = sim::KubeApiSim::Start(dir_.path());
    ASSERT_TRUE(api.ok()) << api.status();
    api_ = *std::move(api);
  }

  vfio_agent::testing::TempDir dir_;
  std::unique_ptr<sim::KubeApiSim> api_;
};

}  // namespace vfio_agent::kube::testing
