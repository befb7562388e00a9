// What the DRA driver's claim tests share: the node's directories under one test directory, the kubelet simulator
// that registers the driver, and claims as the scheduler leaves them for the fake API server.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>

#include "kube/api_sim_fixture.h"
#include "kube_api_sim.h"
#include "kubelet_dra_sim.h"
#include "nlohmann/json.hpp"
#include "vfio_gpu_agent/dra/driver.h"

namespace vfio_agent::dra::claimtest {

// The registry, plugins and CDI directories and the sysfs, /dev and /proc roots, all under `dir`.
inline DriverOptions NodeDirectories(const std::filesystem::path& dir) {
  DriverOptions options;
  options.registry_dir = dir / "plugins_registry";
  options.plugins_dir = dir / "plugins";
  options.cdi_dir = dir / "cdi";
  options.paths.sysfs_root = dir / "sys";
  options.paths.dev_root = dir / "dev";
  options.paths.proc_root = dir / "proc";
  return options;
}

// After the driver stopped: the kubelet has dropped it.
inline ::testing::AssertionResult Deregistered(const kubeletsim::dra::KubeletDraSim& kubelet) {
  if (kubelet.WaitFor([](const kubeletsim::dra::KubeletDraSim& k) { return k.Plugins().empty(); },
                      std::chrono::seconds(30))) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "the kubelet still lists the driver";
}

// The fake API server, and the driver's claim reader on it.
class ClaimApiTest : public kube::testing::KubeApiSimTest {
 protected:
  void SetUp() override {
    KubeApiSimTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    auto kubeconfig = api_->WriteKubeconfig(dir_.path() / "kubeconfig");
    ASSERT_TRUE(kubeconfig.ok()) << kubeconfig.status();
    kubeconfig_ = *kubeconfig;
    auto reader = kube::ConnectResourceClaimReader({.kubeconfig = kubeconfig_});
    ASSERT_TRUE(reader.ok()) << reader.status();
    reader_ = *std::move(reader);
  }

  ClaimGetter GetClaim() const {
    return [this](const std::string& ns, const std::string& name) {
      return reader_->Get(ns, name, std::chrono::seconds(20));
    };
  }

  std::filesystem::path kubeconfig_;
  std::unique_ptr<kube::ResourceClaimReader> reader_;
};

// An allocated ResourceClaim with these allocation results, for kube-api-sim's `claim <json>`.
inline nlohmann::json AllocatedClaim(const std::string& namespace_name, const std::string& name, const std::string& uid,
                                     nlohmann::json results, nlohmann::json annotations = nlohmann::json::object()) {
  return {{"metadata", {{"namespace", namespace_name}, {"name", name}, {"uid", uid}, {"annotations", annotations}}},
          {"spec", {{"devices", {{"requests", nlohmann::json::array()}}}}},
          {"status", {{"allocation", {{"devices", {{"results", std::move(results)}}}}}}}};
}

}  // namespace vfio_agent::dra::claimtest
