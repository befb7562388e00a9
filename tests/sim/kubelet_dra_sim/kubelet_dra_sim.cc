#include "kubelet_dra_sim.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dra-health/v1/api.grpc.pb.h"
#include "dra-health/v1alpha1/api.grpc.pb.h"
#include "dra/v1/api.grpc.pb.h"
#include "dra/v1beta1/api.grpc.pb.h"
#include "pluginregistration/v1/api.grpc.pb.h"

namespace vfio_agent::kubeletsim::dra {
namespace {

namespace drav1beta1 = ::k8s::io::kubelet::pkg::apis::dra::v1beta1;
using Clock = std::chrono::steady_clock;

std::chrono::system_clock::time_point Deadline(std::chrono::milliseconds from_now) {
  return std::chrono::system_clock::now() + from_now;
}

// The kubelet's quoting of a []string with %q: ["a" "b"].
std::string QuoteList(const std::vector<std::string>& list) {
  std::vector<std::string> quoted;
  for (const std::string& s : list) quoted.push_back(absl::StrCat("\"", s, "\""));
  return absl::StrCat("[", absl::StrJoin(quoted, " "), "]");
}

template <typename To, typename From>
bool Convert(const From& from, To* to) {
  std::string bytes;
  return from.SerializeToString(&bytes) && to->ParseFromString(bytes);
}

absl::Status FromGrpc(const grpc::Status& status, const std::string& what) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(what, ": ", status.error_message()));
}

// One plugin's health stream, opened again after each failure until stopped.
struct HealthWatch {
  std::mutex mu;
  std::condition_variable cv;
  grpc::ClientContext* context = nullptr;  // of the stream open now
  bool stop = false;
  std::thread thread;

  void Stop() {
    {
      std::lock_guard lock(mu);
      stop = true;
      if (context != nullptr) context->TryCancel();
    }
    cv.notify_all();
    if (thread.joinable()) thread.join();
  }
};

struct Connection {
  Plugin plugin;
  std::shared_ptr<grpc::Channel> channel;
  std::shared_ptr<HealthWatch> health;
};

}  // namespace

drav1::Claim MakeClaim(const std::string& namespace_name, const std::string& name, const std::string& uid) {
  drav1::Claim claim;
  claim.set_namespace_(namespace_name);
  claim.set_name(name);
  claim.set_uid(uid);
  return claim;
}

class KubeletDraSim::Impl {
 public:
  explicit Impl(Options options) : options_(std::move(options)) {}
  ~Impl() { Stop(); }

  absl::Status Start() {
    std::error_code ec;
    std::filesystem::create_directories(options_.registry_dir, ec);
    if (ec) return absl::UnavailableError(absl::StrCat("create ", options_.registry_dir.string(), ": ", ec.message()));
    inotify_fd_ = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    if (inotify_fd_ < 0) return absl::UnavailableError("inotify_init1 failed");
    if (inotify_add_watch(inotify_fd_, options_.registry_dir.c_str(),
                          IN_CREATE | IN_MOVED_TO | IN_DELETE | IN_MOVED_FROM) < 0) {
      ::close(inotify_fd_);
      return absl::UnavailableError(absl::StrCat("inotify_add_watch ", options_.registry_dir.string()));
    }
    if (::pipe2(stop_pipe_, O_CLOEXEC) != 0) {
      ::close(inotify_fd_);
      return absl::UnavailableError("pipe2 failed");
    }
    // The watch is in place before the walk, so a socket created meanwhile is seen at least once; a second sight
    // of an already registered socket is ignored, as the kubelet's desired-state cache does.
    for (const auto& entry : std::filesystem::directory_iterator(options_.registry_dir, ec)) {
      Consider(entry.path());
    }
    watcher_ = std::thread([this] { Watch(); });
    return absl::OkStatus();
  }

  void Stop() {
    if (!watcher_.joinable()) return;
    (void)!::write(stop_pipe_[1], "x", 1);
    watcher_.join();
    ::close(stop_pipe_[0]);
    ::close(stop_pipe_[1]);
    ::close(inotify_fd_);
    std::map<std::string, Connection> dropped;
    {
      std::lock_guard lock(mu_);
      dropped.swap(connections_);
      latest_health_.clear();
    }
    for (auto& [driver, connection] : dropped) {
      if (connection.health) connection.health->Stop();
    }
  }

  std::optional<::v1alpha1::NodeWatchResourcesResponse> LatestHealth(const std::string& driver) const {
    std::lock_guard lock(mu_);
    auto it = latest_health_.find(driver);
    if (it == latest_health_.end()) return std::nullopt;
    return it->second;
  }

  absl::Status Restart() {
    Stop();
    Record("restart", "", "");
    return Start();
  }

  std::map<std::string, Plugin> Plugins() const {
    std::lock_guard lock(mu_);
    std::map<std::string, Plugin> plugins;
    for (const auto& [driver, connection] : connections_) plugins[driver] = connection.plugin;
    return plugins;
  }

  std::vector<Event> Events() const {
    std::lock_guard lock(mu_);
    return events_;
  }

  absl::StatusOr<drav1::NodePrepareResourcesResponse> Prepare(const std::string& driver,
                                                               const std::vector<drav1::Claim>& claims) {
    drav1::NodePrepareResourcesRequest request;
    for (const drav1::Claim& claim : claims) *request.add_claims() = claim;
    return Call(driver, "prepare", request, &drav1::DRAPlugin::Stub::NodePrepareResources,
                &drav1beta1::DRAPlugin::Stub::NodePrepareResources);
  }

  absl::StatusOr<drav1::NodeUnprepareResourcesResponse> Unprepare(const std::string& driver,
                                                                   const std::vector<drav1::Claim>& claims) {
    drav1::NodeUnprepareResourcesRequest request;
    for (const drav1::Claim& claim : claims) *request.add_claims() = claim;
    return Call(driver, "unprepare", request, &drav1::DRAPlugin::Stub::NodeUnprepareResources,
                &drav1beta1::DRAPlugin::Stub::NodeUnprepareResources);
  }

 private:
  // One call through the service the kubelet chose at registration; a v1beta1 call carries the v1 request over by
  // its wire bytes and its answer back the same way.
  template <typename Request, typename Response, typename BetaRequest, typename BetaResponse>
  absl::StatusOr<Response> Call(const std::string& driver, const std::string& kind, const Request& request,
                                grpc::Status (drav1::DRAPlugin::Stub::*v1_method)(grpc::ClientContext*, const Request&,
                                                                                 Response*),
                                grpc::Status (drav1beta1::DRAPlugin::Stub::*beta_method)(grpc::ClientContext*,
                                                                                        const BetaRequest&,
                                                                                        BetaResponse*)) {
    std::shared_ptr<grpc::Channel> channel;
    std::string service;
    {
      std::lock_guard lock(mu_);
      auto it = connections_.find(driver);
      if (it == connections_.end()) return absl::NotFoundError(absl::StrCat("DRA driver ", driver, " is not registered"));
      channel = it->second.channel;
      service = it->second.plugin.service;
    }
    Record(kind, driver, service);
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline(options_.call_timeout));
    Response response;
    if (service == "v1.DRAPlugin") {
      drav1::DRAPlugin::Stub stub(channel);
      grpc::Status status = (stub.*v1_method)(&ctx, request, &response);
      if (!status.ok()) return FromGrpc(status, absl::StrCat(driver, " ", kind));
      return response;
    }
    BetaRequest beta_request;
    BetaResponse beta_response;
    if (!Convert(request, &beta_request)) return absl::InternalError("cannot carry the request over to v1beta1");
    drav1beta1::DRAPlugin::Stub stub(channel);
    grpc::Status status = (stub.*beta_method)(&ctx, beta_request, &beta_response);
    if (!status.ok()) return FromGrpc(status, absl::StrCat(driver, " ", kind));
    if (!Convert(beta_response, &response)) return absl::InternalError("cannot read the v1beta1 answer as v1");
    return response;
  }

  void Record(const std::string& kind, const std::string& driver, const std::string& detail) {
    std::lock_guard lock(mu_);
    events_.push_back({Clock::now(), kind, driver, detail});
  }

  void Watch() {
    alignas(inotify_event) char buffer[4096];
    pollfd fds[2] = {{inotify_fd_, POLLIN, 0}, {stop_pipe_[0], POLLIN, 0}};
    while (true) {
      if (::poll(fds, 2, -1) < 0) continue;
      if (fds[1].revents != 0) return;
      ssize_t n = ::read(inotify_fd_, buffer, sizeof(buffer));
      for (ssize_t offset = 0; n > 0 && offset < n;) {
        const auto* event = reinterpret_cast<const inotify_event*>(buffer + offset);
        offset += static_cast<ssize_t>(sizeof(inotify_event) + event->len);
        if (event->len == 0) continue;
        const std::filesystem::path path = options_.registry_dir / event->name;
        if ((event->mask & (IN_DELETE | IN_MOVED_FROM)) != 0) {
          Deregister(path);
        } else {
          Consider(path);
        }
      }
    }
  }

  // The plugin watcher: dot-files and anything not a socket are ignored; a socket already registered is not
  // registered again.
  void Consider(const std::filesystem::path& path) {
    struct stat st {};
    if (path.filename().string().starts_with(".") || ::lstat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) {
      Record("ignored", "", path.string());
      return;
    }
    {
      std::lock_guard lock(mu_);
      for (const auto& [driver, connection] : connections_) {
        if (connection.plugin.registration_socket == path) return;
      }
    }
    Register(path);
  }

  void Register(const std::filesystem::path& path) {
    auto registration_channel = grpc::CreateChannel("unix:" + path.string(), grpc::InsecureChannelCredentials());
    pluginregistration::Registration::Stub registration(registration_channel);
    pluginregistration::PluginInfo info;
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(Deadline(options_.get_info_timeout));
      ctx.set_wait_for_ready(true);  // the socket appears at bind(), a moment before the server listens
      if (grpc::Status status = registration.GetInfo(&ctx, pluginregistration::InfoRequest(), &info); !status.ok()) {
        Record("error", "", absl::StrCat("GetInfo ", path.string(), ": ", status.error_message()));
        return;
      }
    }
    Plugin plugin;
    plugin.driver = info.name();
    plugin.endpoint = info.endpoint().empty() ? path.string() : info.endpoint();
    plugin.supported_versions.assign(info.supported_versions().begin(), info.supported_versions().end());
    plugin.registration_socket = path;
    std::string error = Validate(info.type(), plugin);
    if (error.empty()) {
      std::lock_guard lock(mu_);
      if (connections_.contains(plugin.driver) && connections_[plugin.driver].plugin.endpoint == plugin.endpoint) {
        error = absl::StrCat("endpoint ", plugin.endpoint, " already registered for DRA driver plugin ", plugin.driver);
      }
    }
    if (!error.empty()) {
      Notify(registration, plugin.driver, false, error);
      Record("refused", plugin.driver, error);
      return;
    }
    // The kubelet connects at once (conn.Connect()) to learn early whether the plugin is really there.
    auto channel = grpc::CreateChannel("unix:" + plugin.endpoint, grpc::InsecureChannelCredentials());
    plugin.connected = channel->WaitForConnected(Deadline(options_.get_info_timeout));
    std::shared_ptr<HealthWatch> replaced;
    {
      std::lock_guard lock(mu_);
      replaced = connections_[plugin.driver].health;
      connections_[plugin.driver] = Connection{plugin, channel, nullptr};
    }
    if (replaced) replaced->Stop();
    if (Notify(registration, plugin.driver, true, "")) {
      Record("register", plugin.driver, absl::StrCat("service=", plugin.service, " endpoint=", plugin.endpoint));
      if (options_.watch_health) WatchHealth(plugin, channel);
    }
  }

  std::string HealthService(const Plugin& plugin) const {
    static constexpr std::string_view kV1 = "v1.DRAResourceHealth", kV1alpha1 = "v1alpha1.DRAResourceHealth";
    if (options_.health_api == Options::HealthApi::k136) return std::string(kV1alpha1);
    const auto& listed = plugin.supported_versions;
    for (std::string_view service : {kV1, kV1alpha1}) {
      if (std::find(listed.begin(), listed.end(), service) != listed.end()) return std::string(service);
    }
    return "";
  }

  // Reads one opened stream to its end, keeping each list as v1alpha1's message (the same fields).
  template <typename Stub, typename Request, typename Response>
  grpc::Status ReadHealth(const std::string& driver, const std::shared_ptr<grpc::Channel>& channel,
                          grpc::ClientContext* context) {
    Stub stub(channel);
    std::unique_ptr<grpc::ClientReader<Response>> reader = stub.NodeWatchResources(context, Request());
    Response message;
    while (reader->Read(&message)) {
      ::v1alpha1::NodeWatchResourcesResponse kept;
      if (!Convert(message, &kept)) continue;
      std::lock_guard lock(mu_);
      latest_health_[driver] = std::move(kept);
      events_.push_back({Clock::now(), "health-message", driver, ""});
    }
    return reader->Finish();
  }

  void WatchHealth(const Plugin& plugin, const std::shared_ptr<grpc::Channel>& channel) {
    const std::string driver = plugin.driver;
    const std::string service = HealthService(plugin);
    if (service.empty()) {
      Record("health-none", driver, "");
      return;
    }
    auto watch = std::make_shared<HealthWatch>();
    {
      std::lock_guard lock(mu_);
      auto it = connections_.find(driver);
      if (it == connections_.end()) return;
      it->second.health = watch;
      it->second.plugin.health_service = service;
    }
    watch->thread = std::thread([this, driver, service, channel, watch = watch.get()] {
      while (true) {
        grpc::ClientContext context;
        {
          std::lock_guard lock(watch->mu);
          if (watch->stop) return;
          watch->context = &context;
        }
        Record("health-stream", driver, service);
        const grpc::Status status =
            service == "v1.DRAResourceHealth"
                ? ReadHealth<::v1::DRAResourceHealth::Stub, ::v1::NodeWatchResourcesRequest,
                             ::v1::NodeWatchResourcesResponse>(driver, channel, &context)
                : ReadHealth<::v1alpha1::DRAResourceHealth::Stub, ::v1alpha1::NodeWatchResourcesRequest,
                             ::v1alpha1::NodeWatchResourcesResponse>(driver, channel, &context);
        std::unique_lock lock(watch->mu);
        watch->context = nullptr;
        if (watch->stop) return;
        lock.unlock();
        Record("health-end", driver, absl::StrCat(status.error_code(), " ", status.error_message()));
        lock.lock();
        if (watch->cv.wait_for(lock, options_.health_retry, [&] { return watch->stop; })) return;
      }
    });
  }

  // The checks of the plugin watcher (handler by type) and DRAPluginManager.validateSupportedServices, with the
  // kubelet's messages. Sets plugin.service on success.
  std::string Validate(const std::string& type, Plugin& plugin) const {
    if (type != "DRAPlugin") {
      return absl::StrCat("no handler registered for plugin type: ", type, " at socket ",
                          plugin.registration_socket.string());
    }
    const std::string prefix = absl::StrCat("invalid supported gRPC versions of DRA driver plugin ", plugin.driver,
                                            " at endpoint ", plugin.endpoint, ": ");
    if (plugin.supported_versions.empty()) {
      return prefix + "empty list of supported gRPC services (aka supported versions)";
    }
    for (const std::string& service : plugin.supported_versions) {
      if (std::find(options_.supported_services.begin(), options_.supported_services.end(), service) !=
          options_.supported_services.end()) {
        plugin.service = service;
        return "";
      }
    }
    return prefix + absl::StrCat("none of services supported by the plugin (", QuoteList(plugin.supported_versions),
                                 ") are supported by the kubelet (", QuoteList(options_.supported_services), ")");
  }

  bool Notify(pluginregistration::Registration::Stub& registration, const std::string& driver, bool ok,
              const std::string& error) {
    pluginregistration::RegistrationStatus status;
    status.set_plugin_registered(ok);
    status.set_error(error);
    pluginregistration::RegistrationStatusResponse response;
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline(options_.get_info_timeout));
    if (grpc::Status call = registration.NotifyRegistrationStatus(&ctx, status, &response); !call.ok()) {
      Record("error", driver, absl::StrCat("NotifyRegistrationStatus: ", call.error_message()));
      return false;
    }
    return true;
  }

  void Deregister(const std::filesystem::path& path) {
    std::shared_ptr<HealthWatch> health;
    {
      std::lock_guard lock(mu_);
      for (auto it = connections_.begin(); it != connections_.end(); ++it) {
        if (it->second.plugin.registration_socket != path) continue;
        events_.push_back({Clock::now(), "deregister", it->first, path.string()});
        health = it->second.health;
        latest_health_.erase(it->first);
        connections_.erase(it);
        break;
      }
    }
    if (health) health->Stop();
  }

  const Options options_;
  int inotify_fd_ = -1;
  int stop_pipe_[2] = {-1, -1};
  std::thread watcher_;
  mutable std::mutex mu_;
  std::map<std::string, Connection> connections_;  // by driver name
  std::map<std::string, ::v1alpha1::NodeWatchResourcesResponse> latest_health_;  // by driver name
  std::vector<Event> events_;
};

KubeletDraSim::KubeletDraSim(Options options) : impl_(std::make_unique<Impl>(std::move(options))) {}
KubeletDraSim::~KubeletDraSim() = default;
absl::Status KubeletDraSim::Start() { return impl_->Start(); }
absl::Status KubeletDraSim::Restart() { return impl_->Restart(); }
void KubeletDraSim::Stop() { impl_->Stop(); }
std::map<std::string, Plugin> KubeletDraSim::Plugins() const { return impl_->Plugins(); }
std::vector<Event> KubeletDraSim::Events() const { return impl_->Events(); }

int KubeletDraSim::Count(const std::string& kind) const {
  const std::vector<Event> events = Events();
  return static_cast<int>(std::count_if(events.begin(), events.end(), [&](const Event& e) { return e.kind == kind; }));
}

bool KubeletDraSim::WaitFor(const std::function<bool(const KubeletDraSim&)>& pred,
                            std::chrono::milliseconds timeout) const {
  const auto deadline = Clock::now() + timeout;
  while (!pred(*this)) {
    if (Clock::now() > deadline) return pred(*this);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

absl::StatusOr<drav1::NodePrepareResourcesResponse> KubeletDraSim::Prepare(const std::string& driver,
                                                                            const std::vector<drav1::Claim>& claims) {
  return impl_->Prepare(driver, claims);
}

std::optional<::v1alpha1::NodeWatchResourcesResponse> KubeletDraSim::LatestHealth(const std::string& driver) const {
  return impl_->LatestHealth(driver);
}

absl::StatusOr<drav1::NodeUnprepareResourcesResponse> KubeletDraSim::Unprepare(
    const std::string& driver, const std::vector<drav1::Claim>& claims) {
  return impl_->Unprepare(driver, claims);
}

}  // namespace vfio_agent::kubeletsim::dra
