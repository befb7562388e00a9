// Lifecycle, registration and ListAndWatch consumption of the kubelet simulator (reference section 3,
// items 1-7). Threads: gRPC's sync server runs Register handlers; each dialled plugin gets one thread that
// reads its ListAndWatch stream and is woken for shutdown by ClientContext::TryCancel.
#include <sys/stat.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kubelet_sim_impl.h"

namespace vfio_agent::kubeletsim {
namespace fs = std::filesystem;

namespace {
constexpr char kCheckpoint[] = "kubelet_internal_checkpoint";
constexpr char kSupportedVersion[] = "v1beta1";
constexpr auto kDialPollSlice = std::chrono::milliseconds(20);

const char* GoCodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "Canceled";
    case grpc::StatusCode::UNKNOWN: return "Unknown";
    case grpc::StatusCode::INVALID_ARGUMENT: return "InvalidArgument";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DeadlineExceeded";
    case grpc::StatusCode::NOT_FOUND: return "NotFound";
    case grpc::StatusCode::ALREADY_EXISTS: return "AlreadyExists";
    case grpc::StatusCode::PERMISSION_DENIED: return "PermissionDenied";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "ResourceExhausted";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FailedPrecondition";
    case grpc::StatusCode::ABORTED: return "Aborted";
    case grpc::StatusCode::OUT_OF_RANGE: return "OutOfRange";
    case grpc::StatusCode::UNIMPLEMENTED: return "Unimplemented";
    case grpc::StatusCode::INTERNAL: return "Internal";
    case grpc::StatusCode::UNAVAILABLE: return "Unavailable";
    case grpc::StatusCode::DATA_LOSS: return "DataLoss";
    case grpc::StatusCode::UNAUTHENTICATED: return "Unauthenticated";
    default: return "Unknown";
  }
}
}  // namespace

std::string GoRpcError(const grpc::Status& status) {
  return absl::StrFormat("rpc error: code = %s desc = %s", GoCodeName(status.error_code()),
                         status.error_message());
}

class KubeletSim::Impl::RegistrationService final : public ::v1beta1::Registration::Service {
 public:
  explicit RegistrationService(Impl* impl) : impl_(impl) {}
  grpc::Status Register(grpc::ServerContext*, const ::v1beta1::RegisterRequest* request,
                        ::v1beta1::Empty*) override {
    return impl_->HandleRegister(*request);
  }

 private:
  Impl* impl_;
};

KubeletSim::Impl::Impl(Options options) : options_(std::move(options)), rng_(options_.seed) {
  registration_service_ = std::make_unique<RegistrationService>(this);
  pod_resources_service_ = MakePodResourcesService(this);
}

void KubeletSim::Impl::RecordLocked(std::string kind, std::string resource, std::string detail) const {
  events_.push_back(Event{Clock::now(), std::move(kind), std::move(resource), std::move(detail)});
}

void KubeletSim::Impl::Record(std::string kind, std::string resource, std::string detail) const {
  std::lock_guard lock(mu_);
  RecordLocked(std::move(kind), std::move(resource), std::move(detail));
}

absl::Status KubeletSim::Impl::Start() {
  std::lock_guard lifecycle(lifecycle_mu_);
  return StartLocked();
}

absl::Status KubeletSim::Impl::DeleteSockets() {
  std::error_code ec;
  std::vector<fs::path> doomed;
  for (const auto& entry : fs::directory_iterator(options_.dir, ec)) {
    if (entry.path().filename() == kCheckpoint) continue;
    const auto status = entry.symlink_status();
    const bool legacy = options_.mode == Mode::kLegacy124;
    if (legacy ? !fs::is_directory(status) : fs::is_socket(status)) doomed.push_back(entry.path());
  }
  if (ec) return absl::InternalError(absl::StrCat("list ", options_.dir.string(), ": ", ec.message()));
  for (const auto& path : doomed) {
    if (!fs::remove(path, ec) && ec) {
      return absl::InternalError(absl::StrCat("delete ", path.string(), ": ", ec.message()));
    }
  }
  Record("sockets_deleted", "", absl::StrCat(doomed.size(), " removed from ", options_.dir.string()));
  return absl::OkStatus();
}

absl::Status KubeletSim::Impl::StartLocked() {
  if (server_) return absl::FailedPreconditionError("kubelet simulator already started");
  std::error_code ec;
  fs::create_directories(options_.dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("mkdir ", options_.dir.string(), ": ", ec.message()));
  fs::permissions(options_.dir, static_cast<fs::perms>(0750), fs::perm_options::replace, ec);
  if (auto status = DeleteSockets(); !status.ok()) return status;
  if (options_.kubelet_sock_delay.count() > 0) std::this_thread::sleep_for(options_.kubelet_sock_delay);

  stopping_ = false;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + kubelet_socket().string(), grpc::InsecureServerCredentials());
  builder.RegisterService(registration_service_.get());
  server_ = builder.BuildAndStart();
  if (!server_) return absl::UnavailableError(absl::StrCat("listen on ", kubelet_socket().string()));
  Record("listen", "", kubelet_socket().string());

  if (!options_.pod_resources_socket.empty()) {
    fs::create_directories(options_.pod_resources_socket.parent_path(), ec);
    grpc::ServerBuilder pr_builder;
    pr_builder.AddListeningPort("unix:" + options_.pod_resources_socket.string(),
                                grpc::InsecureServerCredentials());
    pr_builder.RegisterService(pod_resources_service_.get());
    pod_resources_server_ = pr_builder.BuildAndStart();
    if (!pod_resources_server_) {
      return absl::UnavailableError(absl::StrCat("listen on ", options_.pod_resources_socket.string()));
    }
    Record("listen", "", options_.pod_resources_socket.string());
  }
  return absl::OkStatus();
}

void KubeletSim::Impl::ShutdownLocked() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    for (auto* ctx : inflight_) ctx->TryCancel();
  }
  if (server_) {
    // Register handlers see stopping_ and return within one dial poll slice.
    server_->Shutdown(GrpcDeadline(std::chrono::seconds(1)));
    server_->Wait();
    server_.reset();
  }
  std::vector<std::thread> connects;
  {
    std::lock_guard lock(mu_);
    connects.swap(connect_threads_);
  }
  for (auto& t : connects) t.join();
  std::vector<std::shared_ptr<PluginClient>> clients;
  {
    std::lock_guard lock(mu_);
    clients.swap(clients_);
    for (auto& c : clients) c->stream_ctx.TryCancel();
  }
  for (auto& c : clients) {
    if (c->stream_thread.joinable()) c->stream_thread.join();
  }
  {
    std::lock_guard lock(mu_);
    for (auto& [name, entry] : resources_) {
      if (entry.client) DisconnectLocked(name, entry);
    }
  }
  if (pod_resources_server_) {
    pod_resources_server_->Shutdown(GrpcDeadline(std::chrono::seconds(1)));
    pod_resources_server_->Wait();
    pod_resources_server_.reset();
  }
}

absl::Status KubeletSim::Impl::Restart() {
  std::lock_guard lifecycle(lifecycle_mu_);
  Record("restart", "", "");
  ShutdownLocked();
  {
    // What loading the checkpoint gives: each known resource is a stopped endpoint with empty sets.
    std::lock_guard lock(mu_);
    const auto now = GraceNow();
    for (auto it = resources_.begin(); it != resources_.end();) {
      if (it->second.removed) {
        it = resources_.erase(it);
        continue;
      }
      auto& entry = it->second;
      entry.healthy.clear();
      entry.unhealthy.clear();
      entry.topology.clear();
      entry.stop_time = now;
      ++it;
    }
  }
  return StartLocked();
}

void KubeletSim::Impl::Stop() {
  std::lock_guard lifecycle(lifecycle_mu_);
  if (!server_ && !pod_resources_server_) return;
  Record("stop", "", "");
  ShutdownLocked();
}

grpc::Status KubeletSim::Impl::HandleRegister(const ::v1beta1::RegisterRequest& request) {
  const std::string& resource = request.resource_name();
  Record("register", resource,
         absl::StrFormat("version=%s endpoint=%s", request.version(), request.endpoint()));
  std::string error;
  if (request.version() != kSupportedVersion) {
    error = absl::StrFormat(
        "requested API version \"%s\" is not supported by kubelet. Supported version is [\"%s\"]",
        request.version(), kSupportedVersion);
  } else if (!IsExtendedResourceName(resource)) {
    error = absl::StrFormat("the ResourceName \"%s\" is invalid", resource);
  }
  if (!error.empty()) {
    Record("error", resource, error);
    return grpc::Status(grpc::StatusCode::UNKNOWN, error);
  }
  if (options_.mode == Mode::kLegacy124) {
    std::lock_guard lock(mu_);
    if (stopping_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "kubelet is shutting down");
    connect_threads_.emplace_back([this, request] {
      auto client = Connect(request);
      if (client.ok()) {
        Activate(*std::move(client));
      } else {
        Record("error", request.resource_name(), std::string(client.status().message()));
      }
    });
    return grpc::Status::OK;
  }
  auto client = Connect(request);
  if (!client.ok()) {
    Record("error", resource, std::string(client.status().message()));
    return grpc::Status(grpc::StatusCode::UNKNOWN, std::string(client.status().message()));
  }
  Activate(*std::move(client));
  if (options_.before_register_reply) options_.before_register_reply(resource);
  return grpc::Status::OK;
}

absl::StatusOr<std::shared_ptr<PluginClient>> KubeletSim::Impl::Connect(
    const ::v1beta1::RegisterRequest& request) {
  auto client = std::make_shared<PluginClient>();
  client->resource = request.resource_name();
  client->socket = options_.dir / request.endpoint();
  grpc::ChannelArguments args;
  args.SetString(GRPC_ARG_DEFAULT_AUTHORITY, "localhost");
  // A private connection per client, so that disconnecting one never reuses or closes another's.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  client->channel = grpc::CreateCustomChannel("unix:" + client->socket.string(),
                                              grpc::InsecureChannelCredentials(), args);
  const auto deadline = Clock::now() + options_.dial_timeout;
  for (;;) {
    if (stopping_) return absl::CancelledError("failed to dial device plugin: context canceled");
    const auto state = client->channel->GetState(/*try_to_connect=*/true);
    if (state == GRPC_CHANNEL_READY) break;
    if (Clock::now() >= deadline) {
      return absl::DeadlineExceededError("failed to dial device plugin: context deadline exceeded");
    }
    client->channel->WaitForStateChange(
        state, GrpcDeadline(std::min<Clock::duration>(kDialPollSlice, deadline - Clock::now())));
  }
  client->stub = ::v1beta1::DevicePlugin::NewStub(client->channel);

  if (options_.mode == Mode::kLegacy124) {
    client->options = request.options();
  } else {
    grpc::ClientContext ctx;
    ctx.set_deadline(GrpcDeadline(options_.rpc_watchdog));
    {
      std::lock_guard lock(mu_);
      if (stopping_) return absl::CancelledError("failed to get device plugin options: context canceled");
      inflight_.insert(&ctx);
    }
    const grpc::Status status = client->stub->GetDevicePluginOptions(&ctx, ::v1beta1::Empty(), &client->options);
    {
      std::lock_guard lock(mu_);
      inflight_.erase(&ctx);
    }
    if (!status.ok()) {
      return absl::UnavailableError(absl::StrCat("failed to get device plugin options: ", GoRpcError(status)));
    }
  }
  Record("options", client->resource,
         absl::StrFormat("pre_start_required=%s get_preferred_allocation_available=%s%s",
                         client->options.pre_start_required() ? "true" : "false",
                         client->options.get_preferred_allocation_available() ? "true" : "false",
                         options_.mode == Mode::kLegacy124 ? " (from RegisterRequest)" : ""));
  return client;
}

void KubeletSim::Impl::Activate(std::shared_ptr<PluginClient> client) {
  std::lock_guard lock(mu_);
  if (stopping_) return;
  client->id = next_client_id_++;
  auto& entry = resources_[client->resource];
  // The newest registration wins; the previous client stays connected (R22).
  entry.client = client;
  entry.removed = false;
  entry.stop_time.reset();
  entry.endpoint = client->socket.string();
  entry.options = client->options;
  ++entry.registrations;
  clients_.push_back(client);
  if (entry.drop_next_registration) {
    entry.drop_next_registration = false;
    DisconnectLocked(client->resource, entry);
    return;
  }
  client->stream_thread = std::thread([this, client] { StreamLoop(client); });
}

void KubeletSim::Impl::StreamLoop(std::shared_ptr<PluginClient> client) {
  ::v1beta1::ListAndWatchResponse message;
  auto reader = client->stub->ListAndWatch(&client->stream_ctx, ::v1beta1::Empty());
  while (reader->Read(&message)) OnList(*client, message);
  OnStreamEnd(client, reader->Finish());
}

void KubeletSim::Impl::OnList(PluginClient& client, const ::v1beta1::ListAndWatchResponse& message) {
  std::string bytes;
  message.SerializeToString(&bytes);
  std::lock_guard lock(mu_);
  auto it = resources_.find(client.resource);
  if (it == resources_.end() || it->second.removed) return;
  auto& entry = it->second;
  if (options_.mode == Mode::kInstanceKeyed && entry.client.get() != &client) {
    RecordLocked("error", client.resource, "update from a replaced plugin instance ignored");
    return;
  }
  if (entry.frozen) {
    RecordLocked("list_ignored", client.resource, absl::StrFormat("devices=%d", message.devices_size()));
    return;
  }
  const bool identical = client.last_message == bytes;
  client.last_message = std::move(bytes);
  entry.healthy.clear();
  entry.unhealthy.clear();
  entry.topology.clear();
  std::set<std::string> seen;
  std::vector<std::string> duplicates;
  for (const auto& device : message.devices()) {
    if (!seen.insert(device.id()).second) duplicates.push_back(device.id());
    // Exact match: "healthy" or "HEALTHY" is unhealthy to the kubelet (R8).
    (device.health() == "Healthy" ? entry.healthy : entry.unhealthy).insert(device.id());
    auto& nodes = entry.topology[device.id()];
    nodes.clear();
    for (const auto& node : device.topology().nodes()) nodes.push_back(node.id());
  }
  ++entry.list_updates;
  entry.identical_repeats += identical ? 1 : 0;
  entry.duplicate_ids += static_cast<int>(duplicates.size());
  std::string detail = absl::StrFormat("devices=%d healthy=%d unhealthy=%d", message.devices_size(),
                                       entry.healthy.size(), entry.unhealthy.size());
  if (identical) absl::StrAppend(&detail, " identical_repeat");
  if (!duplicates.empty()) absl::StrAppend(&detail, " duplicate_ids=", absl::StrJoin(duplicates, ","));
  RecordLocked("list", client.resource, std::move(detail));
}

void KubeletSim::Impl::OnStreamEnd(const std::shared_ptr<PluginClient>& client, const grpc::Status& status) {
  std::lock_guard lock(mu_);
  RecordLocked("stream_end", client->resource, status.ok() ? "OK" : GoRpcError(status));
  auto it = resources_.find(client->resource);
  if (it == resources_.end() || !it->second.client) return;
  auto& entry = it->second;
  if (entry.client != client) {
    // Before PR #135437 the kubelet disconnects whichever client is registered under the name now, so a
    // late end of an old instance's stream kills the new registration (R22).
    if (options_.mode == Mode::kInstanceKeyed) return;
    entry.client->stream_ctx.TryCancel();
  }
  DisconnectLocked(client->resource, entry);
}

void KubeletSim::Impl::DisconnectLocked(const std::string& resource, ResourceEntry& entry) {
  RecordLocked("disconnect", resource, entry.endpoint);
  entry.client.reset();
  entry.unhealthy.insert(entry.healthy.begin(), entry.healthy.end());
  entry.healthy.clear();
  entry.stop_time = GraceNow();
}

absl::Status KubeletSim::Impl::CloseStream(const std::string& resource) {
  std::lock_guard lock(mu_);
  auto it = resources_.find(resource);
  if (it == resources_.end() || !it->second.client) {
    return absl::NotFoundError(absl::StrCat("no live ListAndWatch stream for ", resource));
  }
  RecordLocked("close_stream", resource, it->second.endpoint);
  it->second.client->stream_ctx.TryCancel();
  return absl::OkStatus();
}

void KubeletSim::Impl::DropNextRegistration(const std::string& resource) {
  std::lock_guard lock(mu_);
  resources_[resource].drop_next_registration = true;
}

absl::Status KubeletSim::Impl::FreezeUpdates(const std::string& resource, bool frozen) {
  std::lock_guard lock(mu_);
  auto it = resources_.find(resource);
  if (it == resources_.end()) return absl::NotFoundError(absl::StrCat("no resource ", resource));
  it->second.frozen = frozen;
  RecordLocked(frozen ? "freeze" : "unfreeze", resource, "");
  return absl::OkStatus();
}

void KubeletSim::Impl::ExpireGraceLocked() const {
  const auto now = GraceNow();
  for (auto& [name, entry] : resources_) {
    if (entry.client || entry.removed || !entry.stop_time) continue;
    if (now - *entry.stop_time < options_.grace_period) continue;
    entry.removed = true;
    entry.healthy.clear();
    entry.unhealthy.clear();
    entry.topology.clear();
    RecordLocked("grace_expired", name, "");
  }
}

std::map<std::string, ResourceState> KubeletSim::Impl::Resources() const {
  std::lock_guard lock(mu_);
  ExpireGraceLocked();
  std::map<std::string, ResourceState> out;
  for (const auto& [name, entry] : resources_) {
    ResourceState& state = out[name];
    state.registered = entry.client != nullptr;
    state.healthy.assign(entry.healthy.begin(), entry.healthy.end());
    state.unhealthy.assign(entry.unhealthy.begin(), entry.unhealthy.end());
    state.allocatable = static_cast<int64_t>(entry.healthy.size());
    state.capacity = state.allocatable + static_cast<int64_t>(entry.unhealthy.size());
    state.registrations = entry.registrations;
    state.list_updates = entry.list_updates;
    state.identical_repeats = entry.identical_repeats;
    state.duplicate_ids = entry.duplicate_ids;
    state.topology = entry.topology;
    state.removed = entry.removed;
    state.endpoint = entry.endpoint;
    state.options = entry.options;
  }
  return out;
}

std::vector<Event> KubeletSim::Impl::Events() const {
  std::lock_guard lock(mu_);
  return events_;
}

std::string KubeletSim::Impl::DescribeNode() const {
  const auto resources = Resources();
  std::string capacity = "Capacity:\n", allocatable = "Allocatable:\n";
  for (const auto& [name, state] : resources) {
    absl::StrAppend(&capacity, "  ", name, ":  ", state.capacity, "\n");
    absl::StrAppend(&allocatable, "  ", name, ":  ", state.allocatable, "\n");
  }
  return capacity + allocatable;
}

// --- public facade ---

KubeletSim::KubeletSim(Options options) {
  options.dir = fs::absolute(options.dir);
  if (!options.pod_resources_socket.empty()) options.pod_resources_socket = fs::absolute(options.pod_resources_socket);
  impl_ = std::make_unique<Impl>(std::move(options));
}
KubeletSim::~KubeletSim() { impl_->Stop(); }
absl::Status KubeletSim::Start() { return impl_->Start(); }
absl::Status KubeletSim::Restart() { return impl_->Restart(); }
void KubeletSim::Stop() { impl_->Stop(); }
absl::Status KubeletSim::CloseStream(const std::string& resource) { return impl_->CloseStream(resource); }
void KubeletSim::DropNextRegistration(const std::string& resource) { impl_->DropNextRegistration(resource); }
absl::Status KubeletSim::FreezeUpdates(const std::string& resource, bool frozen) {
  return impl_->FreezeUpdates(resource, frozen);
}
std::map<std::string, ResourceState> KubeletSim::Resources() const { return impl_->Resources(); }
std::vector<Event> KubeletSim::Events() const { return impl_->Events(); }
absl::StatusOr<AdmittedPod> KubeletSim::Admit(const PodSpec& pod) { return impl_->Admit(pod); }
void KubeletSim::Release(const std::string& pod_name) { impl_->Release(pod_name); }
std::string KubeletSim::DescribeNode() const { return impl_->DescribeNode(); }
std::filesystem::path KubeletSim::kubelet_socket() const { return impl_->kubelet_socket(); }
std::vector<AdmittedPod> KubeletSim::Pods() const { return impl_->Pods(); }

bool KubeletSim::WaitFor(const std::function<bool(const KubeletSim&)>& pred,
                         std::chrono::milliseconds timeout) const {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    const bool done = pred(*this);
    if (done || Clock::now() >= deadline) return done;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

}  // namespace vfio_agent::kubeletsim
