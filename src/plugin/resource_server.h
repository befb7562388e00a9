// One gRPC DevicePlugin server on one unix socket, for one resource name. Callback API throughout, so a
// stream never holds a thread and shutdown never waits on a blocked writer.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "grpcpp/server.h"
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

class ResourceServer final : public v1beta1::DevicePlugin::CallbackService {
 public:
  // `on_stream_ended` runs on a gRPC thread when a ListAndWatch stream ends other than by Shutdown; it must
  // not block.
  ResourceServer(std::string resource_name, std::filesystem::path socket, bool cdi,
                 std::function<void()> on_stream_ended, AgentObserver* observer = nullptr);
  ~ResourceServer() override;  // Shutdown(false)

  // Binds (refusing a socket another live server answers on) and serves `devices`.
  absl::Status Start(const ResourceDevices& devices, bool iommufd);
  // New device set: sent at once to every open stream, unless identical to what that stream last got.
  void Update(const ResourceDevices& devices, bool iommufd);
  // Ends every stream (after an empty device list when `deregister`), stops the server and releases the
  // socket path (gRPC unlinks it). Idempotent.
  void Shutdown(bool deregister);

  const FileId& socket_id() const { return socket_id_; }
  int live_streams() const;

  grpc::ServerUnaryReactor* GetDevicePluginOptions(grpc::CallbackServerContext* context, const v1beta1::Empty* request,
                                                   v1beta1::DevicePluginOptions* response) override;
  grpc::ServerWriteReactor<v1beta1::ListAndWatchResponse>* ListAndWatch(grpc::CallbackServerContext* context,
                                                                        const v1beta1::Empty* request) override;
  grpc::ServerUnaryReactor* GetPreferredAllocation(grpc::CallbackServerContext* context,
                                                   const v1beta1::PreferredAllocationRequest* request,
                                                   v1beta1::PreferredAllocationResponse* response) override;
  grpc::ServerUnaryReactor* Allocate(grpc::CallbackServerContext* context, const v1beta1::AllocateRequest* request,
                                     v1beta1::AllocateResponse* response) override;
  grpc::ServerUnaryReactor* PreStartContainer(grpc::CallbackServerContext* context,
                                              const v1beta1::PreStartContainerRequest* request,
                                              v1beta1::PreStartContainerResponse* response) override;

 private:
  friend class DeviceStream;
  struct State {
    ResourceDevices devices;
    bool iommufd = false;
  };
  std::shared_ptr<const State> state() const;
  void StreamDone(DeviceStream* stream);

  const std::string resource_name_;
  const std::filesystem::path socket_;
  const bool cdi_;
  const std::function<void()> on_stream_ended_;
  AgentObserver* const observer_;
  std::unique_ptr<grpc::Server> server_;
  FileId socket_id_;

  mutable std::mutex mu_;
  std::shared_ptr<const State> state_;
  std::shared_ptr<const ListPayload> payload_;  // state_'s device list, serialized once
  std::set<DeviceStream*> streams_;
  bool shutting_down_ = false;
};

}  // namespace vfio_agent::plugin::internal
