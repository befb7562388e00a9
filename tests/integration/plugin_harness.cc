#include "plugin_harness.h"

#include <optional>
#include <thread>

#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace vfio_agent::plugin::testing {

absl::StatusOr<std::unique_ptr<Node>> Node::Create(const std::string& node_file) {
  std::unique_ptr<Node> node(new Node());
  absl::StatusOr<std::unique_ptr<sim::SimProcess>> sim =
      sim::SimProcess::Start(sim::NodeFile(node_file), node->dir_.path() / "node");
  if (!sim.ok()) return sim.status();
  node->sim_ = *std::move(sim);
  node->kubelet_dir_ = node->dir_.path() / "device-plugins";
  node->options.paths.sysfs_root = node->sim_->sysfs_root();
  node->options.paths.dev_root = node->sim_->dev_root();
  node->options.paths.kubelet_dir = node->kubelet_dir_;
  node->options.rescan_interval = std::chrono::milliseconds(50);
  node->options.udev = false;  // the host's uevents say nothing about the simulated node
  return node;
}

absl::Status Node::BindToVfio(const std::vector<std::string>& bdfs) {
  for (const std::string& bdf : bdfs) {
    if (absl::Status status = sim_->Control("set-driver " + bdf + " vfio-pci"); !status.ok()) return status;
  }
  return absl::OkStatus();
}

absl::Status Node::StartAgent() {
  agent_ = std::make_unique<Agent>(options);
  return agent_->Start();
}

absl::Status Node::StartKubelet(kubeletsim::Options overrides) {
  overrides.dir = kubelet_dir_;
  kubelet_ = std::make_unique<kubeletsim::KubeletSim>(overrides);
  return kubelet_->Start();
}

bool Node::WaitForCounts(const std::string& resource, int64_t capacity, int64_t allocatable,
                         std::chrono::milliseconds timeout) {
  return kubelet_->WaitFor(
      [&](const kubeletsim::KubeletSim& k) {
        auto resources = k.Resources();
        auto it = resources.find(resource);
        return it != resources.end() && it->second.registered && it->second.capacity == capacity &&
               it->second.allocatable == allocatable;
      },
      timeout);
}

std::unique_ptr<v1beta1::DevicePlugin::Stub> Node::DialPlugin(const std::string& resource) const {
  return v1beta1::DevicePlugin::NewStub(grpc::CreateChannel(
      "unix:" + (kubelet_dir_ / SocketName(resource)).string(), grpc::InsecureChannelCredentials()));
}

bool WaitUntil(const std::function<bool()>& condition, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!condition()) {
    if (std::chrono::steady_clock::now() >= deadline) return condition();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

std::chrono::milliseconds RegisterDelay(const kubeletsim::KubeletSim& kubelet, const std::string& resource) {
  std::optional<std::chrono::steady_clock::time_point> listen, registered;
  for (const kubeletsim::Event& e : kubelet.Events()) {
    if (e.kind == "listen" && e.detail == kubelet.kubelet_socket().string()) {
      listen = e.at;
      registered.reset();
    }
    if (e.kind == "register" && e.resource == resource && listen && !registered) registered = e.at;
  }
  if (!listen || !registered) return std::chrono::milliseconds::max();
  return std::chrono::duration_cast<std::chrono::milliseconds>(*registered - *listen);
}

}  // namespace vfio_agent::plugin::testing
