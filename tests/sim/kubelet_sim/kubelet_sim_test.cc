// Tests of the kubelet simulator against a stub device plugin served on a unix socket in a temp dir.
#include "kubelet_sim.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "podresources/v1/api.grpc.pb.h"

namespace vfio_agent::kubeletsim {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr char kResource[] = "example.com/gpu";
// How long a test waits for what must happen: it ends only a test that is failing anyway, so it is generous
// enough for a machine that is busy with something else.
constexpr std::chrono::milliseconds kPatience = 30s;

std::chrono::system_clock::time_point Deadline(std::chrono::milliseconds from_now) {
  return std::chrono::system_clock::now() + from_now;
}

struct TempDir {
  TempDir() {
    char tmpl[] = "/tmp/kubeletsimXXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path); }
  fs::path path;
};

::v1beta1::Device Dev(const std::string& id, const std::string& health = "Healthy",
                      std::vector<int64_t> numa = {}) {
  ::v1beta1::Device d;
  d.set_id(id);
  d.set_health(health);
  for (int64_t n : numa) d.mutable_topology()->add_nodes()->set_id(n);
  return d;
}

std::vector<::v1beta1::Device> FourDevices() {
  return {Dev("a0", "Healthy", {0}), Dev("a1", "Healthy", {0}), Dev("a2", "Healthy", {1}),
          Dev("a3", "Unhealthy", {1})};
}

// A device plugin with a fixed, settable device list; records what the kubelet side asked.
class StubPlugin final : public ::v1beta1::DevicePlugin::Service {
 public:
  using PreferFn = std::function<std::vector<std::string>(const ::v1beta1::ContainerPreferredAllocationRequest&)>;

  StubPlugin(fs::path socket, std::vector<::v1beta1::Device> devices, bool preferred = false)
      : socket_(std::move(socket)), devices_(std::move(devices)) {
    options_.set_get_preferred_allocation_available(preferred);
  }
  ~StubPlugin() override { Stop(); }

  void Start() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + socket_.string(), grpc::InsecureServerCredentials());
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr) << socket_;
  }
  void Stop() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (server_) {
      server_->Shutdown(Deadline(1000ms));
      server_->Wait();
      server_.reset();
    }
  }
  void SetDevices(std::vector<::v1beta1::Device> devices) {
    {
      std::lock_guard lock(mu_);
      devices_ = std::move(devices);
      ++version_;
    }
    cv_.notify_all();
  }
  void Resend() { SetDevices(Devices()); }
  std::vector<::v1beta1::Device> Devices() {
    std::lock_guard lock(mu_);
    return devices_;
  }
  void set_prefer(PreferFn fn) { prefer_ = std::move(fn); }
  void set_empty_allocate(bool empty) { empty_allocate_ = empty; }

  std::atomic<int> options_calls{0}, streams_ended{0}, preferred_calls{0};
  std::vector<::v1beta1::AllocateRequest> AllocateRequests() {
    std::lock_guard lock(record_mu_);
    return allocate_requests_;
  }
  std::vector<::v1beta1::PreferredAllocationRequest> PreferredRequests() {
    std::lock_guard lock(record_mu_);
    return preferred_requests_;
  }

  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const ::v1beta1::Empty*,
                                      ::v1beta1::DevicePluginOptions* out) override {
    ++options_calls;
    *out = options_;
    return grpc::Status::OK;
  }
  grpc::Status ListAndWatch(grpc::ServerContext* ctx, const ::v1beta1::Empty*,
                            grpc::ServerWriter<::v1beta1::ListAndWatchResponse>* writer) override {
    uint64_t sent = ~uint64_t{0};
    for (;;) {
      ::v1beta1::ListAndWatchResponse message;
      {
        std::unique_lock lock(mu_);
        cv_.wait_for(lock, 20ms, [&] { return stop_ || version_ != sent; });
        if (stop_ || ctx->IsCancelled()) break;
        if (version_ == sent) continue;
        sent = version_;
        for (const auto& d : devices_) *message.add_devices() = d;
      }
      if (!writer->Write(message)) break;
    }
    ++streams_ended;
    return grpc::Status::OK;
  }
  grpc::Status GetPreferredAllocation(grpc::ServerContext*, const ::v1beta1::PreferredAllocationRequest* request,
                                      ::v1beta1::PreferredAllocationResponse* out) override {
    ++preferred_calls;
    {
      std::lock_guard lock(record_mu_);
      preferred_requests_.push_back(*request);
    }
    for (const auto& container : request->container_requests()) {
      auto* answer = out->add_container_responses();
      for (const auto& id : prefer_ ? prefer_(container) : DefaultPreference(container)) answer->add_deviceids(id);
    }
    return grpc::Status::OK;
  }
  grpc::Status Allocate(grpc::ServerContext*, const ::v1beta1::AllocateRequest* request,
                        ::v1beta1::AllocateResponse* out) override {
    {
      std::lock_guard lock(record_mu_);
      allocate_requests_.push_back(*request);
    }
    if (empty_allocate_) return grpc::Status::OK;
    for (const auto& container : request->container_requests()) {
      std::vector<std::string> ids(container.devices_ids().begin(), container.devices_ids().end());
      std::sort(ids.begin(), ids.end());
      std::string joined;
      for (const auto& id : ids) joined += (joined.empty() ? "" : ",") + id;
      auto* response = out->add_container_responses();
      (*response->mutable_envs())["STUB_IDS"] = joined;
      auto* spec = response->add_devices();
      spec->set_container_path("/dev/vfio/vfio");
      spec->set_host_path("/dev/vfio/vfio");
      spec->set_permissions("rw");
    }
    return grpc::Status::OK;
  }

 private:
  // Must-include first, then the rest in descending ID order (deliberately not the kubelet's order).
  static std::vector<std::string> DefaultPreference(const ::v1beta1::ContainerPreferredAllocationRequest& c) {
    std::vector<std::string> out(c.must_include_deviceids().begin(), c.must_include_deviceids().end());
    std::vector<std::string> rest(c.available_deviceids().begin(), c.available_deviceids().end());
    std::sort(rest.rbegin(), rest.rend());
    for (const auto& id : rest) {
      if (static_cast<int>(out.size()) >= c.allocation_size()) break;
      if (std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
    }
    return out;
  }

  fs::path socket_;
  ::v1beta1::DevicePluginOptions options_;
  std::unique_ptr<grpc::Server> server_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  uint64_t version_ = 0;
  std::vector<::v1beta1::Device> devices_;
  PreferFn prefer_;
  std::atomic<bool> empty_allocate_{false};
  std::mutex record_mu_;
  std::vector<::v1beta1::AllocateRequest> allocate_requests_;
  std::vector<::v1beta1::PreferredAllocationRequest> preferred_requests_;
};

grpc::Status Register(const fs::path& kubelet_sock, const std::string& endpoint, const std::string& resource,
                      const std::string& version = "v1beta1", bool preferred_in_request = false) {
  auto stub = ::v1beta1::Registration::NewStub(
      grpc::CreateChannel("unix:" + kubelet_sock.string(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline(15000ms));
  ::v1beta1::RegisterRequest request;
  request.set_version(version);
  request.set_endpoint(endpoint);
  request.set_resource_name(resource);
  request.mutable_options()->set_get_preferred_allocation_available(preferred_in_request);
  ::v1beta1::Empty empty;
  return stub->Register(&ctx, request, &empty);
}

std::vector<std::string> Sorted(const google::protobuf::RepeatedPtrField<std::string>& ids) {
  std::vector<std::string> out(ids.begin(), ids.end());
  std::sort(out.begin(), out.end());
  return out;
}

const Event* FindEvent(const std::vector<Event>& events, const std::string& kind, size_t from = 0) {
  for (size_t i = from; i < events.size(); ++i) {
    if (events[i].kind == kind) return &events[i];
  }
  return nullptr;
}

class KubeletSimTest : public ::testing::Test {
 protected:
  Options Opts() {
    Options o;
    o.dir = tmp_.path / "device-plugins";
    o.pod_resources_socket = tmp_.path / "pod-resources" / "kubelet.sock";
    return o;
  }
  fs::path Sock(const std::string& name) { return tmp_.path / "device-plugins" / name; }
  static std::function<bool(const KubeletSim&)> Has(int64_t capacity, int64_t allocatable, bool registered) {
    return [=](const KubeletSim& s) {
      auto r = s.Resources();
      auto it = r.find(kResource);
      return it != r.end() && it->second.capacity == capacity && it->second.allocatable == allocatable &&
             it->second.registered == registered;
    };
  }
  static ResourceState State(const KubeletSim& sim) { return sim.Resources().at(kResource); }

  TempDir tmp_;
};

TEST(ResourceNameTest, FollowsIsExtendedResourceName) {
  for (const char* ok : {"example.com/foo", "nvidia.com/GP102GL_TESLA_P40", "kubernetes.io.example.com/x",
                         "nvidia.com/GH100_H200_SXM_141GB", "a.b/c.d-e_f"}) {
    EXPECT_TRUE(IsExtendedResourceName(ok)) << ok;
  }
  for (const char* bad : {"foo", "kubernetes.io/foo", "gpu.kubernetes.io/foo", "requests.example.com/foo",
                          "Example.com/foo", "example.com/", "example.com/a/b", "/foo", "example.com/-x",
                          "example.com/x-", "exa_mple.com/x", "example..com/x", "example.com/a b"}) {
    EXPECT_FALSE(IsExtendedResourceName(bad)) << bad;
  }
  EXPECT_TRUE(IsExtendedResourceName("example.com/" + std::string(63, 'x')));
  EXPECT_FALSE(IsExtendedResourceName("example.com/" + std::string(64, 'x')));
  const std::string label(63, 'a');
  const std::string domain244 = label + "." + label + "." + label + "." + std::string(52, 'a');
  ASSERT_EQ(domain244.size(), 244u);
  EXPECT_TRUE(IsExtendedResourceName(domain244 + "/x"));
  EXPECT_FALSE(IsExtendedResourceName(domain244 + "a/x"));
}

TEST_F(KubeletSimTest, RegisterDialsBackAndConsumesListAndWatch) {
  KubeletSim sim(Opts());
  ASSERT_TRUE(sim.Start().ok());
  EXPECT_EQ(fs::status(Opts().dir).permissions() & fs::perms::all, static_cast<fs::perms>(0750));
  StubPlugin plugin(Sock("stub-a.sock"), FourDevices(), /*preferred=*/true);
  plugin.Start();

  const grpc::Status status = Register(sim.kubelet_socket(), "stub-a.sock", kResource);
  ASSERT_TRUE(status.ok()) << status.error_message();
  // The options were fetched inside Register, before the reply (R3).
  EXPECT_EQ(plugin.options_calls.load(), 1);
  ASSERT_TRUE(sim.WaitFor(Has(4, 3, true), kPatience)) << sim.DescribeNode();

  const ResourceState state = State(sim);
  EXPECT_EQ(state.registrations, 1);
  EXPECT_EQ(state.list_updates, 1);
  EXPECT_EQ(state.healthy, (std::vector<std::string>{"a0", "a1", "a2"}));
  EXPECT_EQ(state.unhealthy, (std::vector<std::string>{"a3"}));
  EXPECT_EQ(state.topology.at("a2"), (std::vector<int64_t>{1}));
  EXPECT_EQ(state.endpoint, Sock("stub-a.sock").string());
  EXPECT_TRUE(state.options.get_preferred_allocation_available());

  const auto events = sim.Events();
  const Event* listen = FindEvent(events, "listen");
  const Event* reg = FindEvent(events, "register");
  const Event* options = FindEvent(events, "options");
  const Event* list = FindEvent(events, "list");
  ASSERT_TRUE(listen && reg && options && list);
  EXPECT_LE(listen->at, reg->at);
  EXPECT_LE(reg->at, options->at);
  EXPECT_LE(options->at, list->at);
  EXPECT_EQ(reg->detail, "version=v1beta1 endpoint=stub-a.sock");
  EXPECT_TRUE(options->detail.starts_with("pre_start_required=false get_preferred_allocation_available=")) << options->detail;

  EXPECT_EQ(sim.DescribeNode(), "Capacity:\n  example.com/gpu:  4\nAllocatable:\n  example.com/gpu:  3\n");

  sim.Stop();  // returns (rather than hangs) with a live stream open
  EXPECT_FALSE(fs::exists(sim.kubelet_socket()));
  EXPECT_TRUE(sim.WaitFor([&](const KubeletSim&) { return plugin.streams_ended.load() == 1; }, kPatience));
}

TEST_F(KubeletSimTest, RejectsUnsupportedVersionWithTheKubeletsMessage) {
  KubeletSim sim(Opts());
  ASSERT_TRUE(sim.Start().ok());
  StubPlugin plugin(Sock("stub-a.sock"), FourDevices());
  plugin.Start();
  const grpc::Status status = Register(sim.kubelet_socket(), "stub-a.sock", kResource, "v1alpha");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNKNOWN);
  EXPECT_EQ(status.error_message(),
            "requested API version \"v1alpha\" is not supported by kubelet. Supported version is [\"v1beta1\"]");
  EXPECT_EQ(plugin.options_calls.load(), 0);
  EXPECT_TRUE(sim.Resources().empty());
  ASSERT_NE(FindEvent(sim.Events(), "error"), nullptr);
}

TEST_F(KubeletSimTest, RejectsInvalidResourceNamesWithTheKubeletsMessage) {
  KubeletSim sim(Opts());
  ASSERT_TRUE(sim.Start().ok());
  StubPlugin plugin(Sock("stub-a.sock"), FourDevices());
  plugin.Start();
  for (const std::string name : {"foo", "kubernetes.io/foo", "requests.example.com/foo", "Example.com/foo"}) {
    const grpc::Status status = Register(sim.kubelet_socket(), "stub-a.sock", name);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNKNOWN) << name;
    EXPECT_EQ(status.error_message(), "the ResourceName \"" + name + "\" is invalid");
  }
  EXPECT_EQ(plugin.options_calls.load(), 0);
  EXPECT_TRUE(sim.Resources().empty());
}

TEST_F(KubeletSimTest, RegisterFailsWhenNothingServesTheEndpoint) {
  Options o = Opts();
  o.dial_timeout = 300ms;
  KubeletSim sim(o);
  ASSERT_TRUE(sim.Start().ok());
  const auto started = Clock::now();
  const grpc::Status status = Register(sim.kubelet_socket(), "missing.sock", kResource);
  const auto took = Clock::now() - started;
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNKNOWN);
  EXPECT_EQ(status.error_message(), "failed to dial device plugin: context deadline exceeded");
  EXPECT_GE(took, 300ms);  // the dial timeout elapsed: certain, whatever the machine's speed
  EXPECT_TRUE(sim.Resources().empty());
}

TEST_F(KubeletSimTest, EachListReplacesTheSetAndRepeatsAndDuplicatesAreCounted) {
  KubeletSim sim(Opts());
  ASSERT_TRUE(sim.Start().ok());
  StubPlugin plugin(Sock("stub-a.sock"), FourDevices());
  plugin.Start();
  ASSERT_TRUE(Register(sim.kubelet_socket(), "stub-a.sock", kResource).ok());
  ASSERT_TRUE(sim.WaitFor(Has(4, 3, true), kPatience));

  plugin.SetDevices({Dev("a0"), Dev("a1", "Unhealthy")});
  ASSERT_TRUE(sim.WaitFor(Has(2, 1, true), kPatience)) << sim.DescribeNode();
  EXPECT_EQ(State(sim).identical_repeats, 0);

  plugin.Resend();
  ASSERT_TRUE(sim.WaitFor([](const KubeletSim& s) { return State(s).list_updates == 3; }, kPatience));
  EXPECT_EQ(State(sim).identical_repeats, 1);

  // A duplicated ID lands in both sets; health is matched exactly ("healthy" is unhealthy).
  plugin.SetDevices({Dev("a0"), Dev("a0", "Unhealthy"), Dev("a1", "healthy")});
  ASSERT_TRUE(sim.WaitFor(Has(3, 1, true), kPatience)) << sim.DescribeNode();
  EXPECT_EQ(State(sim).duplicate_ids, 1);
  EXPECT_EQ(State(sim).unhealthy, (std::vector<std::string>{"a0", "a1"}));

  plugin.SetDevices({});
  ASSERT_TRUE(sim.WaitFor(Has(0, 0, true), kPatience)) << sim.DescribeNode();
}

TEST_F(KubeletSimTest, StreamEndMakesEverythingUnhealthyAndGraceExpiryRemovesTheResource) {
  auto fake_now = std::make_shared<std::atomic<int64_t>>(0);
  Options o = Opts();
  o.clock = [fake_now] { return Clock::time_point(std::chrono::nanoseconds(fake_now->load())); };
  KubeletSim sim(o);
  ASSERT_TRUE(sim.Start().ok());
  StubPlugin plugin(Sock("stub-a.sock"), FourDevices());
  plugin.Start();
  ASSERT_TRUE(Register(sim.kubelet_socket(), "stub-a.sock", kResource).ok());
  ASSERT_TRUE(sim.WaitFor(Has(4, 3, true), kPatience));

  ASSERT_TRUE(sim.CloseStream(kResource).ok());
  ASSERT_TRUE(sim.WaitFor(Has(4, 0, false), kPatience)) << sim.DescribeNode();
  EXPECT_TRUE(sim.WaitFor([&](const KubeletSim&) { return plugin.streams_ended.load() == 1; }, kPatience));
  EXPECT_NE(FindEvent(sim.Events(), "stream_end"), nullptr);
  EXPECT_TRUE(fs::exists(sim.kubelet_socket()));
  EXPECT_EQ(sim.CloseStream(kResource).code(), absl::StatusCode::kNotFound);

  *fake_now = std::chrono::nanoseconds(std::chrono::minutes(5) - 1s).count();
  EXPECT_FALSE(State(sim).removed);
  *fake_now = std::chrono::nanoseconds(std::chrono::minutes(5)).count();
  EXPECT_TRUE(State(sim).removed);
  EXPECT_EQ(State(sim).capacity, 0);
  EXPECT_EQ(sim.DescribeNode(), "Capacity:\n  example.com/gpu:  0\nAllocatable:\n  example.com/gpu:  0\n");
  auto pod = sim.Admit(PodSpec{"late", {{kResource, 1}}});
  EXPECT_EQ(pod.status().message(), "cannot allocate unregistered device example.com/gpu");

  // Re-registration brings it back.
  StubPlugin again(Sock("stub-b.sock"), FourDevices());
  again.Start();
  ASSERT_TRUE(Register(sim.kubelet_socket(), "stub-b.sock", kResource).ok());
  ASSERT_TRUE(sim.WaitFor(Has(4, 3, true), kPatience)) << sim.DescribeNode();
  EXPECT_EQ(State(sim).registrations, 2);
}

TEST_F(KubeletSimTest, PluginShutdownEndsTheStream) {
  KubeletSim sim(Opts());
  ASSERT_TRUE(sim.Start().ok());
  StubPlugin plugin(Sock("stub-a.sock"), FourDevices());
  plugin.Start();
  ASSERT_TRUE(Register(sim.kubelet_socket(), "stub-a.sock", kResource).ok());
  ASSERT_TRUE(sim.WaitFor(Has(4, 3, true), kPatience));
  plugin.Stop();
  ASSERT_TRUE(sim.WaitFor(Has(4, 0, false), kPatience)) << sim.DescribeNode();
}

class TakeoverTest : public KubeletSimTest, public ::testing::WithParamInterface<Mode> {};

// R22: an old instance's stream ending after a new instance registered.
TEST_P(TakeoverTest, OldStreamEndHitsTheNewClientOnlyWhenResourceKeyed) {
  Options o = Opts();
  o.mode = GetParam();
  KubeletSim sim(o);
  ASSERT_TRUE(sim.Start().ok());
  StubPlugin old_instance(Sock("old.sock"), FourDevices());
  old_instance.Start();
  ASSERT_TRUE(Register(sim.kubelet_socket(), "old.sock", kResource).ok());
  ASSERT_TRUE(sim.WaitFor(Has(4, 3, true), kPatience));
  StubPlugin new_instance(Sock("new.sock"), {Dev("a0"), Dev("a1")});
  new_instance.Start();
  ASSERT_TRUE(Register(sim.kubelet_socket(), "new.sock", kResource).ok());
  ASSERT_TRUE(sim.WaitFor(Has(2, 2, true), kPatience)) << sim.DescribeNode();
  EXPECT_EQ(State(sim).endpoint, Sock("new.sock").string());

  old_instance.Stop();
  if (GetParam() == Mode::kResourceKeyed) {
    ASSERT_TRUE(sim.WaitFor(Has(2, 0, false), kPatience)) << sim.DescribeNode();
    EXPECT_TRUE(sim.WaitFor([&](const KubeletSim&) { return new_instance.streams_ended.load() == 1; }, kPatience));
  } else {
    ASSERT_TRUE(sim.WaitFor([&](const KubeletSim&) { return old_instance.streams_ended.load() == 1; }, kPatience));
    // What must NOT happen (the new registration dropped) has no event to wait for; a slow machine can only
    // make this grace too short to catch a regression, never fail a correct simulator.
    std::this_thread::sleep_for(200ms);
    EXPECT_TRUE(Has(2, 2, true)(sim)) << sim.DescribeNode();
    EXPECT_EQ(new_instance.streams_ended.load(), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, TakeoverTest, ::testing::Values(Mode::kResourceKeyed, Mode::kInstanceKeyed));

TEST_F(KubeletSimTest, RestartDeletesSocketsThenListensAfterTheDelay) {
  Options o = Opts();
  o.kubelet_sock_delay = 200ms;
  KubeletSim sim(o);
  ASSERT_TRUE(sim.Start().ok());
  StubPlugin plugin(Sock("stub-a.sock"), FourDevices());
  plugin.Start();
  ASSERT_TRUE(Register(sim.kubelet_socket(), "stub-a.sock", kResource).ok());
  ASSERT_TRUE(sim.WaitFor(Has(4, 3, true), kPatience));
  { std::ofstream(Sock("kubelet_internal_checkpoint")) << "{}"; }
  { std::ofstream(Sock("notes.txt")) << "x"; }

  absl::Status restarted;
  std::thread restart([&] { restarted = sim.Restart(); });
  Clock::time_point deleted, listening;
  const auto give_up = Clock::now() + 5s;
  while (fs::exists(Sock("stub-a.sock")) && Clock::now() < give_up) std::this_thread::sleep_for(1ms);
  deleted = Clock::now();
  while (!fs::exists(sim.kubelet_socket()) && Clock::now() < give_up) std::this_thread::sleep_for(1ms);
  listening = Clock::now();
  restart.join();
  ASSERT_TRUE(restarted.ok()) << restarted;
  EXPECT_GE(listening - deleted, 150ms);
  EXPECT_TRUE(fs::exists(Sock("kubelet_internal_checkpoint")));
  EXPECT_TRUE(fs::exists(Sock("notes.txt")));
  EXPECT_TRUE(sim.WaitFor([&](const KubeletSim&) { return plugin.streams_ended.load() == 1; }, kPatience));

  // Checkpoint semantics: a stopped endpoint with empty sets.
  EXPECT_TRUE(Has(0, 0, false)(sim)) << sim.DescribeNode();
  const auto events = sim.Events();
  const Event* restart_event = FindEvent(events, "restart");
  ASSERT_NE(restart_event, nullptr);
  const size_t after = restart_event - events.data();
  const Event* swept = FindEvent(events, "sockets_deleted", after);
  const Event* listen = FindEvent(events, "listen", after);
  ASSERT_TRUE(swept && listen);
  EXPECT_GE(listen->at - swept->at, 200ms);

  StubPlugin again(Sock("stub-b.sock"), FourDevices());
  again.Start();
  ASSERT_TRUE(Register(sim.kubelet_socket(), "stub-b.sock", kResource).ok());
  ASSERT_TRUE(sim.WaitFor(Has(4, 3, true), kPatience)) << sim.DescribeNode();
}

TEST_F(KubeletSimTest, LegacyModeRepliesAtOnceAndUsesTheRequestOptions) {
  Options o = Opts();
  o.mode = Mode::kLegacy124;
  fs::create_directories(o.dir);
  { std::ofstream(o.dir / "stale-file") << "x"; }
  KubeletSim sim(o);
  ASSERT_TRUE(sim.Start().ok());
  EXPECT_FALSE(fs::exists(o.dir / "stale-file"));

  StubPlugin plugin(Sock("stub-a.sock"), FourDevices(), /*preferred=*/false);
  // Register succeeds although nothing serves the endpoint yet: the kubelet <= 1.24 dials asynchronously.
  ASSERT_TRUE(Register(sim.kubelet_socket(), "stub-a.sock", kResource, "v1beta1", /*preferred_in_request=*/true).ok());
  plugin.Start();
  ASSERT_TRUE(sim.WaitFor(Has(4, 3, true), kPatience)) << sim.DescribeNode();
  EXPECT_EQ(plugin.options_calls.load(), 0);
  EXPECT_TRUE(State(sim).options.get_preferred_allocation_available());
}

TEST_F(KubeletSimTest, AdmissionCallsPreferredThenAllocateWithOneContainerRequest) {
  KubeletSim sim(Opts());
  ASSERT_TRUE(sim.Start().ok());
  StubPlugin plugin(Sock("stub-a.sock"), {Dev("a0", "Healthy", {0}), Dev("a1", "Healthy", {0}),
                                          Dev("a2", "Healthy", {1}), Dev("a3", "Healthy", {1})},
                    /*preferred=*/true);
  plugin.Start();
  ASSERT_TRUE(Register(sim.kubelet_socket(), "stub-a.sock", kResource).ok());
  ASSERT_TRUE(sim.WaitFor(Has(4, 4, true), kPatience));

  // NUMA 0 holds two free devices for a request of one: the plugin chooses among them (R19 case A).
  auto p1 = sim.Admit(PodSpec{"p1", {{kResource, 1}}});
  ASSERT_TRUE(p1.ok()) << p1.status();
  ASSERT_EQ(plugin.preferred_calls.load(), 1);
  {
    const auto request = plugin.PreferredRequests().at(0);
    ASSERT_EQ(request.container_requests_size(), 1);
    EXPECT_EQ(Sorted(request.container_requests(0).available_deviceids()), (std::vector<std::string>{"a0", "a1"}));
    EXPECT_EQ(request.container_requests(0).must_include_deviceids_size(), 0);
    EXPECT_EQ(request.container_requests(0).allocation_size(), 1);
  }
  EXPECT_EQ(p1->preferred_calls_result.at(kResource), (std::vector<std::string>{"a1"}));
  EXPECT_EQ(p1->devices.at(kResource), (std::vector<std::string>{"a1"}));
  const auto allocate_requests = plugin.AllocateRequests();
  ASSERT_EQ(allocate_requests.size(), 1u);
  ASSERT_EQ(allocate_requests[0].container_requests_size(), 1);
  EXPECT_EQ(Sorted(allocate_requests[0].container_requests(0).devices_ids()), (std::vector<std::string>{"a1"}));
  EXPECT_EQ(p1->responses.at(kResource).envs().at("STUB_IDS"), "a1");
  const auto events = sim.Events();
  const Event* preferred = FindEvent(events, "preferred");
  const Event* allocate = FindEvent(events, "allocate");
  ASSERT_TRUE(preferred && allocate);
  EXPECT_LE(preferred->at, allocate->at);

  // NUMA 1 exactly covers two: no GetPreferredAllocation call.
  auto p2 = sim.Admit(PodSpec{"p2", {{kResource, 2}}});
  ASSERT_TRUE(p2.ok()) << p2.status();
  EXPECT_EQ(plugin.preferred_calls.load(), 1);
  EXPECT_EQ(p2->preferred_calls_result.count(kResource), 0u);
  EXPECT_EQ(p2->devices.at(kResource), (std::vector<std::string>{"a2", "a3"}));

  auto p3 = sim.Admit(PodSpec{"p3", {{kResource, 2}}});
  ASSERT_FALSE(p3.ok());
  EXPECT_EQ(p3.status().message(),
            "requested number of devices unavailable for example.com/gpu. Requested: 2, Available: 1");

  sim.Release("p1");
  auto p4 = sim.Admit(PodSpec{"p4", {{kResource, 2}}});
  ASSERT_TRUE(p4.ok()) << p4.status();
  EXPECT_EQ(p4->devices.at(kResource), (std::vector<std::string>{"a0", "a1"}));
  EXPECT_EQ(p4->responses.at(kResource).envs().at("STUB_IDS"), "a0,a1");
  EXPECT_EQ(sim.Pods().size(), 2u);
}

TEST_F(KubeletSimTest, PreferredAnswerIsIntersectedWithCandidatesAndShortfallFilled) {
  KubeletSim sim(Opts());
  ASSERT_TRUE(sim.Start().ok());
  StubPlugin plugin(Sock("stub-a.sock"), {Dev("b0"), Dev("b1"), Dev("b2"), Dev("b3")}, /*preferred=*/true);
  plugin.set_prefer([](const auto&) { return std::vector<std::string>{"bogus", "b3"}; });
  plugin.Start();
  ASSERT_TRUE(Register(sim.kubelet_socket(), "stub-a.sock", kResource).ok());
  ASSERT_TRUE(sim.WaitFor(Has(4, 4, true), kPatience));

  auto pod = sim.Admit(PodSpec{"p", {{kResource, 2}}});
  ASSERT_TRUE(pod.ok()) << pod.status();
  // No topology: the candidates are every free healthy device.
  EXPECT_EQ(Sorted(plugin.PreferredRequests().at(0).container_requests(0).available_deviceids()),
            (std::vector<std::string>{"b0", "b1", "b2", "b3"}));
  const auto& ids = pod->devices.at(kResource);
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_NE(std::find(ids.begin(), ids.end(), "b3"), ids.end());
  EXPECT_EQ(std::find(ids.begin(), ids.end(), "bogus"), ids.end());
}

TEST_F(KubeletSimTest, NoPreferredCallWhenTheOptionIsOff) {
  KubeletSim sim(Opts());
  ASSERT_TRUE(sim.Start().ok());
  StubPlugin plugin(Sock("stub-a.sock"), {Dev("b0"), Dev("b1"), Dev("b2")}, /*preferred=*/false);
  plugin.Start();
  ASSERT_TRUE(Register(sim.kubelet_socket(), "stub-a.sock", kResource).ok());
  ASSERT_TRUE(sim.WaitFor(Has(3, 3, true), kPatience));
  auto pod = sim.Admit(PodSpec{"p", {{kResource, 2}}});
  ASSERT_TRUE(pod.ok()) << pod.status();
  EXPECT_EQ(plugin.preferred_calls.load(), 0);
  EXPECT_TRUE(pod->preferred_calls_result.empty());
  EXPECT_EQ(pod->devices.at(kResource).size(), 2u);
}

TEST_F(KubeletSimTest, EmptyAllocateResponseFailsAdmissionAndFreesTheDevices) {
  KubeletSim sim(Opts());
  ASSERT_TRUE(sim.Start().ok());
  StubPlugin plugin(Sock("stub-a.sock"), {Dev("b0"), Dev("b1")});
  plugin.set_empty_allocate(true);
  plugin.Start();
  ASSERT_TRUE(Register(sim.kubelet_socket(), "stub-a.sock", kResource).ok());
  ASSERT_TRUE(sim.WaitFor(Has(2, 2, true), kPatience));
  auto pod = sim.Admit(PodSpec{"p", {{kResource, 2}}});
  ASSERT_FALSE(pod.ok());
  EXPECT_EQ(pod.status().message().rfind("no containers return in allocation response", 0), 0u) << pod.status();
  plugin.set_empty_allocate(false);
  auto retry = sim.Admit(PodSpec{"p", {{kResource, 2}}});
  ASSERT_TRUE(retry.ok()) << retry.status();
}

TEST_F(KubeletSimTest, PodResourcesReportsHealthyAllocatableAndPodDevicesPerNumaNode) {
  KubeletSim sim(Opts());
  ASSERT_TRUE(sim.Start().ok());
  StubPlugin plugin(Sock("stub-a.sock"), {Dev("c0", "Healthy", {0}), Dev("c1", "Healthy", {0, 1}),
                                          Dev("c2"), Dev("c3", "Unhealthy", {1})});
  plugin.Start();
  ASSERT_TRUE(Register(sim.kubelet_socket(), "stub-a.sock", kResource).ok());
  ASSERT_TRUE(sim.WaitFor(Has(4, 3, true), kPatience));

  auto lister = ::v1::PodResourcesLister::NewStub(grpc::CreateChannel(
      "unix:" + Opts().pod_resources_socket.string(), grpc::InsecureChannelCredentials()));
  std::vector<std::string> entries;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline(kPatience));
    ::v1::AllocatableResourcesResponse response;
    ASSERT_TRUE(lister->GetAllocatableResources(&ctx, {}, &response).ok());
    for (const auto& d : response.devices()) {
      ASSERT_EQ(d.device_ids_size(), 1);
      ASSERT_LE(d.topology().nodes_size(), 1);
      entries.push_back(d.resource_name() + "/" + d.device_ids(0) +
                        (d.topology().nodes_size() ? "@" + std::to_string(d.topology().nodes(0).id()) : ""));
    }
  }
  std::sort(entries.begin(), entries.end());
  EXPECT_EQ(entries, (std::vector<std::string>{"example.com/gpu/c0@0", "example.com/gpu/c1@0",
                                                "example.com/gpu/c1@1", "example.com/gpu/c2"}));

  auto pod = sim.Admit(PodSpec{"vm", {{kResource, 3}}});
  ASSERT_TRUE(pod.ok()) << pod.status();
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline(kPatience));
    ::v1::ListPodResourcesResponse response;
    ASSERT_TRUE(lister->List(&ctx, {}, &response).ok());
    ASSERT_EQ(response.pod_resources_size(), 1);
    const auto& p = response.pod_resources(0);
    EXPECT_EQ(p.name(), "vm");
    EXPECT_EQ(p.namespace_(), "default");
    ASSERT_EQ(p.containers_size(), 1);
    EXPECT_EQ(p.containers(0).name(), "app");
    EXPECT_EQ(p.containers(0).devices_size(), 4);  // c1 spans two NUMA nodes
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline(kPatience));
    ::v1::GetPodResourcesRequest request;
    request.set_pod_name("absent");
    request.set_pod_namespace("default");
    ::v1::GetPodResourcesResponse response;
    const grpc::Status status = lister->Get(&ctx, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNKNOWN);
    EXPECT_EQ(status.error_message(), "pod absent in namespace default not found");
  }
}

TEST_F(KubeletSimTest, FrozenUpdatesLeaveAStaleViewInResourcesAndPodResources) {
  KubeletSim sim(Opts());
  ASSERT_TRUE(sim.Start().ok());
  StubPlugin plugin(Sock("stub-a.sock"), {Dev("d0"), Dev("d1")});
  plugin.Start();
  ASSERT_TRUE(Register(sim.kubelet_socket(), "stub-a.sock", kResource).ok());
  ASSERT_TRUE(sim.WaitFor(Has(2, 2, true), kPatience));
  EXPECT_EQ(sim.FreezeUpdates("example.com/absent", true).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(sim.FreezeUpdates(kResource, true).ok());

  plugin.SetDevices({Dev("d0"), Dev("d1", "Unhealthy")});
  ASSERT_TRUE(sim.WaitFor([](const KubeletSim& k) { return FindEvent(k.Events(), "list_ignored") != nullptr; },
                          kPatience));
  EXPECT_EQ(sim.Resources().at(kResource).healthy, (std::vector<std::string>{"d0", "d1"}));
  auto lister = ::v1::PodResourcesLister::NewStub(grpc::CreateChannel(
      "unix:" + Opts().pod_resources_socket.string(), grpc::InsecureChannelCredentials()));
  auto allocatable_ids = [&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline(kPatience));
    ::v1::AllocatableResourcesResponse response;
    EXPECT_TRUE(lister->GetAllocatableResources(&ctx, {}, &response).ok());
    std::vector<std::string> ids;
    for (const auto& d : response.devices()) ids.insert(ids.end(), d.device_ids().begin(), d.device_ids().end());
    std::sort(ids.begin(), ids.end());
    return ids;
  };
  EXPECT_EQ(allocatable_ids(), (std::vector<std::string>{"d0", "d1"}));

  ASSERT_TRUE(sim.FreezeUpdates(kResource, false).ok());
  plugin.Resend();
  ASSERT_TRUE(sim.WaitFor(Has(2, 1, true), kPatience));
  EXPECT_EQ(allocatable_ids(), (std::vector<std::string>{"d0"}));
}

std::pair<int, std::string> RunAndRead(FILE* pipe) {
  std::string output;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) output.append(buffer, n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

TEST_F(KubeletSimTest, CliWaitsForDevicesAdmitsAPodAndDescribesTheNode) {
  const std::string command = std::string(KUBELET_SIM_BIN) + " --dir " + Opts().dir.string() +
                              " --wait example.com/gpu=3 --timeout-ms 5000 --admit vm:example.com/gpu=2 --describe";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  // The socket file exists from bind(), a moment before listen(); the banner comes after both.
  char banner[512] = {};
  ASSERT_NE(fgets(banner, sizeof banner, pipe), nullptr);
  EXPECT_EQ(std::string(banner), "kubelet-sim: listening on " + Sock("kubelet.sock").string() + "\n");
  StubPlugin plugin(Sock("stub-a.sock"), FourDevices());
  plugin.Start();
  const grpc::Status registered = Register(Sock("kubelet.sock"), "stub-a.sock", kResource);
  const auto [rc, output] = RunAndRead(pipe);  // the rest of the output
  ASSERT_TRUE(registered.ok()) << registered.error_message();
  EXPECT_EQ(rc, 0) << output;
  EXPECT_NE(output.find("pod vm: admitted"), std::string::npos) << output;
  EXPECT_NE(output.find("      STUB_IDS="), std::string::npos) << output;
  EXPECT_NE(output.find("      /dev/vfio/vfio -> /dev/vfio/vfio (rw)"), std::string::npos) << output;
  EXPECT_NE(output.find("Capacity:\n  example.com/gpu:  4\nAllocatable:\n  example.com/gpu:  3\n"), std::string::npos)
      << output;
}

TEST_F(KubeletSimTest, CliFailsClearlyWhenDevicesNeverShowUp) {
  const std::string command = std::string(KUBELET_SIM_BIN) + " --dir " + Opts().dir.string() +
                              " --wait example.com/gpu=1 --timeout-ms 200 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  const auto [rc, output] = RunAndRead(pipe);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(output.find("timed out after 200 ms waiting for example.com/gpu: 0 healthy of 1 wanted (never registered)"),
            std::string::npos)
      << output;
}

}  // namespace
}  // namespace vfio_agent::kubeletsim
