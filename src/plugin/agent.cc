#include "vfio_gpu_agent/plugin/agent.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <limits>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "resource_server.h"
#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/common/thread_name.h"
#include "vfio_gpu_agent/node/source.h"
#include "vfio_gpu_agent/node/watch.h"
#include "vfio_gpu_agent/plugin/cdi.h"
#include "vfio_gpu_agent/plugin/held_devices.h"
#include "vfio_gpu_agent/plugin/vgpu_devices.h"
#include "vfio_gpu_agent/vgpu/discovery.h"

namespace vfio_agent::plugin {

using internal::FileId;
using internal::ResourceServer;
using internal::StatFileId;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

constexpr milliseconds kFirstBackoff{10};  // kubelet.sock exists but refuses: bind() precedes listen()
constexpr milliseconds kMaxBackoff{5000};
constexpr milliseconds kConfigErrorBackoff{30000};  // the kubelet rejected our version or name
constexpr milliseconds kRegisterDeadline{15000};    // the kubelet may take 10 s to dial back (R3)
constexpr milliseconds kMaxPollWait{1000};          // stat poll while an inotify watch is missing
// The kubelet opens ListAndWatch as it answers Register (R3); one that has not after this long dropped the
// registration (R22) and will not.
constexpr milliseconds kFirstStreamWait{5000};
constexpr milliseconds kSettleRescan{25};           // second look after a device event (sysfs may lag /dev)
// After a stream end with kubelet.sock still accepting, how often to look again whether the kubelet is exiting.
constexpr milliseconds kStreamEndProbe{50};
// A kubelet that does not answer Register is expected for a while (starting, restarting); only past this
// is it worth a warning. The daemon's registration grace is the same.
constexpr milliseconds kQuietRegisterFailures{30000};

// True when a process listens on the Unix socket `path`. A kubelet that is down refuses; one that is exiting
// still accepts for a moment after its streams ended (ServeOptions::stream_end_settle).
bool Listening(const std::filesystem::path& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return true;  // cannot tell: behave as if it were up
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string text = path.string();
  if (text.size() >= sizeof(address.sun_path)) {
    ::close(fd);
    return true;
  }
  text.copy(address.sun_path, text.size());
  const int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address));
  const int err = errno;
  ::close(fd);
  // EAGAIN: a full backlog, still a listener.
  return rc == 0 || (err != ECONNREFUSED && err != ENOENT);
}

// gRPC's async client API on the call's own queue, waited on by a thread that lives as long as the call:
// the callback API would keep gRPC's shared polling threads waking every second.
struct RegisterCall {
  ~RegisterCall() {
    if (waiter.joinable()) waiter.join();
  }
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1beta1::Registration::Stub> stub;
  grpc::CompletionQueue queue;
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientAsyncResponseReader<v1beta1::Empty>> reader;
  std::thread waiter;
  v1beta1::RegisterRequest request;
  v1beta1::Empty response;
  grpc::Status status;
  std::string resource;
  uint64_t generation = 0;
  int streams_before = 0;  // the server's streams_opened() as the call was sent: a stream after it is its own
  FileId kubelet;
};

struct Resource {
  std::string name;
  std::filesystem::path socket;
  std::unique_ptr<ResourceServer> server;
  uint64_t generation = 0;  // bumped on every (re)serve; answers for older generations are stale
  bool registered = false;
  bool register_in_flight = false;
  bool stream_ended = false;
  // Set when the kubelet's stream ended while kubelet.sock accepted: cleared when the kubelet stops accepting
  // (it is exiting; the next one deletes our socket and the server restarts then) or, with the kubelet still
  // up after stream_end_settle, by restarting the server. No Register is sent meanwhile.
  std::optional<Clock::time_point> stream_end_since;
  FileId registered_kubelet;
  Clock::time_point registered_at{};
  int streams_before_register = 0;  // the server's streams_opened() when the Register that holds was sent
  milliseconds backoff{0};
  Clock::time_point next_attempt{};
  Clock::time_point next_serve{};
  int registrations = 0;
  int serves = 0;
  // Register failures since the last success: the first is logged at info, the rest at debug, one warning
  // when they outlast kQuietRegisterFailures.
  int failures = 0;
  Clock::time_point failing_since{};
  bool failures_warned = false;
};

std::string ChangeSummary(const PluginDevice* before, const PluginDevice& after) {
  if (before == nullptr) return after.healthy ? "appeared, Healthy" : absl::StrCat("appeared, Unhealthy: ", after.unhealthy_reason);
  if (before->healthy != after.healthy || before->unhealthy_reason != after.unhealthy_reason) {
    return after.healthy ? "Healthy again" : absl::StrCat("Unhealthy: ", after.unhealthy_reason);
  }
  return "";
}

}  // namespace

std::string SocketName(std::string_view resource_name) {
  const size_t slash = resource_name.rfind('/');
  return "kubevirt-" + std::string(resource_name.substr(slash == std::string_view::npos ? 0 : slash + 1)) + ".sock";
}

class Agent::Impl {
 public:
  explicit Impl(ServeOptions options)
      : options_(std::move(options)),
        kubelet_socket_(options_.kubelet_socket.empty() ? options_.paths.kubelet_dir / "kubelet.sock"
                                                        : options_.kubelet_socket),
        own_source_(node::OwnSource(options_)),
        source_(options_.source != nullptr ? *options_.source : *own_source_) {
    if (!options_.fabric.address.empty()) {
      const fabric::NvfmOptions nvfm{.address = options_.fabric.address, .library = options_.fabric_library};
      fabric_ = std::make_unique<fabric::PartitionManager>(
          options_.fabric, [nvfm] { return fabric::ConnectNvfm(nvfm); }, options_.fabric_observer);
    }
  }
  ~Impl() { Stop(); }

  absl::Status Start();
  void Stop();
  DeviceSnapshot Snapshot() const {
    std::lock_guard lock(mu_);
    return snapshot_;
  }
  std::vector<ResourceStatus> Resources() const;
  std::optional<fabric::FabricStatus> Fabric() const {
    if (!fabric_) return std::nullopt;
    return fabric_->Status();
  }
  void RescanNow() {
    {
      std::lock_guard lock(mu_);
      next_rescan_ = Clock::now();
    }
    wakeup_.Notify();
  }
  void SetKubevirtRelease(const std::optional<kube::KubevirtRelease>& release);
  pci::VfioNodeSet NodeSet() const {
    std::lock_guard lock(node_set_mu_);
    return node_set_;
  }

 private:
  // A shared source (ServeOptions::source) is rescanned by its owner; the agent only listens.
  bool shared() const { return own_source_ == nullptr; }
  // A state the agent's mode can be built from: vm-vgpu needs a scan that discovered the vGPUs.
  bool Fits(const std::shared_ptr<const node::State>& state) const {
    return state != nullptr && (options_.workload != Workload::kVmVgpu || state->discovery.has_value());
  }
  void Loop();
  // Scans run on their own thread: sysfs reads of a device in reset can take seconds, and the loop must go
  // on registering and answering the kubelet meanwhile. The loop asks; the scanner posts the snapshot back.
  void ScanLoop();
  void RequestScan();
  // `posted`: a shared source's state; null: a scan of our own (or, shared, the source's newest state).
  std::optional<DeviceSnapshot> BuildFromSysfs(std::shared_ptr<const node::State> posted);
  // What the plugin serves of one scan in the configured workload mode; only the scanner (and Start, before it)
  // calls it.
  DeviceSnapshot Build(const node::State& state);
  DeviceSnapshot BuildVgpu(const node::State& state);
  // Releases partitions no pod holds and follows FM's state; a change of what FM vouches for rescans.
  void FabricLoop();
  void Apply(DeviceSnapshot next);
  void Reconcile();
  void Serve(Resource& resource);
  void StartRegister(Resource& resource, const FileId& kubelet);
  void RegisterDone(const RegisterCall& call);
  void Post(std::function<void()> task);
  void RunPosted();
  Clock::time_point NextDeadline() const;

  const ServeOptions options_;
  const std::filesystem::path kubelet_socket_;
  // The scanner's (and Start's, before it): the agent's own (`serve`), or `run`'s, whose subscription hands each
  // state to the scanner.
  const std::unique_ptr<node::Source> own_source_;
  node::Source& source_;
  std::optional<uint64_t> subscription_;
  node::DirWatcher dirs_;
  node::UdevMonitor udev_;
  node::Wakeup wakeup_;
  std::unique_ptr<fabric::PartitionManager> fabric_;
  std::thread loop_;
  std::thread scanner_;
  std::thread fabric_thread_;
  bool started_ = false;

  // Loop state; the accessors read it under mu_.
  mutable std::mutex mu_;
  DeviceSnapshot snapshot_;
  std::map<std::string, Resource> resources_;
  FileId kubelet_;
  Clock::time_point next_rescan_{}, settle_rescan_ = Clock::time_point::max();
  std::mt19937 jitter_{std::random_device{}()};

  // Work handed to the loop by gRPC threads (stream ended, Register answered).
  std::mutex queue_mu_;
  std::condition_variable calls_cv_;
  std::deque<std::function<void()>> queue_;
  std::set<RegisterCall*> calls_in_flight_;
  bool stopping_ = false;

  // Scanner state (queue_mu_ guards the request flag; remembered_ is the scanner's alone after Start).
  std::condition_variable scan_cv_;
  std::condition_variable fabric_cv_;
  bool scan_requested_ = false;
  std::shared_ptr<const node::State> posted_state_;  // a shared source's newest state, not built yet
  uint64_t built_generation_ = 0;                    // the scanner's: the last state built
  std::set<std::string> remembered_;
  DeviceSnapshot vgpu_previous_;
  vgpu::Framework vgpu_framework_ = vgpu::Framework::kNone;
  std::set<std::string> vgpu_problems_;

  // The resolved --vfio-backend: written by SetKubevirtRelease (any thread), read by Build on the scanner.
  mutable std::mutex node_set_mu_;
  std::optional<kube::KubevirtRelease> release_;  // the last told; Start resolves from it too
  pci::VfioNodeSet node_set_ = pci::VfioNodeSet::kLegacy;
};

void Agent::Impl::SetKubevirtRelease(const std::optional<kube::KubevirtRelease>& release) {
  const pci::VfioNodeSet next = ResolveNodeSet(options_.vfio_backend, release);
  {
    std::lock_guard lock(node_set_mu_);
    release_ = release;
    if (next == node_set_) return;
    spdlog::info("VFIO nodes: {} (--vfio-backend {}, KubeVirt release {}), was {}; publishing again",
                 pci::VfioNodeSetName(next), VfioBackendChoiceName(options_.vfio_backend),
                 release ? release->text : "unknown", pci::VfioNodeSetName(node_set_));
    node_set_ = next;
  }
  RescanNow();
}

absl::Status Agent::Impl::Start() {
  if (absl::Status host = CheckHostSupports(options_.vfio_backend, options_.paths.dev_root); !host.ok()) return host;
  {
    std::lock_guard lock(node_set_mu_);
    node_set_ = ResolveNodeSet(options_.vfio_backend, release_);
    spdlog::info("VFIO nodes: {} (--vfio-backend {}{})", pci::VfioNodeSetName(node_set_),
                 VfioBackendChoiceName(options_.vfio_backend),
                 options_.vfio_backend != VfioBackendChoice::kAuto ? ""
                 : release_                                         ? ", KubeVirt release " + release_->text
                                                                    : ", KubeVirt release not known yet");
  }
  if (absl::Status status = dirs_.Open(); !status.ok()) return status;
  std::error_code ec;
  std::filesystem::create_directories(options_.paths.kubelet_dir, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("create ", options_.paths.kubelet_dir.string(), ": ", ec.message()));
  }
  dirs_.Refresh(options_.paths.kubelet_dir, options_.paths.dev_root);
  if (options_.udev && !shared()) {
    if (absl::Status status = udev_.Open(); !status.ok()) {
      spdlog::warn("no udev monitor ({}); relying on inotify and the {} ms rescan", status.ToString(),
                   options_.rescan_interval.count());
    }
  }
  source_.Open();
  // A shared source's owner scanned just before starting the agent: no second scan for the first list.
  absl::StatusOr<std::shared_ptr<const node::State>> first = absl::InternalError("no scan");
  if (std::shared_ptr<const node::State> current = shared() ? source_.Current() : nullptr; Fits(current)) {
    first = std::move(current);
  } else {
    first = source_.Rescan();
  }
  if (!first.ok()) return first.status();
  built_generation_ = (*first)->generation;
  if (shared()) {
    subscription_ = source_.Subscribe([this](const std::shared_ptr<const node::State>& state) {
      {
        std::lock_guard lock(queue_mu_);
        posted_state_ = state;
      }
      scan_cv_.notify_all();
    });
  }
  // Before the first list: a GPU FM cannot vouch for yet is not advertised Healthy for a moment.
  if (fabric_) {
    if (absl::Status fm = fabric_->Reconcile(std::nullopt); !fm.ok()) {
      spdlog::warn("fabric: Fabric Manager at {}: {}; its GPUs stay Unhealthy until it answers",
                   options_.fabric.address, fm.ToString());
    }
  }
  {
    std::lock_guard lock(mu_);
    Apply(Build(**first));
    Reconcile();
  }
  started_ = true;
  scanner_ = std::thread([this] {
    NameThisThread("va-scan");
    ScanLoop();
  });
  loop_ = std::thread([this] {
    NameThisThread("va-plugin");
    Loop();
  });
  if (fabric_) {
    fabric_thread_ = std::thread([this] {
      NameThisThread("va-fabric");
      FabricLoop();
    });
  }
  return absl::OkStatus();
}

void Agent::Impl::Stop() {
  {
    std::lock_guard lock(queue_mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  if (subscription_) source_.Unsubscribe(*subscription_);
  wakeup_.Notify();
  scan_cv_.notify_all();
  fabric_cv_.notify_all();
  if (loop_.joinable()) loop_.join();
  if (scanner_.joinable()) scanner_.join();
  if (fabric_thread_.joinable()) fabric_thread_.join();
  {
    std::unique_lock lock(queue_mu_);
    for (RegisterCall* call : calls_in_flight_) call->context.TryCancel();
    calls_cv_.wait(lock, [&] { return calls_in_flight_.empty(); });
    queue_.clear();
  }
  std::lock_guard lock(mu_);
  for (auto& [name, resource] : resources_) {
    if (resource.server) {
      resource.server->Shutdown(/*deregister=*/true);
      resource.server.reset();
    }
    if (options_.cdi) {
      std::error_code ec;  // a spec already gone (or a read-only dir) must not abort the shutdown
      std::filesystem::remove(CdiSpecPath(options_.cdi_dir, name), ec);
    }
    if (started_) spdlog::info("{}: stopped, socket {} removed", name, resource.socket.string());
  }
  resources_.clear();
}

std::vector<ResourceStatus> Agent::Impl::Resources() const {
  std::lock_guard lock(mu_);
  std::vector<ResourceStatus> out;
  for (const auto& [name, resource] : resources_) {
    out.push_back({name, resource.socket, resource.registered, resource.registrations,
                   resource.server ? resource.server->live_streams() : 0, resource.serves,
                   resource.stream_end_since.has_value()});
  }
  return out;
}

void Agent::Impl::Post(std::function<void()> task) {
  {
    std::lock_guard lock(queue_mu_);
    queue_.push_back(std::move(task));
  }
  wakeup_.Notify();
}

void Agent::Impl::RunPosted() {
  std::deque<std::function<void()>> tasks;
  {
    std::lock_guard lock(queue_mu_);
    tasks.swap(queue_);
  }
  for (auto& task : tasks) task();
}

Clock::time_point Agent::Impl::NextDeadline() const {
  // With every watch in place, events wake the loop and an idle agent sleeps until the rare safety rescan.
  Clock::time_point next = std::min(next_rescan_, settle_rescan_);
  if (!dirs_.complete()) next = std::min(next, Clock::now() + kMaxPollWait);
  for (const auto& [name, resource] : resources_) {
    if (!resource.server) next = std::min(next, resource.next_serve);
    if (resource.server && !resource.registered && !resource.register_in_flight && kubelet_.present() &&
        !resource.stream_end_since) {
      next = std::min(next, resource.next_attempt);
    }
    if (resource.stream_end_since) next = std::min(next, Clock::now() + kStreamEndProbe);
    if (resource.server && resource.registered &&
        resource.server->streams_opened() == resource.streams_before_register) {
      next = std::min(next, resource.registered_at + kFirstStreamWait);
    }
  }
  return next;
}

void Agent::Impl::Loop() {
  while (true) {
    int timeout_ms;
    {
      std::lock_guard lock(mu_);
      auto wait = std::chrono::ceil<milliseconds>(NextDeadline() - Clock::now());
      timeout_ms = static_cast<int>(std::clamp<int64_t>(wait.count(), 0, std::numeric_limits<int>::max()));
    }
    pollfd fds[3] = {{wakeup_.fd(), POLLIN, 0}, {dirs_.fd(), POLLIN, 0}, {udev_.fd(), POLLIN, 0}};
    ::poll(fds, udev_.fd() >= 0 ? 3 : 2, timeout_ms);
    {
      std::lock_guard lock(queue_mu_);
      if (stopping_) return;
    }
    bool rescan = false;
    if (fds[0].revents & POLLIN) wakeup_.Drain();
    if (fds[1].revents & POLLIN) {
      // With a shared source `run`'s loop watches the devices and rescans; the kubelet half is still ours.
      if (dirs_.Drain().devices && !shared()) {
        rescan = true;
        settle_rescan_ = Clock::now() + kSettleRescan;
      }
    }
    if (udev_.fd() >= 0 && (fds[2].revents & POLLIN) && udev_.Drain()) {
      rescan = true;
      settle_rescan_ = Clock::now() + kSettleRescan;
    }
    dirs_.Refresh(options_.paths.kubelet_dir, options_.paths.dev_root);
    RunPosted();
    std::lock_guard lock(mu_);
    const Clock::time_point now = Clock::now();
    if (now >= settle_rescan_) {
      settle_rescan_ = Clock::time_point::max();
      rescan = true;
    }
    if (rescan || now >= next_rescan_) {
      // A shared source is rescanned by its owner: its safety pass replaces ours; RescanNow still rebuilds.
      next_rescan_ = shared() ? Clock::time_point::max() : now + options_.rescan_interval;
      RequestScan();
    }
    Reconcile();
  }
}

void Agent::Impl::RequestScan() {
  {
    std::lock_guard lock(queue_mu_);
    scan_requested_ = true;
  }
  scan_cv_.notify_all();
}

void Agent::Impl::ScanLoop() {
  while (true) {
    std::shared_ptr<const node::State> posted;
    {
      std::unique_lock lock(queue_mu_);
      scan_cv_.wait(lock, [&] { return scan_requested_ || posted_state_ || stopping_; });
      if (stopping_) return;
      scan_requested_ = false;
      posted = std::exchange(posted_state_, nullptr);
    }
    std::optional<DeviceSnapshot> snapshot = BuildFromSysfs(std::move(posted));
    if (!snapshot) continue;
    Post([this, snapshot = std::move(*snapshot)]() mutable {
      std::lock_guard lock(mu_);
      Apply(std::move(snapshot));
    });
  }
}

std::optional<DeviceSnapshot> Agent::Impl::BuildFromSysfs(std::shared_ptr<const node::State> posted) {
  absl::StatusOr<std::shared_ptr<const node::State>> state = absl::InternalError("no scan");
  if (posted) {
    // Built already (a RescanNow's rebuild of the same state needs no second look at it).
    if (posted->generation <= built_generation_) return std::nullopt;
    state = std::move(posted);
  } else if (shared()) {
    state = source_.Current();  // RescanNow with a shared source: rebuilt from its newest state
  } else {
    state = source_.Rescan();
  }
  if (!state.ok()) {
    spdlog::error("rescan: {}; keeping the previous device set", state.status().ToString());
    return std::nullopt;
  }
  built_generation_ = std::max(built_generation_, (*state)->generation);
  if (!Fits(*state)) return std::nullopt;  // the shared source's scan of before a mode switch
  return Build(**state);
}

DeviceSnapshot Agent::Impl::Build(const node::State& state) {
  DeviceSnapshot next;
  if (options_.workload == Workload::kVmVgpu) {
    next = BuildVgpu(state);
  } else {
    next = WholeDevicesOf(state.snapshot, remembered_);
    if (fabric_) MarkUnusable(next, [this](const std::string& id) { return fabric_->Unusable(id); });
    remembered_ = AdvertisedIds(next);
  }
  ApplyNodeSet(next, NodeSet(), options_.paths.dev_root);
  return next;
}

DeviceSnapshot Agent::Impl::BuildVgpu(const node::State& state) {
  const vgpu::Discovery& discovery = *state.discovery;
  VgpuSnapshot built =
      VgpusOf(state.snapshot, vgpu::GoneReasons(options_.paths.sysfs_root, state.inventory, discovery), vgpu_previous_);
  if (discovery.framework.ok() && *discovery.framework != vgpu_framework_) {
    vgpu_framework_ = *discovery.framework;
    spdlog::info("vGPU framework: {}", vgpu::FrameworkName(vgpu_framework_));
  }
  // Each problem once, while it lasts: the safety rescan must not repeat them every minute.
  std::set<std::string> problems(built.problems.begin(), built.problems.end());
  for (const std::string& problem : problems) {
    if (vgpu_problems_.contains(problem)) continue;
    spdlog::warn("vGPU: {}", problem);
    if (options_.observer != nullptr) options_.observer->OnVgpuProblem(problem);
  }
  for (const std::string& problem : vgpu_problems_) {
    if (!problems.contains(problem)) spdlog::info("vGPU: no longer: {}", problem);
  }
  vgpu_problems_ = std::move(problems);
  vgpu_previous_ = built.snapshot;
  return std::move(built.snapshot);
}

void Agent::Impl::FabricLoop() {
  uint64_t seen = fabric_->Status().generation;
  while (true) {
    {
      std::unique_lock lock(queue_mu_);
      fabric_cv_.wait_for(lock, options_.fabric_interval, [&] { return stopping_; });
      if (stopping_) return;
    }
    std::set<std::string> names;
    {
      std::lock_guard lock(mu_);
      for (const auto& [name, resource] : resources_) names.insert(name);
    }
    absl::StatusOr<std::vector<std::set<std::string>>> containers =
        HeldDeviceSets(options_.paths.pod_resources_socket, names, milliseconds(2000));
    std::optional<fabric::Held> held;
    if (containers.ok()) {
      held.emplace();
      for (const std::set<std::string>& ids : *containers) held->gpus.insert(ids.begin(), ids.end());
      held->containers = *std::move(containers);
    } else {
      spdlog::debug("fabric: {}; no partition is released this pass", containers.status().ToString());
    }
    (void)fabric_->Reconcile(held);  // logged by the manager
    if (const uint64_t generation = fabric_->Status().generation; generation != seen) {
      seen = generation;
      RescanNow();
    }
  }
}

void Agent::Impl::Apply(DeviceSnapshot next) {
  if (next == snapshot_) return;
  for (const auto& [name, resource] : next.resources) {
    const ResourceDevices* before = nullptr;
    if (auto it = snapshot_.resources.find(name); it != snapshot_.resources.end()) before = &it->second;
    for (const PluginDevice& device : resource.devices) {
      std::string change = ChangeSummary(before ? before->Find(device.id) : nullptr, device);
      if (!change.empty()) spdlog::info("{} {}: {}", device.id, name, change);
    }
  }
  for (const auto& [name, resource] : snapshot_.resources) {
    for (const PluginDevice& device : resource.devices) {
      auto it = next.resources.find(name);
      if (it == next.resources.end() || it->second.Find(device.id) == nullptr) {
        spdlog::info("{} {}: removed (gone from sysfs)", device.id, name);
      }
    }
  }
  snapshot_ = std::move(next);
  for (const auto& [name, devices] : snapshot_.resources) {
    if (resources_.contains(name)) continue;
    Resource& resource = resources_[name];
    resource.name = name;
    resource.socket = options_.paths.kubelet_dir / SocketName(name);
  }
  static const ResourceDevices kNone;
  for (auto& [name, resource] : resources_) {
    auto it = snapshot_.resources.find(name);
    ResourceDevices devices = it != snapshot_.resources.end() ? it->second : kNone;
    devices.resource_name = name;
    if (options_.cdi) {
      if (absl::Status status = WriteCdiSpec(options_.cdi_dir, devices, snapshot_.node_set, snapshot_.iommufd);
          !status.ok()) {
        spdlog::error("{}: CDI spec: {}", name, status.ToString());
      }
    }
    // A resource whose GPUs all left stays registered with an empty list (capacity 0, R7).
    if (resource.server) resource.server->Update(devices, snapshot_.node_set, snapshot_.iommufd);
  }
}

void Agent::Impl::Reconcile() {
  const Clock::time_point now = Clock::now();
  const FileId kubelet = StatFileId(kubelet_socket_);
  if (!(kubelet == kubelet_)) {
    if (kubelet.present()) {
      spdlog::info("kubelet socket {} appeared", kubelet_socket_.string());
      const bool registered_before = std::any_of(resources_.begin(), resources_.end(),
                                                 [](const auto& entry) { return entry.second.registrations > 0; });
      if (registered_before && options_.observer != nullptr) options_.observer->OnKubeletRestart();
    }
    kubelet_ = kubelet;
    // A new kubelet: dial it now, whatever backoff was running. A Register still waiting on the previous
    // kubelet.sock may never be answered (a kubelet going down can hold its listening socket without
    // accepting), and while it waits no new attempt starts: cancel it (RegisterDone retries at once).
    {
      std::lock_guard lock(queue_mu_);
      for (RegisterCall* call : calls_in_flight_) {
        if (!(call->kubelet == kubelet)) call->context.TryCancel();
      }
    }
    for (auto& [name, resource] : resources_) {
      resource.backoff = milliseconds(0);
      resource.next_attempt = now;
    }
  }
  for (auto& [name, resource] : resources_) {
    std::string reason;
    if (resource.server && resource.stream_ended && resource.server->live_streams() == 0 &&
        !resource.stream_end_since) {
      // Registered or not yet: the kubelet opens the stream before its Register reply is sent, so a stream that
      // ends before the reply is processed voids that registration too (RegisterDone drops the late OK).
      resource.stream_end_since = now;
      resource.registered = false;
    }
    if (!resource.server) {
      if (now >= resource.next_serve) reason = "serving";
    } else if (!resource.server->socket_id().present() ||  // removed between bind and stat (kubelet restart)
               !(StatFileId(resource.socket) == resource.server->socket_id())) {
      reason = "own socket removed (kubelet restart)";
    } else if (resource.registered && kubelet.present() && !(kubelet == resource.registered_kubelet)) {
      reason = "kubelet.sock re-created (kubelet restart)";
    } else if (resource.stream_end_since) {
      if (!Listening(kubelet_socket_)) {
        // The kubelet is exiting: the one that starts next deletes our socket, and the server restarts then,
        // once, instead of now and again then.
        spdlog::info("{}: ListAndWatch stream ended with the kubelet down; serving again when it returns", name);
        resource.stream_end_since.reset();
      } else if (now >= *resource.stream_end_since + options_.stream_end_settle) {
        // The kubelet stays: a new server closes every connection of the old one before registering again.
        reason = "ListAndWatch stream ended";
      }
    } else if (resource.registered && resource.server->streams_opened() == resource.streams_before_register &&
               now >= resource.registered_at + kFirstStreamWait) {
      // A kubelet before PR #135437 that handles the end of our previous stream after this Register disconnects
      // the new client, at times before its stream begins: no stream will ever end to tell us (R22).
      reason = absl::StrCat("no ListAndWatch stream ", kFirstStreamWait.count(),
                            " ms after Register (the kubelet dropped the registration)");
    }
    resource.stream_ended = false;
    if (!reason.empty()) {
      if (resource.server) spdlog::info("{}: restarting server: {}", name, reason);
      Serve(resource);
    }
    if (resource.server && !resource.registered && !resource.register_in_flight && !resource.stream_end_since &&
        kubelet.present() && now >= resource.next_attempt) {
      StartRegister(resource, kubelet);
    }
  }
}

void Agent::Impl::Serve(Resource& resource) {
  if (resource.server) {
    // Destroyed before the new one binds: gRPC unlinks the path when the old server shuts down.
    resource.server->Shutdown(/*deregister=*/false);
    resource.server.reset();
  }
  resource.registered = false;
  resource.register_in_flight = false;
  resource.stream_end_since.reset();
  resource.next_attempt = Clock::now();
  const uint64_t generation = ++resource.generation;
  const std::string name = resource.name;
  auto server = std::make_unique<ResourceServer>(
      name, resource.socket, options_.cdi,
      [this, name, generation] {
        Post([this, name, generation] {
          std::lock_guard lock(mu_);
          auto it = resources_.find(name);
          if (it != resources_.end() && it->second.generation == generation) it->second.stream_ended = true;
        });
      },
      options_.observer, fabric_.get());
  std::error_code ec;
  std::filesystem::create_directories(options_.paths.kubelet_dir, ec);
  static const ResourceDevices kNone;
  auto it = snapshot_.resources.find(name);
  ResourceDevices devices = it != snapshot_.resources.end() ? it->second : kNone;
  devices.resource_name = name;
  if (absl::Status status = server->Start(devices, snapshot_.node_set, snapshot_.iommufd); !status.ok()) {
    spdlog::error("{}: {}; retrying in 1 s", name, status.ToString());
    resource.next_serve = Clock::now() + milliseconds(1000);
    return;
  }
  spdlog::info("{}: serving {} devices on {}", name, devices.devices.size(), resource.socket.string());
  resource.server = std::move(server);
  ++resource.serves;
}

void Agent::Impl::StartRegister(Resource& resource, const FileId& kubelet) {
  auto call = std::make_unique<RegisterCall>();
  grpc::ChannelArguments args;
  // A private subchannel pool: a fresh connection attempt every time, never a shared reconnect backoff.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  call->channel = grpc::CreateCustomChannel("unix:" + kubelet_socket_.string(), grpc::InsecureChannelCredentials(), args);
  call->stub = v1beta1::Registration::NewStub(call->channel);
  call->context.set_deadline(std::chrono::system_clock::now() + kRegisterDeadline);
  call->request.set_version("v1beta1");
  call->request.set_endpoint(resource.socket.filename().string());
  call->request.set_resource_name(resource.name);
  *call->request.mutable_options() = internal::PluginOptions();
  call->resource = resource.name;
  call->generation = resource.generation;
  call->streams_before = resource.server->streams_opened();
  call->kubelet = kubelet;
  resource.register_in_flight = true;
  RegisterCall* raw = call.release();
  {
    std::lock_guard lock(queue_mu_);
    calls_in_flight_.insert(raw);
  }
  raw->reader = raw->stub->AsyncRegister(&raw->context, raw->request, &raw->queue);
  raw->reader->Finish(&raw->response, &raw->status, nullptr);
  raw->waiter = std::thread([this, raw] {
    NameThisThread("va-register");
    void* tag = nullptr;
    bool ok = false;
    raw->queue.Next(&tag, &ok);  // the answer, or the deadline's or TryCancel's status
    raw->queue.Shutdown();
    while (raw->queue.Next(&tag, &ok)) {
    }
    std::shared_ptr<RegisterCall> call(raw);
    {
      std::lock_guard lock(queue_mu_);
      calls_in_flight_.erase(raw);
      // Handed to the loop (or to Stop, which drops it): the call, whose destructor joins this thread, never
      // ends on it.
      queue_.push_back([this, call = std::move(call)] { RegisterDone(*call); });
      calls_cv_.notify_all();
    }
    wakeup_.Notify();
  });
}

void Agent::Impl::RegisterDone(const RegisterCall& call) {
  std::lock_guard lock(mu_);
  auto it = resources_.find(call.resource);
  if (it == resources_.end() || it->second.generation != call.generation) return;
  Resource& resource = it->second;
  resource.register_in_flight = false;
  if (!call.status.ok() && !(call.kubelet == kubelet_)) {
    spdlog::info("{}: Register to the previous kubelet abandoned ({}); dialling the new one", resource.name,
                 call.status.error_message());
    resource.backoff = milliseconds(0);
    resource.next_attempt = Clock::now();
    return;
  }
  if (call.status.ok() && resource.stream_end_since) {
    spdlog::debug("{}: Register answered OK after its stream had ended; not registered", resource.name);
    return;
  }
  if (call.status.ok()) {
    resource.registered = true;
    resource.registered_kubelet = call.kubelet;
    resource.registered_at = Clock::now();
    resource.streams_before_register = call.streams_before;
    resource.backoff = milliseconds(0);
    resource.failures = 0;
    resource.failures_warned = false;
    ++resource.registrations;
    spdlog::info("{}: registered with the kubelet as {}", resource.name, call.request.endpoint());
    return;
  }
  const bool config_error = internal::IsRegisterConfigError(call.status);  // else transient (dial-back timeout)
  resource.backoff = config_error ? kConfigErrorBackoff
                                  : std::clamp(resource.backoff * 2, kFirstBackoff, kMaxBackoff);
  const milliseconds jitter(std::uniform_int_distribution<int64_t>(0, resource.backoff.count() / 10)(jitter_));
  resource.next_attempt = Clock::now() + resource.backoff + jitter;
  const Clock::time_point now = Clock::now();
  if (resource.failures++ == 0) resource.failing_since = now;
  auto log = spdlog::level::debug;
  if (config_error) {
    log = spdlog::level::err;
  } else if (resource.failures == 1) {
    log = spdlog::level::info;  // a kubelet starting or restarting: expected
  } else if (!resource.failures_warned && now - resource.failing_since >= kQuietRegisterFailures) {
    log = spdlog::level::warn;
    resource.failures_warned = true;
  }
  spdlog::log(log, "{}: Register failed ({}: {}); retrying in {} ms or when kubelet.sock appears ({} failures "
              "since the last registration)", resource.name, static_cast<int>(call.status.error_code()),
              call.status.error_message(), (resource.backoff + jitter).count(), resource.failures);
}

Agent::Agent(ServeOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
Agent::~Agent() = default;
absl::Status Agent::Start() { return impl_->Start(); }
void Agent::Stop() { impl_->Stop(); }
void Agent::RescanNow() { impl_->RescanNow(); }
void Agent::SetKubevirtRelease(const std::optional<kube::KubevirtRelease>& release) {
  impl_->SetKubevirtRelease(release);
}
pci::VfioNodeSet Agent::NodeSet() const { return impl_->NodeSet(); }
DeviceSnapshot Agent::Snapshot() const { return impl_->Snapshot(); }
std::vector<ResourceStatus> Agent::Resources() const { return impl_->Resources(); }
std::optional<fabric::FabricStatus> Agent::Fabric() const { return impl_->Fabric(); }

absl::Status Serve(const ServeOptions& options) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  // Blocked before any thread starts, so every thread inherits the mask and sigwait sees the signal.
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  Agent agent(options);
  if (absl::Status status = agent.Start(); !status.ok()) return status;
  int signal = 0;
  sigwait(&signals, &signal);
  spdlog::info("signal {}: deregistering and removing sockets", signal);
  agent.Stop();
  return absl::OkStatus();
}

}  // namespace vfio_agent::plugin
