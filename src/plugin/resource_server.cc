#include "resource_server.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grpcpp/server_builder.h"
#include "spdlog/spdlog.h"

namespace vfio_agent::plugin::internal {
struct ListPayload {
  v1beta1::ListAndWatchResponse message;
  std::string bytes;  // for "never an identical repeat" per stream
};

namespace {

std::shared_ptr<const ListPayload> MakePayload(v1beta1::ListAndWatchResponse message) {
  auto payload = std::make_shared<ListPayload>();
  payload->message = std::move(message);
  payload->message.SerializeToString(&payload->bytes);
  return payload;
}

grpc::Status ToGrpc(const absl::Status& status) {
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

// True when something accepts connections on `path`: another live plugin instance owns it.
bool SomeoneListens(const std::filesystem::path& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  bool live = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return live;
}

}  // namespace

FileId StatFileId(const std::filesystem::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};
  return {st.st_dev, st.st_ino, static_cast<int64_t>(st.st_ctim.tv_sec) * 1'000'000'000 + st.st_ctim.tv_nsec};
}

v1beta1::DevicePluginOptions PluginOptions() {
  v1beta1::DevicePluginOptions options;
  options.set_pre_start_required(false);
  options.set_get_preferred_allocation_available(true);
  return options;
}

bool IsRegisterConfigError(const grpc::Status& status) {
  if (status.error_code() != grpc::StatusCode::UNKNOWN) return false;
  // The kubelet's errUnsupportedVersion and errInvalidResourceName (devicemanager/plugin/v1beta1/server.go).
  const std::string& message = status.error_message();
  const bool bad_version = absl::StartsWith(message, "requested API version ") &&
                           absl::StrContains(message, " is not supported by kubelet");
  const bool bad_name = absl::StartsWith(message, "the ResourceName ") && absl::EndsWith(message, " is invalid");
  return bad_version || bad_name;
}

v1beta1::ListAndWatchResponse ToListAndWatch(const ResourceDevices& devices) {
  v1beta1::ListAndWatchResponse response;
  for (const PluginDevice& device : devices.devices) {
    v1beta1::Device* out = response.add_devices();
    out->set_id(device.id);
    out->set_health(device.healthy ? kHealthy : kUnhealthy);
    if (device.numa_node) out->mutable_topology()->add_nodes()->set_id(*device.numa_node);
  }
  return response;
}

v1beta1::ContainerAllocateResponse ToProto(const ContainerAllocation& allocation) {
  v1beta1::ContainerAllocateResponse response;
  for (const auto& [key, value] : allocation.envs) (*response.mutable_envs())[key] = value;
  for (const DeviceNode& node : allocation.devices) {
    v1beta1::DeviceSpec* spec = response.add_devices();
    spec->set_container_path(node.container_path);
    spec->set_host_path(node.host_path);
    spec->set_permissions(node.permissions);
  }
  for (const std::string& name : allocation.cdi_devices) response.add_cdi_devices()->set_name(name);
  return response;
}

// One ListAndWatch stream. At most one write in flight; while it is, newer device lists replace each
// other (coalescing), and a list byte-identical to the last one sent is dropped.
class DeviceStream final : public grpc::ServerWriteReactor<v1beta1::ListAndWatchResponse> {
 public:
  DeviceStream(ResourceServer* owner, std::shared_ptr<const ListPayload> first) : owner_(owner) { Push(std::move(first)); }

  void Push(std::shared_ptr<const ListPayload> payload) {
    std::unique_lock lock(mu_);
    if (finishing_) return;
    pending_ = std::move(payload);
    Advance(lock);
  }

  // Ends the stream, after an empty device list when `deregister` (graceful shutdown, R7).
  void End(bool deregister) {
    std::unique_lock lock(mu_);
    if (finishing_) return;
    finishing_ = true;
    pending_ = deregister ? MakePayload({}) : nullptr;
    Advance(lock);
  }

  void OnWriteDone(bool ok) override {
    std::unique_lock lock(mu_);
    writing_ = false;
    in_flight_.reset();
    if (!ok) {
      finishing_ = true;
      pending_.reset();
    }
    Advance(lock);
  }

  void OnCancel() override {
    std::unique_lock lock(mu_);
    cancelled_ = true;
    finishing_ = true;
    pending_.reset();
    Advance(lock);
  }

  void OnDone() override {
    owner_->StreamDone(this);
    delete this;
  }

 private:
  // Starts the next write or the finish; the gRPC call happens after the lock is released.
  void Advance(std::unique_lock<std::mutex>& lock) {
    if (writing_ || finished_) return;
    if (pending_ && last_sent_ && pending_->bytes == last_sent_->bytes) pending_.reset();
    if (pending_) {
      writing_ = true;
      in_flight_ = last_sent_ = std::move(pending_);
      const v1beta1::ListAndWatchResponse* message = &in_flight_->message;
      lock.unlock();
      StartWrite(message);
      return;
    }
    if (finishing_) {
      finished_ = true;
      const bool cancelled = cancelled_;
      lock.unlock();
      Finish(cancelled ? grpc::Status::CANCELLED : grpc::Status::OK);
    }
  }

  ResourceServer* const owner_;
  std::mutex mu_;
  std::shared_ptr<const ListPayload> pending_, in_flight_, last_sent_;
  bool writing_ = false, finishing_ = false, finished_ = false, cancelled_ = false;
};

ResourceServer::ResourceServer(std::string resource_name, std::filesystem::path socket, bool cdi,
                               std::function<void()> on_stream_ended, AgentObserver* observer)
    : resource_name_(std::move(resource_name)),
      socket_(std::move(socket)),
      cdi_(cdi),
      on_stream_ended_(std::move(on_stream_ended)),
      observer_(observer) {}

ResourceServer::~ResourceServer() { Shutdown(false); }

absl::Status ResourceServer::Start(const ResourceDevices& devices, bool iommufd) {
  if (socket_.string().size() >= sizeof(sockaddr_un{}.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path too long for sun_path: ", socket_.string()));
  }
  if (SomeoneListens(socket_)) {
    return absl::AlreadyExistsError(absl::StrCat("another server answers on ", socket_.string()));
  }
  Update(devices, iommufd);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + socket_.string(), grpc::InsecureServerCredentials());
  builder.RegisterService(this);
  server_ = builder.BuildAndStart();
  if (!server_) return absl::UnavailableError(absl::StrCat("cannot serve on ", socket_.string()));
  socket_id_ = StatFileId(socket_);
  return absl::OkStatus();
}

std::shared_ptr<const ResourceServer::State> ResourceServer::state() const {
  std::lock_guard lock(mu_);
  return state_;
}

void ResourceServer::Update(const ResourceDevices& devices, bool iommufd) {
  auto next = std::make_shared<State>();
  next->devices = devices;
  next->iommufd = iommufd;
  auto payload = MakePayload(ToListAndWatch(devices));
  std::lock_guard lock(mu_);
  if (state_ && state_->devices == devices && state_->iommufd == iommufd) return;
  state_ = std::move(next);
  payload_ = payload;
  for (DeviceStream* stream : streams_) stream->Push(payload);
}

int ResourceServer::live_streams() const {
  std::lock_guard lock(mu_);
  return static_cast<int>(streams_.size());
}

void ResourceServer::StreamDone(DeviceStream* stream) {
  bool notify = false;
  {
    std::lock_guard lock(mu_);
    streams_.erase(stream);
    notify = !shutting_down_;
  }
  spdlog::info("{}: ListAndWatch stream ended{}", resource_name_, notify ? "" : " (shutdown)");
  if (notify && on_stream_ended_) on_stream_ended_();
}

void ResourceServer::Shutdown(bool deregister) {
  {
    std::lock_guard lock(mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
    for (DeviceStream* stream : streams_) stream->End(deregister);
  }
  if (!server_) return;
  // Streams finish on their own once the empty list is written; the deadline cancels a peer that stopped
  // reading. Shutdown returns only after every reactor's OnDone ran.
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(deregister ? 1000 : 100));
  server_.reset();
  // gRPC unlinks its socket at shutdown; remove it ourselves only if it is still the very file we bound.
  if (socket_id_.present() && StatFileId(socket_) == socket_id_) ::unlink(socket_.c_str());
}

grpc::ServerUnaryReactor* ResourceServer::GetDevicePluginOptions(grpc::CallbackServerContext* context,
                                                                 const v1beta1::Empty*,
                                                                 v1beta1::DevicePluginOptions* response) {
  *response = PluginOptions();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<v1beta1::ListAndWatchResponse>* ResourceServer::ListAndWatch(
    grpc::CallbackServerContext* context, const v1beta1::Empty*) {
  std::lock_guard lock(mu_);
  auto* stream = new DeviceStream(this, payload_);
  if (shutting_down_) {
    stream->End(false);
  } else {
    streams_.insert(stream);
  }
  spdlog::info("{}: ListAndWatch stream opened by {} ({} devices)", resource_name_, context->peer(),
               payload_->message.devices_size());
  return stream;
}

grpc::ServerUnaryReactor* ResourceServer::GetPreferredAllocation(grpc::CallbackServerContext* context,
                                                                 const v1beta1::PreferredAllocationRequest* request,
                                                                 v1beta1::PreferredAllocationResponse* response) {
  std::shared_ptr<const State> current = state();
  for (const v1beta1::ContainerPreferredAllocationRequest& container : request->container_requests()) {
    std::vector<std::string> available(container.available_deviceids().begin(), container.available_deviceids().end());
    std::vector<std::string> must(container.must_include_deviceids().begin(), container.must_include_deviceids().end());
    std::vector<std::string> chosen = PreferredAllocation(current->devices, available, must, container.allocation_size());
    spdlog::info("{}: preferred {} of [{}] must [{}] -> [{}]", resource_name_, container.allocation_size(),
                 absl::StrJoin(available, ","), absl::StrJoin(must, ","), absl::StrJoin(chosen, ","));
    auto* out = response->add_container_responses();
    for (std::string& id : chosen) out->add_deviceids(std::move(id));
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* ResourceServer::Allocate(grpc::CallbackServerContext* context,
                                                   const v1beta1::AllocateRequest* request,
                                                   v1beta1::AllocateResponse* response) {
  const auto start = std::chrono::steady_clock::now();
  auto observe = [&](bool ok) {
    if (observer_ != nullptr) observer_->OnAllocate(resource_name_, ok, std::chrono::steady_clock::now() - start);
  };
  std::shared_ptr<const State> current = state();
  const AllocateConfig config{.iommufd = current->iommufd, .cdi = cdi_};
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  for (const v1beta1::ContainerAllocateRequest& container : request->container_requests()) {
    std::vector<std::string> ids(container.devices_ids().begin(), container.devices_ids().end());
    absl::StatusOr<ContainerAllocation> allocation = AllocateContainer(current->devices, config, ids);
    if (!allocation.ok()) {
      spdlog::warn("{}: allocate [{}] rejected: {}", resource_name_, absl::StrJoin(ids, ","),
                   std::string(allocation.status().message()));
      reactor->Finish(ToGrpc(allocation.status()));
      observe(false);
      return reactor;
    }
    *response->add_container_responses() = ToProto(*allocation);
    spdlog::info("{}: allocate [{}]", resource_name_, absl::StrJoin(ids, ","));
  }
  reactor->Finish(grpc::Status::OK);
  observe(true);
  return reactor;
}

grpc::ServerUnaryReactor* ResourceServer::PreStartContainer(grpc::CallbackServerContext* context,
                                                            const v1beta1::PreStartContainerRequest*,
                                                            v1beta1::PreStartContainerResponse*) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace vfio_agent::plugin::internal
