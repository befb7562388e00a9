// Private state of KubeletSim, shared by its source files.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "kubelet_sim.h"
#include "podresources/v1/api.grpc.pb.h"

namespace vfio_agent::kubeletsim {

using Clock = std::chrono::steady_clock;

// gRPC deadlines take system_clock time points only.
inline std::chrono::system_clock::time_point GrpcDeadline(std::chrono::nanoseconds from_now) {
  return std::chrono::system_clock::now() + from_now;
}

// One dialled plugin instance: the kubelet's "client" for a registration.
struct PluginClient {
  uint64_t id = 0;
  std::string resource;
  std::filesystem::path socket;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<::v1beta1::DevicePlugin::Stub> stub;
  ::v1beta1::DevicePluginOptions options;
  grpc::ClientContext stream_ctx;  // ListAndWatch; TryCancel() is how the kubelet side hangs up
  std::thread stream_thread;
  // Previous ListAndWatch message, serialized, for identical-repeat detection.
  std::optional<std::string> last_message;
};

struct ResourceEntry {
  std::shared_ptr<PluginClient> client;  // current registration; null = stopped endpoint
  std::set<std::string> healthy, unhealthy;
  std::map<std::string, std::vector<int64_t>> topology;
  std::optional<Clock::time_point> stop_time;  // grace clock (Options::clock), set when the endpoint stops
  bool removed = false;
  bool frozen = false;  // FreezeUpdates: messages are not applied
  bool drop_next_registration = false;  // DropNextRegistration: armed
  int registrations = 0, list_updates = 0, identical_repeats = 0, duplicate_ids = 0;
  std::string endpoint;
  ::v1beta1::DevicePluginOptions options;
};

class KubeletSim::Impl {
 public:
  explicit Impl(Options options);

  absl::Status Start();
  absl::Status Restart();
  void Stop();
  absl::Status CloseStream(const std::string& resource);
  absl::Status FreezeUpdates(const std::string& resource, bool frozen);
  void DropNextRegistration(const std::string& resource);
  std::map<std::string, ResourceState> Resources() const;
  std::vector<Event> Events() const;
  absl::StatusOr<AdmittedPod> Admit(const PodSpec& pod);
  void Release(const std::string& pod_name);
  std::string DescribeNode() const;
  std::vector<AdmittedPod> Pods() const;
  std::filesystem::path kubelet_socket() const { return options_.dir / "kubelet.sock"; }

  grpc::Status HandleRegister(const ::v1beta1::RegisterRequest& request);
  // Pod-resources answers (pod_resources.cc).
  void FillList(::v1::ListPodResourcesResponse* out) const;
  void FillAllocatable(::v1::AllocatableResourcesResponse* out) const;
  grpc::Status FillGet(const ::v1::GetPodResourcesRequest& request, ::v1::GetPodResourcesResponse* out) const;

 private:
  class RegistrationService;
  static std::unique_ptr<grpc::Service> MakePodResourcesService(const Impl* impl);  // pod_resources.cc

  Clock::time_point GraceNow() const { return options_.clock ? options_.clock() : Clock::now(); }
  void RecordLocked(std::string kind, std::string resource, std::string detail) const;
  void Record(std::string kind, std::string resource, std::string detail) const;
  void ExpireGraceLocked() const;
  absl::Status StartLocked();
  void ShutdownLocked();  // everything but the resource table
  absl::Status DeleteSockets();
  absl::StatusOr<std::shared_ptr<PluginClient>> Connect(const ::v1beta1::RegisterRequest& request);
  void Activate(std::shared_ptr<PluginClient> client);
  void StreamLoop(std::shared_ptr<PluginClient> client);
  void OnList(PluginClient& client, const ::v1beta1::ListAndWatchResponse& message);
  void OnStreamEnd(const std::shared_ptr<PluginClient>& client, const grpc::Status& status);
  void DisconnectLocked(const std::string& resource, ResourceEntry& entry);
  void AppendDevices(const std::string& resource, const std::vector<std::string>& ids,
                     const std::map<std::string, std::vector<int64_t>>& topology,
                     google::protobuf::RepeatedPtrField<::v1::ContainerDevices>* out) const;
  // Admission helpers (admission.cc).
  absl::StatusOr<std::vector<std::string>> DevicesToAllocate(const std::string& resource, int64_t count,
                                                             AdmittedPod& pod);
  absl::StatusOr<std::vector<std::string>> CallPreferred(const std::shared_ptr<PluginClient>& client,
                                                         const std::string& resource,
                                                         const std::vector<std::string>& available,
                                                         const std::vector<std::string>& must_include,
                                                         int64_t size, AdmittedPod& pod);
  absl::Status AllocateResource(const std::string& resource, int64_t count, AdmittedPod& pod);

  const Options options_;
  std::mutex lifecycle_mu_;  // Start/Restart/Stop, one at a time
  std::mutex admit_mu_;      // one pod admission at a time, as the kubelet does
  std::atomic<bool> stopping_{false};
  std::unique_ptr<RegistrationService> registration_service_;
  std::unique_ptr<grpc::Service> pod_resources_service_;
  std::unique_ptr<grpc::Server> server_, pod_resources_server_;

  mutable std::mutex mu_;  // everything below
  mutable std::map<std::string, ResourceEntry> resources_;
  mutable std::vector<Event> events_;
  std::vector<std::shared_ptr<PluginClient>> clients_;  // every client of this run, joined on stop
  std::vector<std::thread> connect_threads_;            // legacy mode's async dials
  std::set<grpc::ClientContext*> inflight_;             // unary calls to cancel on stop
  std::map<std::string, AdmittedPod> pods_;
  std::map<std::string, std::set<std::string>> allocated_;
  uint64_t next_client_id_ = 1;
  std::mt19937_64 rng_;
};

// Formats a gRPC status the way grpc-go prints an error: "rpc error: code = X desc = Y".
std::string GoRpcError(const grpc::Status& status);

}  // namespace vfio_agent::kubeletsim
