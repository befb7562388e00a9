// One simulated node for plugin tests and benchmarks: sysfs-sim on a node file, the kubelet simulator on a
// private device-plugins directory, and an Agent wired to both.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "kubelet_sim.h"
#include "sim_process.h"
#include "support/sysfs_tree.h"
#include "vfio_gpu_agent/plugin/agent.h"

namespace vfio_agent::plugin::testing {

// How long a test waits for something it expects to happen: generous, so that a loaded machine (a parallel
// ctest, stress-ng) slows the test down rather than failing it.
inline constexpr std::chrono::seconds kPatience{30};

// Polls `condition` until it holds or `timeout` passes; returns its last value.
bool WaitUntil(const std::function<bool()>& condition, std::chrono::milliseconds timeout = kPatience);

inline constexpr char kH200[] = "nvidia.com/GH100_H200_SXM_141GB";
inline const std::vector<std::string> kH200Gpus = {"0000:18:00.0", "0000:2a:00.0", "0000:3b:00.0", "0000:5d:00.0",
                                                   "0000:9a:00.0", "0000:ab:00.0", "0000:bb:00.0", "0000:db:00.0"};

class Node {
 public:
  // Starts sysfs-sim on tests/sim/nodes/<node_file>; the kubelet and the agent are started by the test.
  static absl::StatusOr<std::unique_ptr<Node>> Create(const std::string& node_file);

  absl::Status Control(const std::string& command) { return sim_->Control(command); }
  std::vector<std::string> SimLog() const { return sim_->Log(); }
  absl::Status BindToVfio(const std::vector<std::string>& bdfs);

  ServeOptions options;  // filled for the simulated node; adjust before StartAgent
  absl::Status StartAgent();
  absl::Status StartKubelet(kubeletsim::Options overrides = {});

  kubeletsim::KubeletSim& kubelet() { return *kubelet_; }
  Agent& agent() { return *agent_; }
  void StopAgent() { agent_->Stop(); }
  const std::filesystem::path& kubelet_dir() const { return kubelet_dir_; }

  // Waits until the kubelet sees `resource` registered with exactly these counts. The limit only ends a
  // test that is failing anyway; it is never what the test measures.
  bool WaitForCounts(const std::string& resource, int64_t capacity, int64_t allocatable,
                     std::chrono::milliseconds timeout = kPatience);

  // A direct client of the plugin's socket, as the kubelet dials it.
  std::unique_ptr<v1beta1::DevicePlugin::Stub> DialPlugin(const std::string& resource) const;

 private:
  Node() = default;
  vfio_agent::testing::TempDir dir_{"va-plugin-it"};
  std::filesystem::path kubelet_dir_;
  std::unique_ptr<sim::SimProcess> sim_;
  std::unique_ptr<kubeletsim::KubeletSim> kubelet_;
  std::unique_ptr<Agent> agent_;
};

// Time from the kubelet's last "listen" on kubelet.sock to the first Register of `resource` after it
// (milliseconds::max() when there is none).
std::chrono::milliseconds RegisterDelay(const kubeletsim::KubeletSim& kubelet, const std::string& resource);

}  // namespace vfio_agent::plugin::testing
