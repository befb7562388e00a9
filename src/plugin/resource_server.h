// One gRPC DevicePlugin server on one unix socket, for one resource name. gRPC's async API on the server's
// own completion queue, drained by one thread that blocks without a deadline: an idle server never wakes.
// (gRPC 1.51's callback API polls from two shared threads with a 1 s deadline, about 3 ms of CPU per 20 s.)
// A stream never holds a thread and shutdown never waits on a blocked writer.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "grpcpp/server.h"
#include "vfio_gpu_agent/fabric/partition_manager.h"
#include "vfio_gpu_agent/plugin/agent.h"
#include "vfio_gpu_agent/plugin/allocate.h"
#include "vfio_gpu_agent/plugin/devices.h"

namespace vfio_agent::plugin::internal {

// Identity of a file, robust to inode-number reuse: a re-created file differs at least in ctime.
struct FileId {
  dev_t dev = 0;
  ino_t ino = 0;
  int64_t ctime_ns = 0;
  bool operator==(const FileId&) const = default;
  bool present() const { return ino != 0; }
};
FileId StatFileId(const std::filesystem::path& path);  // {} when absent

// The options sent both in Register and in GetDevicePluginOptions (R5).
v1beta1::DevicePluginOptions PluginOptions();

// A failed Register that retrying cannot fix until the operator acts: the kubelet refused the API version
// or the resource name. The kubelet answers UNKNOWN for every failure, a dial-back that timed out
// ("failed to dial device plugin: context deadline exceeded") included, so only its message tells them apart.
bool IsRegisterConfigError(const grpc::Status& status);

v1beta1::ListAndWatchResponse ToListAndWatch(const ResourceDevices& devices);
v1beta1::ContainerAllocateResponse ToProto(const ContainerAllocation& allocation);

class DeviceStream;
struct ListPayload;
template <typename Request, typename Response>
class UnaryCall;

class ResourceServer final {
 public:
  // `on_stream_ended` runs on a gRPC thread when a ListAndWatch stream ends other than by Shutdown; it must
  // not block.
  // `fabric` (not owned; null without --fabric-manager): Preferred hands out partitions, Allocate activates one.
  ResourceServer(std::string resource_name, std::filesystem::path socket, bool cdi,
                 std::function<void()> on_stream_ended, AgentObserver* observer = nullptr,
                 fabric::PartitionManager* fabric = nullptr);
  ~ResourceServer();  // Shutdown(false)

  // Binds (refusing a socket another live server answers on) and serves `devices`.
  // `node_set` and `host_iommufd`: what Allocate hands out (AllocateConfig).
  absl::Status Start(const ResourceDevices& devices, pci::VfioNodeSet node_set, bool host_iommufd);
  // New device set (or node set): sent at once to every open stream, unless identical to what that stream last got.
  void Update(const ResourceDevices& devices, pci::VfioNodeSet node_set, bool host_iommufd);
  // Ends every stream (after an empty device list when `deregister`), stops the server and releases the
  // socket path (gRPC unlinks it). Idempotent. `deregister_grace`: how long a stream is given to take the empty
  // list before the server cancels it (a kubelet that stopped reading must not hold the agent's exit).
  static constexpr std::chrono::milliseconds kDeregisterGrace{1000};
  void Shutdown(bool deregister, std::chrono::milliseconds deregister_grace = kDeregisterGrace);

  const FileId& socket_id() const { return socket_id_; }
  // The kubelet's ListAndWatch streams; a probe's (kProbeMetadata) are apart.
  int live_streams() const;
  int streams_opened() const;  // since Start, ended ones included
  int live_probes() const;

 private:
  friend class DeviceStream;
  template <typename Request, typename Response>
  friend class UnaryCall;
  struct State {
    ResourceDevices devices;
    pci::VfioNodeSet node_set = pci::VfioNodeSet::kLegacy;
    bool host_iommufd = false;
  };
  std::shared_ptr<const State> state() const;

  // The unary handlers, on the completion-queue thread.
  grpc::Status GetDevicePluginOptions(const v1beta1::Empty& request, v1beta1::DevicePluginOptions* response);
  grpc::Status GetPreferredAllocation(const v1beta1::PreferredAllocationRequest& request,
                                      v1beta1::PreferredAllocationResponse* response);
  grpc::Status Allocate(const v1beta1::AllocateRequest& request, v1beta1::AllocateResponse* response);
  grpc::Status PreStartContainer(const v1beta1::PreStartContainerRequest& request,
                                 v1beta1::PreStartContainerResponse* response);

  // Every call object (a request waiting for a call, or a call in progress) is counted from construction to
  // destruction, so Shutdown can shut the queue down only once none can start another operation on it.
  void AwaitAll();  // one request waiting for each method
  void AwaitStreamLocked();
  bool Admit();      // false once shutting down; else counts one more call object
  void AdmitLocked();
  void Retire();     // a call object is gone
  void StreamStarted(DeviceStream* stream, const std::string& peer, bool probe);
  void StreamDone(DeviceStream* stream);

  const std::string resource_name_;
  const std::filesystem::path socket_;
  const bool cdi_;
  const std::function<void()> on_stream_ended_;
  AgentObserver* const observer_;
  fabric::PartitionManager* const fabric_;
  v1beta1::DevicePlugin::AsyncService service_;
  std::unique_ptr<grpc::ServerCompletionQueue> cq_;
  std::unique_ptr<grpc::Server> server_;
  std::thread cq_thread_;
  FileId socket_id_;

  mutable std::mutex mu_;
  std::shared_ptr<const State> state_;
  std::shared_ptr<const ListPayload> payload_;  // state_'s device list, serialized once
  std::set<DeviceStream*> streams_;  // probes' included: every open stream gets each new list
  std::set<DeviceStream*> probes_;
  int streams_opened_ = 0;
  int call_objects_ = 0;
  std::condition_variable call_objects_cv_;
  bool shutting_down_ = false;
};

}  // namespace vfio_agent::plugin::internal
