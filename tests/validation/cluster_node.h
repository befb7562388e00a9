// Test fixture for the cluster layers (plugin, kubelet): the simulated 8x H200 node under sysfs-sim, the kubelet
// simulator with its pod-resources server, the real agent in process, and a scripted device plugin for the
// other plugins a node can carry (the GPU Operator's, KubeVirt's own).
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "kubelet_sim.h"
#include "sim_process.h"
#include "support/sysfs_tree.h"
#include "vfio_gpu_agent/pci/inventory.h"
#include "vfio_gpu_agent/pci/selection.h"
#include "vfio_gpu_agent/plugin/agent.h"
#include "vfio_gpu_agent/node/snapshot.h"
#include "vfio_gpu_agent/validation/check.h"

namespace vfio_agent::validation::testing {

using namespace std::chrono_literals;

inline constexpr char kH200[] = "nvidia.com/GH100_H200_SXM_141GB";
// A wait the agent, its plugin and the kubelet are expected to meet: generous, so a loaded machine meets it too.
inline constexpr std::chrono::milliseconds kWait{5000};
inline const std::vector<std::string> kH200Gpus = {"0000:18:00.0", "0000:2a:00.0", "0000:3b:00.0", "0000:5d:00.0",
                                                   "0000:9a:00.0", "0000:ab:00.0", "0000:bb:00.0", "0000:db:00.0"};

// The first check with this id (and subject, when given), or null.
inline const Check* FindCheck(const std::vector<Check>& checks, const std::string& id, const std::string& subject = "") {
  for (const Check& check : checks) {
    if (check.id == id && (subject.empty() || check.subject == subject)) return &check;
  }
  return nullptr;
}

inline std::string EvidenceText(const Check& check) {
  std::string text;
  for (const Evidence& e : check.evidence) text += e.source + " = " + e.value + "\n";
  return text;
}

// A device plugin serving a fixed list (none at all when `ids` is nullopt: a plugin whose ListAndWatch hangs):
// another vendor's plugin as the validator finds it next to ours.
class ScriptedPlugin final : public ::v1beta1::DevicePlugin::Service {
 public:
  ScriptedPlugin(std::filesystem::path socket, std::vector<std::string> healthy_ids)
      : socket_(std::move(socket)), ids_(std::move(healthy_ids)) {}
  ScriptedPlugin(std::filesystem::path socket, std::nullopt_t) : socket_(std::move(socket)) {}
  ~ScriptedPlugin() override { Stop(); }

  absl::Status Start() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + socket_.string(), grpc::InsecureServerCredentials());
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
    return server_ ? absl::OkStatus() : absl::UnavailableError("listen on " + socket_.string());
  }
  void Stop() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (server_) {
      server_->Shutdown(std::chrono::system_clock::now() + 1s);
      server_->Wait();
      server_.reset();
    }
  }

  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const ::v1beta1::Empty*,
                                      ::v1beta1::DevicePluginOptions*) override {
    return grpc::Status::OK;
  }
  // One list, then nothing until the stream is cancelled or the plugin stops.
  grpc::Status ListAndWatch(grpc::ServerContext* ctx, const ::v1beta1::Empty*,
                            grpc::ServerWriter<::v1beta1::ListAndWatchResponse>* writer) override {
    {
      std::lock_guard lock(mu_);
      auto probe = ctx->client_metadata().find(plugin::kProbeMetadata);
      probes_.emplace_back(probe == ctx->client_metadata().end() ? "(none)"
                                                                 : std::string(probe->second.data(), probe->second.size()));
    }
    if (ids_) {
      ::v1beta1::ListAndWatchResponse message;
      for (const auto& id : *ids_) {
        auto* device = message.add_devices();
        device->set_id(id);
        device->set_health(plugin::kHealthy);
      }
      if (!writer->Write(message)) return grpc::Status::OK;
    }
    std::unique_lock lock(mu_);
    while (!stop_ && !ctx->IsCancelled()) cv_.wait_for(lock, 20ms);
    return grpc::Status::OK;
  }
  // Per ListAndWatch call, its plugin::kProbeMetadata value or "(none)".
  std::vector<std::string> probes() {
    std::lock_guard lock(mu_);
    return probes_;
  }
  grpc::Status Allocate(grpc::ServerContext*, const ::v1beta1::AllocateRequest* request,
                        ::v1beta1::AllocateResponse* out) override {
    for (int i = 0; i < request->container_requests_size(); ++i) out->add_container_responses();
    return grpc::Status::OK;
  }

 private:
  std::filesystem::path socket_;
  std::optional<std::vector<std::string>> ids_;
  std::unique_ptr<grpc::Server> server_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<std::string> probes_;
};

inline absl::Status RegisterWithKubelet(const std::filesystem::path& kubelet_sock, const std::string& endpoint,
                                        const std::string& resource) {
  auto stub = ::v1beta1::Registration::NewStub(
      grpc::CreateChannel("unix:" + kubelet_sock.string(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 15s);
  ::v1beta1::RegisterRequest request;
  request.set_version("v1beta1");
  request.set_endpoint(endpoint);
  request.set_resource_name(resource);
  ::v1beta1::Empty empty;
  grpc::Status status = stub->Register(&ctx, request, &empty);
  return status.ok() ? absl::OkStatus() : absl::UnavailableError(status.error_message());
}

class ClusterNode {
 public:
  static absl::StatusOr<std::unique_ptr<ClusterNode>> Create(const std::string& node_file = "hgx-h200-8gpu.json") {
    std::unique_ptr<ClusterNode> node(new ClusterNode());
    auto sim = sim::SimProcess::Start(sim::NodeFile(node_file), node->dir_.path() / "node");
    if (!sim.ok()) return sim.status();
    node->sim_ = *std::move(sim);
    node->paths.sysfs_root = node->sim_->sysfs_root();
    node->paths.dev_root = node->sim_->dev_root();
    node->paths.kubelet_dir = node->dir_.path() / "device-plugins";
    node->paths.pod_resources_socket = node->dir_.path() / "pod-resources" / "kubelet.sock";
    std::filesystem::create_directories(node->paths.kubelet_dir);
    return node;
  }

  absl::Status Control(const std::string& command) { return sim_->Control(command); }
  absl::Status BindToVfio(const std::vector<std::string>& bdfs) {
    for (const std::string& bdf : bdfs) {
      if (absl::Status status = Control("set-driver " + bdf + " vfio-pci"); !status.ok()) return status;
    }
    return absl::OkStatus();
  }
  absl::Status StartKubelet() {
    kubeletsim::Options options;
    options.dir = paths.kubelet_dir;
    options.pod_resources_socket = paths.pod_resources_socket;
    kubelet_ = std::make_unique<kubeletsim::KubeletSim>(options);
    return kubelet_->Start();
  }
  absl::Status StartAgent(Workload workload = Workload::kVmPassthrough) {
    plugin::ServeOptions options;
    options.paths = paths;
    options.workload = workload;
    options.rescan_interval = 50ms;
    options.udev = false;  // the host's uevents say nothing about the simulated node
    agent_ = std::make_unique<plugin::Agent>(options);
    return agent_->Start();
  }
  kubeletsim::KubeletSim& kubelet() { return *kubelet_; }
  plugin::Agent& agent() { return *agent_; }

  // Waits until the kubelet holds `resource` registered with exactly these counts.
  bool WaitForKubelet(const std::string& resource, int64_t capacity, int64_t allocatable) {
    return kubelet_->WaitFor(
        [&](const kubeletsim::KubeletSim& k) {
          auto resources = k.Resources();
          auto it = resources.find(resource);
          return it != resources.end() && it->second.registered && it->second.capacity == capacity &&
                 it->second.allocatable == allocatable;
        },
        10s);
  }

  // Scans the node now and builds what the runner hands to the layers: the node's model and what it serves of it,
  // `whole` as node::ServedOf takes it (kEverySelected: as the serving agent, which advertised every GPU once, so an
  // unbound GPU shows as unhealthy instead of vanishing; kOnVfio: as `validate`).
  const NodeView& View(node::WholeDevices whole = node::WholeDevices::kOnVfio) {
    auto inventory = pci::Scan(paths.sysfs_root, {.detail_vendor = pci::kVendorNvidia});
    inventory_ = std::make_unique<pci::Inventory>(*std::move(inventory));
    selection_ = std::make_unique<pci::Selection>(pci::Select(*inventory_, pci::SelectionPolicy{}));
    model_ = std::make_unique<node::Snapshot>(node::Build(paths, *inventory_, *selection_, resolver, nullptr));
    served_ = std::make_unique<node::ServedDevices>(node::ServedOf(*model_, whole));
    view_ = NodeView{.paths = paths, .inventory = inventory_.get(), .selection = selection_.get(),
                     .model = model_.get(), .served = served_.get()};
    return view_;
  }

  std::filesystem::path PluginSocket(const std::string& file) const { return paths.kubelet_dir / file; }

  HostPaths paths;
  names::NameResolver resolver{nullptr, "nvidia.com", {}};

 private:
  ClusterNode() = default;
  vfio_agent::testing::TempDir dir_{"va-cluster"};
  std::unique_ptr<sim::SimProcess> sim_;
  std::unique_ptr<kubeletsim::KubeletSim> kubelet_;
  std::unique_ptr<plugin::Agent> agent_;
  std::unique_ptr<pci::Inventory> inventory_;
  std::unique_ptr<pci::Selection> selection_;
  std::unique_ptr<node::Snapshot> model_;
  std::unique_ptr<node::ServedDevices> served_;
  NodeView view_;
};

// A fresh simulated 8x H200 node per test; Serve() brings it to the state most cluster checks start from.
class ClusterNodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto node = ClusterNode::Create();
    ASSERT_TRUE(node.ok()) << node.status();
    node_ = *std::move(node);
  }
  // Every GPU bound, the kubelet up and the agent registered with all 8 healthy.
  void Serve() {
    ASSERT_TRUE(node_->BindToVfio(kH200Gpus).ok());
    ASSERT_TRUE(node_->StartKubelet().ok());
    ASSERT_TRUE(node_->StartAgent().ok());
    ASSERT_TRUE(node_->WaitForKubelet(kH200, 8, 8)) << node_->kubelet().DescribeNode();
  }
  std::unique_ptr<ClusterNode> node_;
};

}  // namespace vfio_agent::validation::testing
