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
#include "vfio_gpu_agent/common/thread_name.h"
#include "vfio_gpu_agent/common/unix_socket.h"

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

// What a tag given to cq_ stands for: the handler of that one operation's completion.
class CqEvent {
 public:
  explicit CqEvent(std::function<void(bool ok)> on_done) : on_done_(std::move(on_done)) {}
  void Done(bool ok) { on_done_(ok); }

 private:
  const std::function<void(bool ok)> on_done_;
};

namespace {
void DrainQueue(grpc::CompletionQueue& cq) {
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) static_cast<CqEvent*>(tag)->Done(ok);
}
}  // namespace

// One unary method: waits for a call, answers it with the owner's handler, deletes itself. A new one waits
// as soon as a call arrives.
template <typename Request, typename Response>
class UnaryCall final {
 public:
  using RequestMethod = void (v1beta1::DevicePlugin::AsyncService::*)(
      grpc::ServerContext*, Request*, grpc::ServerAsyncResponseWriter<Response>*, grpc::CompletionQueue*,
      grpc::ServerCompletionQueue*, void*);
  using Handler = grpc::Status (ResourceServer::*)(const Request&, Response*);

  // The caller has admitted this call object (ResourceServer::Admit).
  static void Await(ResourceServer* owner, RequestMethod request, Handler handler) {
    auto* call = new UnaryCall(owner, request, handler);
    (owner->service_.*request)(&call->context_, &call->request_, &call->responder_, owner->cq_.get(),
                               owner->cq_.get(), &call->started_);
  }

 private:
  UnaryCall(ResourceServer* owner, RequestMethod request, Handler handler)
      : owner_(owner), request_method_(request), handler_(handler) {}

  void OnStarted(bool ok) {
    if (!ok) return Destroy();  // shutting down
    if (owner_->Admit()) Await(owner_, request_method_, handler_);
    Response response;
    const grpc::Status status = (owner_->*handler_)(request_, &response);
    if (status.ok()) {
      responder_.Finish(response, status, &finished_);
    } else {
      responder_.FinishWithError(status, &finished_);
    }
  }

  void Destroy() {
    ResourceServer* owner = owner_;
    delete this;
    owner->Retire();
  }

  ResourceServer* const owner_;
  const RequestMethod request_method_;
  const Handler handler_;
  grpc::ServerContext context_;
  Request request_;
  grpc::ServerAsyncResponseWriter<Response> responder_{&context_};
  CqEvent started_{[this](bool ok) { OnStarted(ok); }};
  CqEvent finished_{[this](bool) { Destroy(); }};
};

// One ListAndWatch stream. At most one write in flight; while it is, newer device lists replace each
// other (coalescing), and a list byte-identical to the last one sent is dropped. Deleted once gRPC has
// reported the call done and none of its operations is still pending.
class DeviceStream final {
 public:
  // The caller has admitted this call object.
  explicit DeviceStream(ResourceServer* owner) : owner_(owner) {
    context_.AsyncNotifyWhenDone(&done_);  // delivered only if a call arrives
    owner_->service_.RequestListAndWatch(&context_, &request_, &writer_, owner_->cq_.get(), owner_->cq_.get(),
                                         &started_);
  }

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

 private:
  void OnStarted(bool ok) {
    if (!ok) {  // shutting down; the done event never comes for a call that never arrived
      ResourceServer* owner = owner_;
      delete this;
      owner->Retire();
      return;
    }
    owner_->StreamStarted(this, context_.peer(), context_.client_metadata().count(kProbeMetadata) > 0);
  }

  void OnWriteDone(bool ok) {
    std::unique_lock lock(mu_);
    writing_ = false;
    in_flight_.reset();
    if (!ok) {
      finishing_ = true;
      pending_.reset();
    }
    Advance(lock);
    MaybeDestroy(lock);
  }

  void OnFinishDone() {
    std::unique_lock lock(mu_);
    finish_done_ = true;
    MaybeDestroy(lock);
  }

  void OnDone() {
    std::unique_lock lock(mu_);
    call_done_ = true;
    if (context_.IsCancelled()) {
      cancelled_ = true;
      finishing_ = true;
      pending_.reset();
    }
    Advance(lock);
    MaybeDestroy(lock);
  }

  // Starts the next write or the finish; the gRPC call happens after the lock is released.
  void Advance(std::unique_lock<std::mutex>& lock) {
    if (writing_ || finish_started_) return;
    if (pending_ && last_sent_ && pending_->bytes == last_sent_->bytes) pending_.reset();
    if (pending_) {
      writing_ = true;
      in_flight_ = last_sent_ = std::move(pending_);
      const v1beta1::ListAndWatchResponse* message = &in_flight_->message;
      lock.unlock();
      writer_.Write(*message, &wrote_);
      lock.lock();
      return;
    }
    if (finishing_ && !cancelled_) {  // a cancelled call needs no status
      finish_started_ = true;
      lock.unlock();
      writer_.Finish(grpc::Status::OK, &finished_);
      lock.lock();
    }
  }

  void MaybeDestroy(std::unique_lock<std::mutex>& lock) {
    if (!call_done_ || writing_ || (finish_started_ && !finish_done_)) return;
    lock.unlock();
    ResourceServer* owner = owner_;
    owner->StreamDone(this);
    delete this;
    owner->Retire();
  }

  ResourceServer* const owner_;
  grpc::ServerContext context_;
  v1beta1::Empty request_;
  grpc::ServerAsyncWriter<v1beta1::ListAndWatchResponse> writer_{&context_};
  CqEvent started_{[this](bool ok) { OnStarted(ok); }};
  CqEvent wrote_{[this](bool ok) { OnWriteDone(ok); }};
  CqEvent finished_{[this](bool) { OnFinishDone(); }};
  CqEvent done_{[this](bool) { OnDone(); }};
  std::mutex mu_;
  std::shared_ptr<const ListPayload> pending_, in_flight_, last_sent_;
  bool writing_ = false, finishing_ = false, finish_started_ = false, finish_done_ = false;
  bool call_done_ = false, cancelled_ = false;
};

ResourceServer::ResourceServer(std::string resource_name, std::filesystem::path socket, bool cdi,
                               std::function<void()> on_stream_ended, AgentObserver* observer,
                               fabric::PartitionManager* fabric)
    : resource_name_(std::move(resource_name)),
      socket_(std::move(socket)),
      cdi_(cdi),
      on_stream_ended_(std::move(on_stream_ended)),
      observer_(observer),
      fabric_(fabric) {}

ResourceServer::~ResourceServer() { Shutdown(false); }

absl::Status ResourceServer::Start(const ResourceDevices& devices, pci::VfioNodeSet node_set, bool host_iommufd) {
  if (socket_.string().size() >= sizeof(sockaddr_un{}.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path too long for sun_path: ", socket_.string()));
  }
  if (SomeoneListens(socket_)) {
    return absl::AlreadyExistsError(absl::StrCat("another server answers on ", socket_.string()));
  }
  Update(devices, node_set, host_iommufd);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + socket_.string(), grpc::InsecureServerCredentials());
  builder.RegisterService(&service_);
  cq_ = builder.AddCompletionQueue();
  server_ = builder.BuildAndStart();
  if (!server_) {
    cq_->Shutdown();
    DrainQueue(*cq_);
    cq_.reset();
    return absl::UnavailableError(absl::StrCat("cannot serve on ", socket_.string()));
  }
  socket_id_ = StatFileId(socket_);
  AwaitAll();
  cq_thread_ = std::thread([this] {
    NameThisThread("va-plugin-cq");
    DrainQueue(*cq_);
  });
  return absl::OkStatus();
}

void ResourceServer::AwaitAll() {
  std::lock_guard lock(mu_);
  AwaitStreamLocked();
  AdmitLocked();
  UnaryCall<v1beta1::Empty, v1beta1::DevicePluginOptions>::Await(
      this, &v1beta1::DevicePlugin::AsyncService::RequestGetDevicePluginOptions, &ResourceServer::GetDevicePluginOptions);
  AdmitLocked();
  UnaryCall<v1beta1::PreferredAllocationRequest, v1beta1::PreferredAllocationResponse>::Await(
      this, &v1beta1::DevicePlugin::AsyncService::RequestGetPreferredAllocation,
      &ResourceServer::GetPreferredAllocation);
  AdmitLocked();
  UnaryCall<v1beta1::AllocateRequest, v1beta1::AllocateResponse>::Await(
      this, &v1beta1::DevicePlugin::AsyncService::RequestAllocate, &ResourceServer::Allocate);
  AdmitLocked();
  UnaryCall<v1beta1::PreStartContainerRequest, v1beta1::PreStartContainerResponse>::Await(
      this, &v1beta1::DevicePlugin::AsyncService::RequestPreStartContainer, &ResourceServer::PreStartContainer);
}

void ResourceServer::AwaitStreamLocked() {
  AdmitLocked();
  new DeviceStream(this);
}

bool ResourceServer::Admit() {
  std::lock_guard lock(mu_);
  if (shutting_down_) return false;
  AdmitLocked();
  return true;
}

void ResourceServer::AdmitLocked() { ++call_objects_; }

void ResourceServer::Retire() {
  std::lock_guard lock(mu_);
  if (--call_objects_ == 0) call_objects_cv_.notify_all();
}

std::shared_ptr<const ResourceServer::State> ResourceServer::state() const {
  std::lock_guard lock(mu_);
  return state_;
}

void ResourceServer::Update(const ResourceDevices& devices, pci::VfioNodeSet node_set, bool host_iommufd) {
  auto next = std::make_shared<State>();
  next->devices = devices;
  next->node_set = node_set;
  next->host_iommufd = host_iommufd;
  auto payload = MakePayload(ToListAndWatch(devices));
  std::lock_guard lock(mu_);
  if (state_ && state_->devices == devices && state_->node_set == node_set && state_->host_iommufd == host_iommufd) {
    return;
  }
  state_ = std::move(next);
  payload_ = payload;
  for (DeviceStream* stream : streams_) stream->Push(payload);
}

int ResourceServer::live_streams() const {
  std::lock_guard lock(mu_);
  return static_cast<int>(streams_.size() - probes_.size());
}

int ResourceServer::live_probes() const {
  std::lock_guard lock(mu_);
  return static_cast<int>(probes_.size());
}

int ResourceServer::streams_opened() const {
  std::lock_guard lock(mu_);
  return streams_opened_;
}

void ResourceServer::StreamStarted(DeviceStream* stream, const std::string& peer, bool probe) {
  std::lock_guard lock(mu_);
  if (shutting_down_) {
    stream->End(false);
  } else {
    AwaitStreamLocked();
    streams_.insert(stream);
    if (probe) {
      probes_.insert(stream);
    } else {
      ++streams_opened_;
    }
    stream->Push(payload_);
  }
  spdlog::info("{}: ListAndWatch stream opened by {}{} ({} devices)", resource_name_, peer,
               probe ? " (probe)" : "", payload_->message.devices_size());
}

void ResourceServer::StreamDone(DeviceStream* stream) {
  bool notify = false;
  bool probe = false;
  {
    std::lock_guard lock(mu_);
    streams_.erase(stream);
    probe = probes_.erase(stream) > 0;
    notify = !shutting_down_ && !probe;
  }
  spdlog::info("{}: ListAndWatch stream ended{}", resource_name_, probe ? " (probe)" : notify ? "" : " (shutdown)");
  if (notify && on_stream_ended_) on_stream_ended_();
}

void ResourceServer::Shutdown(bool deregister, std::chrono::milliseconds deregister_grace) {
  {
    std::lock_guard lock(mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
    for (DeviceStream* stream : streams_) stream->End(deregister);
  }
  if (!server_) return;
  // Streams finish on their own once the empty list is written; the deadline cancels a peer that stopped
  // reading. Every waiting request then fails and every call ends, on the queue's thread; the queue is shut
  // down only after the last call object is gone, so none can start an operation on a shut-down queue.
  const std::chrono::milliseconds grace = deregister ? deregister_grace : std::chrono::milliseconds(100);
  server_->Shutdown(std::chrono::system_clock::now() + grace);
  {
    std::unique_lock lock(mu_);
    call_objects_cv_.wait(lock, [&] { return call_objects_ == 0; });
  }
  cq_->Shutdown();
  cq_thread_.join();
  server_.reset();
  cq_.reset();
  // gRPC unlinks its socket at shutdown; remove it ourselves only if it is still the very file we bound.
  if (socket_id_.present() && StatFileId(socket_) == socket_id_) ::unlink(socket_.c_str());
}

grpc::Status ResourceServer::GetDevicePluginOptions(const v1beta1::Empty&, v1beta1::DevicePluginOptions* response) {
  *response = PluginOptions();
  return grpc::Status::OK;
}

grpc::Status ResourceServer::GetPreferredAllocation(const v1beta1::PreferredAllocationRequest& request,
                                                    v1beta1::PreferredAllocationResponse* response) {
  std::shared_ptr<const State> current = state();
  for (const v1beta1::ContainerPreferredAllocationRequest& container : request.container_requests()) {
    std::vector<std::string> available(container.available_deviceids().begin(), container.available_deviceids().end());
    std::vector<std::string> must(container.must_include_deviceids().begin(), container.must_include_deviceids().end());
    std::vector<std::string> chosen;
    std::optional<std::vector<std::string>> partition;
    if (fabric_ != nullptr) {
      std::map<std::string, int> numa;
      for (const PluginDevice& device : current->devices.devices) {
        if (device.numa_node) numa[device.id] = *device.numa_node;
      }
      partition = fabric_->Preferred({available.begin(), available.end()}, {must.begin(), must.end()},
                                     container.allocation_size(), numa);
    }
    chosen = partition ? *std::move(partition)
                       : PreferredAllocation(current->devices, available, must, container.allocation_size());
    spdlog::debug("{}: preferred {} of [{}] must [{}] -> [{}]", resource_name_, container.allocation_size(),
                 absl::StrJoin(available, ","), absl::StrJoin(must, ","), absl::StrJoin(chosen, ","));
    auto* out = response->add_container_responses();
    for (std::string& id : chosen) out->add_deviceids(std::move(id));
  }
  return grpc::Status::OK;
}

grpc::Status ResourceServer::Allocate(const v1beta1::AllocateRequest& request, v1beta1::AllocateResponse* response) {
  const auto start = std::chrono::steady_clock::now();
  auto observe = [&](bool ok) {
    if (observer_ != nullptr) observer_->OnAllocate(resource_name_, ok, std::chrono::steady_clock::now() - start);
  };
  std::shared_ptr<const State> current = state();
  const AllocateConfig config{.node_set = current->node_set, .host_iommufd = current->host_iommufd, .cdi = cdi_};
  // One line per call: the kubelet makes one per container that asks for the resource, i.e. per VM pod admitted.
  std::vector<std::string> granted;
  for (const v1beta1::ContainerAllocateRequest& container : request.container_requests()) {
    std::vector<std::string> ids(container.devices_ids().begin(), container.devices_ids().end());
    absl::StatusOr<ContainerAllocation> allocation = AllocateContainer(current->devices, config, ids);
    if (!allocation.ok()) {
      spdlog::warn("{}: allocate [{}] rejected: {}", resource_name_, absl::StrJoin(ids, ","),
                   std::string(allocation.status().message()));
      observe(false);
      return ToGrpc(allocation.status());
    }
    if (fabric_ != nullptr && !ids.empty()) {
      if (absl::Status partition = fabric_->PrepareAllocation({ids.begin(), ids.end()}); !partition.ok()) {
        spdlog::warn("{}: allocate [{}] rejected: {}", resource_name_, absl::StrJoin(ids, ","),
                     std::string(partition.message()));
        observe(false);
        return ToGrpc(partition);
      }
    }
    *response->add_container_responses() = ToProto(*allocation);
    granted.push_back(absl::StrCat("[", absl::StrJoin(ids, ","), "]"));
  }
  spdlog::info("{}: allocate {}", resource_name_, absl::StrJoin(granted, " "));
  observe(true);
  return grpc::Status::OK;
}

grpc::Status ResourceServer::PreStartContainer(const v1beta1::PreStartContainerRequest&,
                                               v1beta1::PreStartContainerResponse*) {
  return grpc::Status::OK;
}

}  // namespace vfio_agent::plugin::internal
