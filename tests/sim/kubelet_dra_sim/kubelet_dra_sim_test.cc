// The DRA kubelet simulator against a hand-made plugin whose GetInfo answer each test chooses: the kubelet's
// registration rules (type, supported services in the plugin's order, refusals notified with the kubelet's
// message), the watcher's filters, deregistration and restart.
#include "kubelet_dra_sim.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <fstream>
#include <mutex>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "dra/v1beta1/api.grpc.pb.h"
#include "pluginregistration/v1/api.grpc.pb.h"
#include "support/sysfs_tree.h"

namespace vfio_agent::kubeletsim::dra {
namespace {

using namespace std::chrono_literals;
namespace drav1beta1 = ::k8s::io::kubelet::pkg::apis::dra::v1beta1;

// A plugin that answers GetInfo with `info` and records what the kubelet notified; it also serves DRAPlugin
// v1beta1 (only), answering each claim with one device named after it.
class FakePlugin final : public pluginregistration::Registration::Service, public drav1beta1::DRAPlugin::Service {
 public:
  FakePlugin(const std::filesystem::path& reg_socket, const std::filesystem::path& dra_socket,
             pluginregistration::PluginInfo info)
      : info_(std::move(info)) {
    std::filesystem::create_directories(dra_socket.parent_path());
    grpc::ServerBuilder dra;
    dra.AddListeningPort("unix:" + dra_socket.string(), grpc::InsecureServerCredentials());
    dra.RegisterService(static_cast<drav1beta1::DRAPlugin::Service*>(this));
    dra_server_ = dra.BuildAndStart();
    grpc::ServerBuilder reg;
    reg.AddListeningPort("unix:" + reg_socket.string(), grpc::InsecureServerCredentials());
    reg.RegisterService(static_cast<pluginregistration::Registration::Service*>(this));
    reg_server_ = reg.BuildAndStart();
  }
  ~FakePlugin() override {
    reg_server_->Shutdown();
    dra_server_->Shutdown();
  }

  grpc::Status GetInfo(grpc::ServerContext*, const pluginregistration::InfoRequest*,
                       pluginregistration::PluginInfo* info) override {
    std::lock_guard lock(mu_);
    ++get_info_calls_;
    *info = info_;
    return grpc::Status::OK;
  }
  grpc::Status NotifyRegistrationStatus(grpc::ServerContext*, const pluginregistration::RegistrationStatus* status,
                                        pluginregistration::RegistrationStatusResponse*) override {
    std::lock_guard lock(mu_);
    notifications_.push_back(*status);
    return grpc::Status::OK;
  }
  grpc::Status NodePrepareResources(grpc::ServerContext*, const drav1beta1::NodePrepareResourcesRequest* request,
                                    drav1beta1::NodePrepareResourcesResponse* response) override {
    for (const auto& claim : request->claims()) {
      drav1beta1::Device* device = (*response->mutable_claims())[claim.uid()].add_devices();
      device->set_device_name("dev-" + claim.name());
      device->add_cdi_device_ids("example.com/claim=" + claim.uid());
    }
    return grpc::Status::OK;
  }

  int GetInfoCalls() const {
    std::lock_guard lock(mu_);
    return get_info_calls_;
  }
  std::vector<pluginregistration::RegistrationStatus> Notifications() const {
    std::lock_guard lock(mu_);
    return notifications_;
  }

 private:
  const pluginregistration::PluginInfo info_;
  mutable std::mutex mu_;
  int get_info_calls_ = 0;
  std::vector<pluginregistration::RegistrationStatus> notifications_;
  std::unique_ptr<grpc::Server> dra_server_, reg_server_;
};

class KubeletDraSimTest : public ::testing::Test {
 protected:
  std::filesystem::path Registry() const { return dir_.path() / "registry"; }
  std::filesystem::path DraSocket() const { return dir_.path() / "plugins/example.com/dra.sock"; }

  pluginregistration::PluginInfo Info(std::vector<std::string> versions, std::string type = "DRAPlugin") const {
    pluginregistration::PluginInfo info;
    info.set_type(type);
    info.set_name("example.com");
    info.set_endpoint(DraSocket().string());
    for (const std::string& v : versions) info.add_supported_versions(v);
    return info;
  }

  std::unique_ptr<FakePlugin> StartPlugin(pluginregistration::PluginInfo info) {
    std::filesystem::create_directories(Registry());
    return std::make_unique<FakePlugin>(Registry() / "example.com-reg.sock", DraSocket(), std::move(info));
  }

  KubeletDraSim& Sim() {
    if (!sim_) {
      sim_ = std::make_unique<KubeletDraSim>(Options{.registry_dir = Registry()});
      EXPECT_TRUE(sim_->Start().ok());
    }
    return *sim_;
  }

  testing::TempDir dir_{"va-dra-sim"};
  std::unique_ptr<KubeletDraSim> sim_;
};

bool Notified(const FakePlugin& plugin) { return !plugin.Notifications().empty(); }

TEST_F(KubeletDraSimTest, TakesThePluginsFirstKnownServiceAndCallsThroughIt) {
  auto plugin = StartPlugin(Info({"v2.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAPlugin"}));
  KubeletDraSim& sim = Sim();
  ASSERT_TRUE(sim.WaitFor([](const KubeletDraSim& s) { return s.Count("register") == 1; }, 30s));
  const Plugin registered = sim.Plugins().at("example.com");
  EXPECT_EQ(registered.service, "v1beta1.DRAPlugin");
  EXPECT_EQ(registered.endpoint, DraSocket().string());
  EXPECT_TRUE(registered.connected);
  ASSERT_EQ(plugin->Notifications().size(), 1u);
  EXPECT_TRUE(plugin->Notifications()[0].plugin_registered());

  auto response = sim.Prepare("example.com", {MakeClaim("ns", "c1", "uid-1")});
  ASSERT_TRUE(response.ok()) << response.status();
  ASSERT_EQ(response->claims().at("uid-1").devices_size(), 1);
  EXPECT_EQ(response->claims().at("uid-1").devices(0).device_name(), "dev-c1");
  EXPECT_EQ(response->claims().at("uid-1").devices(0).cdi_device_ids(0), "example.com/claim=uid-1");
}

// Which health service each kubelet release opens (pickHealthService in 1.37; 1.36 knows v1alpha1 only). The fake
// plugin serves none, so each stream ends at once with UNIMPLEMENTED.
TEST_F(KubeletDraSimTest, A137KubeletOpensV1HealthWhenListedAndNoStreamWhenNothingIsListed) {
  auto plugin = StartPlugin(Info({"v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth", "v1.DRAResourceHealth"}));
  sim_ = std::make_unique<KubeletDraSim>(
      Options{.registry_dir = Registry(), .health_api = Options::HealthApi::k137});
  ASSERT_TRUE(sim_->Start().ok());
  ASSERT_TRUE(sim_->WaitFor([](const KubeletDraSim& s) { return s.Count("health-end") > 0; }, 30s));
  EXPECT_EQ(sim_->Plugins().at("example.com").health_service, "v1.DRAResourceHealth");
  for (const Event& event : sim_->Events()) {
    if (event.kind == "health-stream") {
      EXPECT_EQ(event.detail, "v1.DRAResourceHealth");
    }
    if (event.kind == "health-end") {
      EXPECT_EQ(event.detail.substr(0, 3), "12 ") << event.detail;  // UNIMPLEMENTED
    }
  }
  sim_.reset();
  plugin.reset();
  std::filesystem::remove_all(Registry());

  plugin = StartPlugin(Info({"v1beta1.DRAPlugin"}));
  sim_ = std::make_unique<KubeletDraSim>(
      Options{.registry_dir = Registry(), .health_api = Options::HealthApi::k137});
  ASSERT_TRUE(sim_->Start().ok());
  ASSERT_TRUE(sim_->WaitFor([](const KubeletDraSim& s) { return s.Count("health-none") == 1; }, 30s));
  EXPECT_EQ(sim_->Count("health-stream"), 0);
  EXPECT_EQ(sim_->Plugins().at("example.com").health_service, "");
}

TEST_F(KubeletDraSimTest, A136KubeletOpensV1alpha1HealthWhateverThePluginLists) {
  auto plugin = StartPlugin(Info({"v1beta1.DRAPlugin", "v1.DRAResourceHealth"}));
  KubeletDraSim& sim = Sim();
  ASSERT_TRUE(sim.WaitFor([](const KubeletDraSim& s) { return s.Count("health-end") > 0; }, 30s));
  EXPECT_EQ(sim.Plugins().at("example.com").health_service, "v1alpha1.DRAResourceHealth");
  for (const Event& event : sim.Events()) {
    if (event.kind == "health-stream") {
      EXPECT_EQ(event.detail, "v1alpha1.DRAResourceHealth");
    }
  }
}

TEST_F(KubeletDraSimTest, RefusesAnEmptyServiceListWithTheKubeletsMessage) {
  auto plugin = StartPlugin(Info({}));
  ASSERT_TRUE(Sim().WaitFor([&](const KubeletDraSim&) { return Notified(*plugin); }, 30s));
  const auto status = plugin->Notifications()[0];
  EXPECT_FALSE(status.plugin_registered());
  EXPECT_EQ(status.error(), "invalid supported gRPC versions of DRA driver plugin example.com at endpoint " +
                                DraSocket().string() + ": empty list of supported gRPC services (aka supported versions)");
  EXPECT_TRUE(Sim().Plugins().empty());
  EXPECT_EQ(Sim().Count("refused"), 1);
}

TEST_F(KubeletDraSimTest, RefusesServicesItDoesNotKnow) {
  auto plugin = StartPlugin(Info({"v1alpha4.DRAPlugin"}));
  ASSERT_TRUE(Sim().WaitFor([&](const KubeletDraSim&) { return Notified(*plugin); }, 30s));
  const auto status = plugin->Notifications()[0];
  EXPECT_FALSE(status.plugin_registered());
  EXPECT_NE(status.error().find("none of services supported by the plugin ([\"v1alpha4.DRAPlugin\"]) are supported by "
                                "the kubelet ([\"v1.DRAPlugin\" \"v1beta1.DRAPlugin\"])"),
            std::string::npos)
      << status.error();
  EXPECT_TRUE(Sim().Plugins().empty());
}

TEST_F(KubeletDraSimTest, RefusesAnotherPluginType) {
  auto plugin = StartPlugin(Info({"v1.DRAPlugin"}, "CSIPlugin"));
  ASSERT_TRUE(Sim().WaitFor([&](const KubeletDraSim&) { return Notified(*plugin); }, 30s));
  EXPECT_FALSE(plugin->Notifications()[0].plugin_registered());
  EXPECT_TRUE(plugin->Notifications()[0].error().starts_with("no handler registered for plugin type: CSIPlugin"));
}

TEST_F(KubeletDraSimTest, IgnoresDotFilesAndFilesThatAreNotSockets) {
  KubeletDraSim& sim = Sim();
  std::ofstream(Registry() / "not-a-socket") << "x";
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string hidden = (Registry() / ".hidden-reg.sock").string();
  std::strncpy(addr.sun_path, hidden.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ::close(fd);
  ASSERT_TRUE(sim.WaitFor([](const KubeletDraSim& s) { return s.Count("ignored") >= 2; }, 30s));
  EXPECT_EQ(sim.Count("error"), 0);
  EXPECT_TRUE(sim.Plugins().empty());
}

TEST_F(KubeletDraSimTest, RemovedSocketDeregistersAndRestartRedialsWhatIsThere) {
  auto plugin = StartPlugin(Info({"v1.DRAPlugin"}));
  KubeletDraSim& sim = Sim();
  ASSERT_TRUE(sim.WaitFor([](const KubeletDraSim& s) { return s.Count("register") == 1; }, 30s));
  ASSERT_TRUE(sim.Restart().ok());
  ASSERT_TRUE(sim.WaitFor([](const KubeletDraSim& s) { return s.Count("register") == 2; }, 30s));
  EXPECT_EQ(plugin->GetInfoCalls(), 2);
  EXPECT_EQ(sim.Plugins().at("example.com").service, "v1.DRAPlugin");

  std::filesystem::remove(Registry() / "example.com-reg.sock");
  ASSERT_TRUE(sim.WaitFor([](const KubeletDraSim& s) { return s.Plugins().empty(); }, 30s));
  EXPECT_EQ(sim.Count("deregister"), 1);
  EXPECT_FALSE(sim.Prepare("example.com", {MakeClaim("ns", "c", "u")}).ok());
}

}  // namespace
}  // namespace vfio_agent::kubeletsim::dra
