// The DRA driver's kubelet side against the DRA kubelet simulator: registration end to end, the sockets'
// lifecycle (stale replaced, a live one refused, removed on Stop), a kubelet that refuses, a kubelet restart, and
// the v1 and v1beta1 services answering through the same handlers.
#include "vfio_gpu_agent/dra/driver.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "kubelet_dra_sim.h"
#include "pluginregistration/v1/api.grpc.pb.h"
#include "support/sysfs_tree.h"
#include "support/wait.h"

namespace vfio_agent::dra {
namespace {

using kubeletsim::dra::KubeletDraSim;
using kubeletsim::dra::MakeClaim;
using namespace std::chrono_literals;

constexpr auto kWait = std::chrono::duration_cast<std::chrono::milliseconds>(testing::kGenerousWait);

// A socket file nobody listens on, as a killed earlier run leaves it.
void LeaveStaleSocket(const std::filesystem::path& path) {
  std::filesystem::create_directories(path.parent_path());
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << path;
  ::close(fd);
}

bool Connects(const std::filesystem::path& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const bool connected = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return connected;
}

class DraDriverTest : public ::testing::Test {
 protected:
  DriverOptions Options() const {
    DriverOptions options;
    options.registry_dir = dir_.path() / "plugins_registry";
    options.plugins_dir = dir_.path() / "plugins";
    options.cdi_dir = dir_.path() / "cdi";
    return options;
  }

  KubeletDraSim& Kubelet(std::vector<std::string> services = {"v1.DRAPlugin", "v1beta1.DRAPlugin"}) {
    kubelet_ = std::make_unique<KubeletDraSim>(
        kubeletsim::dra::Options{.registry_dir = Options().registry_dir, .supported_services = std::move(services)});
    EXPECT_TRUE(kubelet_->Start().ok());
    return *kubelet_;
  }

  static bool Registered(const KubeletDraSim& kubelet, int times) { return kubelet.Count("register") == times; }

  testing::TempDir dir_{"va-dra"};
  std::unique_ptr<KubeletDraSim> kubelet_;
};

TEST_F(DraDriverTest, GetInfoDescribesTheDriverAndTheKubeletAcceptsIt) {
  KubeletDraSim& kubelet = Kubelet();
  Driver driver(Options());
  ASSERT_TRUE(driver.Start().ok());
  ASSERT_TRUE(kubelet.WaitFor([](const KubeletDraSim& k) { return Registered(k, 1); }, kWait));

  const kubeletsim::dra::Plugin plugin = kubelet.Plugins().at(std::string(kDefaultDriverName));
  const std::string dra_sock = (Options().plugins_dir / "gpu.vfio-agent.cozystack.io/dra.sock").string();
  EXPECT_EQ(plugin.registration_socket, Options().registry_dir / "gpu.vfio-agent.cozystack.io-reg.sock");
  EXPECT_EQ(plugin.endpoint, dra_sock);
  EXPECT_TRUE(std::filesystem::path(plugin.endpoint).is_absolute());
  EXPECT_EQ(plugin.supported_versions,
            (std::vector<std::string>{"v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth",
                                      "v1alpha1.DRAResourceHealth"}));
  EXPECT_EQ(plugin.service, "v1.DRAPlugin");
  EXPECT_TRUE(plugin.connected);
  ASSERT_TRUE(testing::WaitUntil([&] { return driver.Registration().notifications == 1; }));
  EXPECT_TRUE(driver.Registration().registered);
  EXPECT_EQ(driver.Registration().error, "");
  EXPECT_EQ(driver.Registration().get_info_calls, 1);

  // The type the kubelet dispatches on, read straight off the wire.
  auto channel = grpc::CreateChannel("unix:" + plugin.registration_socket.string(), grpc::InsecureChannelCredentials());
  pluginregistration::Registration::Stub stub(channel);
  grpc::ClientContext ctx;
  pluginregistration::PluginInfo info;
  ASSERT_TRUE(stub.GetInfo(&ctx, {}, &info).ok());
  EXPECT_EQ(info.type(), "DRAPlugin");
  EXPECT_EQ(info.name(), "gpu.vfio-agent.cozystack.io");
}

TEST_F(DraDriverTest, ARelativePluginsDirStillAdvertisesAnAbsoluteEndpoint) {
  DriverOptions options = Options();
  options.plugins_dir = std::filesystem::relative(options.plugins_dir);
  EXPECT_TRUE(DraSocket(options).is_absolute());
  EXPECT_EQ(DraSocket(options), Options().plugins_dir / "gpu.vfio-agent.cozystack.io/dra.sock");
}

TEST_F(DraDriverTest, StaleSocketsFromAnEarlierRunAreReplaced) {
  const DriverOptions options = Options();
  LeaveStaleSocket(RegistrationSocket(options));
  LeaveStaleSocket(DraSocket(options));
  ASSERT_FALSE(Connects(RegistrationSocket(options)));
  Driver driver(options);
  ASSERT_TRUE(driver.Start().ok());
  EXPECT_TRUE(Connects(RegistrationSocket(options)));
  EXPECT_TRUE(Connects(DraSocket(options)));
  // A kubelet that starts now finds the new socket and registers the driver on it.
  KubeletDraSim& kubelet = Kubelet();
  ASSERT_TRUE(kubelet.WaitFor([](const KubeletDraSim& k) { return Registered(k, 1); }, kWait));
  EXPECT_TRUE(kubelet.Plugins().begin()->second.connected);
}

TEST_F(DraDriverTest, ASocketALiveDriverAnswersOnIsNotTaken) {
  Driver first(Options());
  ASSERT_TRUE(first.Start().ok());
  Driver second(Options());
  absl::Status status = second.Start();
  EXPECT_EQ(status.code(), absl::StatusCode::kAlreadyExists) << status;
  EXPECT_NE(status.message().find("dra.sock"), std::string_view::npos) << status;
  // The first one still serves: a kubelet registers it.
  KubeletDraSim& kubelet = Kubelet();
  ASSERT_TRUE(kubelet.WaitFor([](const KubeletDraSim& k) { return Registered(k, 1); }, kWait));
}

TEST_F(DraDriverTest, AKubeletThatKnowsNoOfferedServiceRefusesAndTheDriverRecordsWhy) {
  KubeletDraSim& kubelet = Kubelet({"v2.DRAPlugin"});
  Driver driver(Options());
  ASSERT_TRUE(driver.Start().ok());
  ASSERT_TRUE(testing::WaitUntil([&] { return driver.Registration().notifications == 1; }));
  EXPECT_FALSE(driver.Registration().registered);
  EXPECT_NE(driver.Registration().error.find("are supported by the kubelet ([\"v2.DRAPlugin\"])"), std::string::npos)
      << driver.Registration().error;
  EXPECT_TRUE(kubelet.Plugins().empty());
}

TEST_F(DraDriverTest, AKubeletRestartRedialsTheDriver) {
  KubeletDraSim& kubelet = Kubelet();
  Driver driver(Options());
  ASSERT_TRUE(driver.Start().ok());
  ASSERT_TRUE(kubelet.WaitFor([](const KubeletDraSim& k) { return Registered(k, 1); }, kWait));
  ASSERT_TRUE(kubelet.Restart().ok());
  ASSERT_TRUE(kubelet.WaitFor([](const KubeletDraSim& k) { return Registered(k, 2); }, kWait));
  EXPECT_TRUE(kubelet.Plugins().begin()->second.connected);
  ASSERT_TRUE(testing::WaitUntil([&] { return driver.Registration().notifications == 2; }));
  EXPECT_TRUE(driver.Registration().registered);
  EXPECT_EQ(driver.Registration().get_info_calls, 2);
  // The new connection carries calls.
  auto response = kubelet.Unprepare(std::string(kDefaultDriverName), {MakeClaim("vms", "gpu", "uid-1")});
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->claims().at("uid-1").error(), "");
}

TEST_F(DraDriverTest, StopRemovesBothSocketsAndTheKubeletDeregisters) {
  KubeletDraSim& kubelet = Kubelet();
  Driver driver(Options());
  ASSERT_TRUE(driver.Start().ok());
  ASSERT_TRUE(kubelet.WaitFor([](const KubeletDraSim& k) { return Registered(k, 1); }, kWait));
  driver.Stop();
  EXPECT_FALSE(std::filesystem::exists(RegistrationSocket(Options())));
  EXPECT_FALSE(std::filesystem::exists(DraSocket(Options())));
  ASSERT_TRUE(kubelet.WaitFor([](const KubeletDraSim& k) { return k.Plugins().empty(); }, kWait));
  EXPECT_EQ(kubelet.Count("deregister"), 1);
}

TEST_F(DraDriverTest, V1AndV1beta1AnswerThroughTheSameHandlers) {
  std::map<std::string, std::string> answers;
  for (const std::string service : {"v1.DRAPlugin", "v1beta1.DRAPlugin"}) {
    KubeletDraSim& kubelet = Kubelet({service});
    Driver driver(Options());
    ASSERT_TRUE(driver.Start().ok());
    ASSERT_TRUE(kubelet.WaitFor([](const KubeletDraSim& k) { return Registered(k, 1); }, kWait));
    ASSERT_EQ(kubelet.Plugins().begin()->second.service, service);
    auto prepared = kubelet.Prepare(std::string(kDefaultDriverName),
                                    {MakeClaim("vms", "a", "uid-a"), MakeClaim("vms", "b", "uid-b")});
    ASSERT_TRUE(prepared.ok()) << prepared.status();
    EXPECT_EQ(prepared->claims_size(), 2);
    answers[service] = prepared->claims().at("uid-b").error();
    EXPECT_NE(answers[service].find("vms/b (uid-b)"), std::string::npos) << answers[service];
    auto unprepared = kubelet.Unprepare(std::string(kDefaultDriverName), {MakeClaim("vms", "a", "uid-a")});
    ASSERT_TRUE(unprepared.ok()) << unprepared.status();
    EXPECT_EQ(unprepared->claims_size(), 1);
    driver.Stop();
    kubelet_.reset();
  }
  EXPECT_EQ(answers["v1.DRAPlugin"], answers["v1beta1.DRAPlugin"]);
}

TEST(DriverNameTest, DnsSubdomainsOnly) {
  EXPECT_TRUE(ValidateDriverName(kDefaultDriverName).ok());
  EXPECT_TRUE(ValidateDriverName("gpu.example.com").ok());
  EXPECT_TRUE(ValidateDriverName("a").ok());
  EXPECT_FALSE(ValidateDriverName("").ok());
  EXPECT_FALSE(ValidateDriverName("GPU.example.com").ok());
  EXPECT_FALSE(ValidateDriverName("gpu_vfio.example.com").ok());
  EXPECT_FALSE(ValidateDriverName("gpu..example.com").ok());
  EXPECT_FALSE(ValidateDriverName("-gpu.example.com").ok());
  EXPECT_FALSE(ValidateDriverName("gpu.example.com.").ok());
  EXPECT_FALSE(ValidateDriverName(std::string(64, 'a')).ok());
  EXPECT_TRUE(ValidateDriverName(std::string(63, 'a')).ok());
}

}  // namespace
}  // namespace vfio_agent::dra

namespace vfio_agent::dra {
namespace {

// --binding-conditions has work only where a GPU must be made ready first: vGPU claims need no bind (a vGPU is never
// a whole GPU), a passthrough GPU that stays on vfio-pci without a partition needs nothing.
TEST(BindingConditionsWantedTest, OnlyWhereAGpuNeedsWorkBeforeUse) {
  DriverOptions options;
  options.binding_conditions = true;
  options.watch_claims = [](kube::ResourceClaimWatch::Handlers) { return nullptr; };
  options.write_claim_status = [](const kube::ResourceClaim&, const std::vector<kube::DeviceStatus>&) {
    return absl::OkStatus();
  };
  EXPECT_FALSE(BindingConditionsWanted(options));  // passthrough, GPUs bound at start, no FM
  options.bind_on_prepare = true;
  EXPECT_TRUE(BindingConditionsWanted(options));
  options.bind_on_prepare = false;
  options.fabric.address = "unix:/run/nvidia-fabricmanager/fm.sock";
  EXPECT_TRUE(BindingConditionsWanted(options));
  options.workload = Workload::kVmVgpu;
  EXPECT_FALSE(BindingConditionsWanted(options));
  options.workload = Workload::kVmPassthrough;
  options.binding_conditions = false;
  EXPECT_FALSE(BindingConditionsWanted(options));
  EXPECT_EQ(BindingConditionType(kDefaultDriverName), "gpu.vfio-agent.cozystack.io/vfio-bound");
  EXPECT_EQ(BindingFailureConditionType(kDefaultDriverName), "gpu.vfio-agent.cozystack.io/bind-failed");
}

}  // namespace
}  // namespace vfio_agent::dra
