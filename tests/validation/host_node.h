// A simulated node for the host-layer tests: a node file of tests/sim/nodes, patched in memory (one fault per
// failure mode), mounted by sysfs-sim, and the validator's host layers run against it.
#pragma once

#include <fstream>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sim_process.h"
#include "support/sysfs_tree.h"
#include "vfio_gpu_agent/validation/validate.h"

namespace vfio_agent::validation::testing {

namespace rpt = report::v1;
using Json = nlohmann::json;

inline Json& Device(Json& node, const std::string& bdf) {
  for (Json& device : node["devices"]) {
    if (device["bdf"] == bdf) return device;
  }
  throw std::runtime_error("no device " + bdf + " in the node file");
}

class HostNode {
 public:
  static absl::StatusOr<std::unique_ptr<HostNode>> Start(const std::string& node_file,
                                                         const std::function<void(Json&)>& patch = {}) {
    auto node = std::unique_ptr<HostNode>(new HostNode());
    std::ifstream in(sim::NodeFile(node_file));
    node->json = Json::parse(in);
    if (patch) patch(node->json);
    const std::filesystem::path file = node->dir_.path() / "node.json";
    std::ofstream(file) << node->json.dump(2);
    auto sim = sim::SimProcess::Start(file, node->dir_.path() / "root");
    if (!sim.ok()) return sim.status();
    node->sim = *std::move(sim);
    node->paths.sysfs_root = node->sim->sysfs_root();
    node->paths.dev_root = node->sim->dev_root();
    node->paths.proc_root = node->sim->proc_root();
    node->paths.kubelet_dir = node->dir_.path() / "kubelet";
    node->paths.pod_resources_socket = node->dir_.path() / "pod-resources.sock";
    return node;
  }

  // As an external actor binds them (no driver_override): every NVIDIA GPU, and the NVSwitches if asked.
  absl::Status BindNvidia(bool nvswitches) {
    for (const Json& device : json["devices"]) {
      const std::string cls = device["class"];
      const bool gpu = cls.rfind("0300", 0) == 0 || cls.rfind("0302", 0) == 0;
      if (device["vendor"] != "10de" || !(gpu || (nvswitches && cls.rfind("0680", 0) == 0))) continue;
      if (device.contains("physfn")) continue;
      if (auto status = sim->Control(absl::StrCat("set-driver ", std::string(device["bdf"]), " vfio-pci")); !status.ok()) {
        return status;
      }
    }
    return absl::OkStatus();
  }

  // Layers 1-2 through the public entry point, as `validate --layers platform,devices` runs them.
  rpt::ValidateReport Validate(bool nvswitches = false) const {
    ValidateOptions options;
    options.paths = paths;
    options.policy.include_nvswitches = nvswitches;
    options.layers = {Layer::kPlatform, Layer::kDevices};
    auto report = validation::Validate(options);
    if (!report.ok()) throw std::runtime_error(report.status().ToString());
    return *std::move(report);
  }

  HostNode(const HostNode&) = delete;
  HostNode& operator=(const HostNode&) = delete;

 private:
  HostNode() = default;
  // Declared first, so it is removed last: after the simulator has unmounted its tree from it. (Declared after
  // `sim`, every test left its directory behind, the mount point still busy at the removal.)
  vfio_agent::testing::TempDir dir_{"va-validate"};

 public:
  Json json;
  std::unique_ptr<sim::SimProcess> sim;
  HostPaths paths;
};

// "FAIL device.bars 0000:18:00.0" for every check that neither passed nor was skipped.
inline std::vector<std::string> Problems(const rpt::ValidateReport& report) {
  std::vector<std::string> out;
  for (const rpt::Check& check : report.checks()) {
    if (check.result() == rpt::FAIL || check.result() == rpt::WARN) {
      out.push_back(absl::StrCat(rpt::Result_Name(check.result()), " ", check.id(), " ", check.subject()));
    }
  }
  return out;
}

inline const rpt::Check* FindCheck(const rpt::ValidateReport& report, const std::string& id, const std::string& subject) {
  for (const rpt::Check& check : report.checks()) {
    if (check.id() == id && check.subject() == subject) return &check;
  }
  return nullptr;
}

// The simulated HGX node with eight H200 GPUs (tests/sim/sysfs_sim/nodes).
inline constexpr char kH200Node[] = "hgx-h200-8gpu.json";

inline const std::vector<std::string>& H200Gpus() {
  static const std::vector<std::string> gpus = {"0000:18:00.0", "0000:2a:00.0", "0000:3b:00.0", "0000:5d:00.0",
                                                "0000:9a:00.0", "0000:ab:00.0", "0000:bb:00.0", "0000:db:00.0"};
  return gpus;
}

// The H200 node with every GPU and NVSwitch bound to vfio, as the agent leaves it. Throws: a test that
// cannot start its node stops there (gtest reports the exception), rather than checking a half-built one.
inline std::unique_ptr<HostNode> BoundH200(const std::function<void(Json&)>& patch = {}) {
  auto node = HostNode::Start(kH200Node, patch);
  if (!node.ok()) throw std::runtime_error(node.status().ToString());
  if (auto status = (*node)->BindNvidia(/*nvswitches=*/true); !status.ok()) throw std::runtime_error(status.ToString());
  return *std::move(node);
}

}  // namespace vfio_agent::validation::testing
