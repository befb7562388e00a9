// `vfio-gpu-agent claim-router` as processes against the fake API server: two replicas, one acts; the standby
// takes over after the leader is killed (its lease expires); a router started again lists and converges.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "gtest/gtest.h"
#include "kube_api_sim.h"
#include "router_fixture.h"
#include "support/sysfs_tree.h"
#include "vfio_gpu_agent/router/claim_router.h"

namespace vfio_agent::router {
namespace {

using testing::Allocation;
using testing::Claim;
using testing::kDriver;
using testing::NodeLabel;
using namespace std::chrono_literals;

constexpr char kLeaseNamespace[] = "vfio-gpu-agent";

// One `claim-router` process, its stderr in a file; SIGKILL on destruction if still running.
class RouterProcess {
 public:
  RouterProcess(const std::filesystem::path& kubeconfig, const std::filesystem::path& log, const std::string& identity)
      : log_(log) {
    pid_ = fork();
    if (pid_ == 0) {
      const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      dup2(fd, 2);
      dup2(fd, 1);
      const std::string kubeconfig_flag = "--kubeconfig=" + kubeconfig.string();
      const std::string identity_flag = "--identity=" + identity;
      execl(VFIO_AGENT_BINARY, VFIO_AGENT_BINARY, "claim-router", kubeconfig_flag.c_str(), identity_flag.c_str(),
            "--lease-namespace=vfio-gpu-agent", "--lease-duration=2000", "--renew-deadline=1500",
            "--retry-period=200", static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  ~RouterProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  // The exit status after `signal`.
  int Signal(int signal) {
    kill(pid_, signal);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return status;
  }
  std::string Log() const {
    std::ifstream in(log_);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

 private:
  std::filesystem::path log_;
  pid_t pid_ = -1;
};

class RouterProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!sim::KubeApiSim::Available()) GTEST_SKIP() << "python3 not found";
    auto api = sim::KubeApiSim::Start(dir_.path());
    ASSERT_TRUE(api.ok()) << api.status();
    api_ = *std::move(api);
    auto kubeconfig = api_->WriteKubeconfig(dir_.path() / "kubeconfig");
    ASSERT_TRUE(kubeconfig.ok()) << kubeconfig.status();
    kubeconfig_ = *kubeconfig;
  }

  std::unique_ptr<RouterProcess> Start(const std::string& identity) {
    return std::make_unique<RouterProcess>(kubeconfig_, dir_.path() / (identity + ".log"), identity);
  }
  static bool LogSays(const RouterProcess& router, const std::string& text) {
    return sim::KubeApiSim::WaitFor([&] { return router.Log().find(text) != std::string::npos; });
  }
  std::string Holder() { return testing::LeaseHolder(*api_, kLeaseNamespace, kDefaultLeaseName); }
  bool LabelIs(const std::string& claim, std::optional<std::string> value) {
    return sim::KubeApiSim::WaitFor([&] { return NodeLabel(*api_, claim) == value; });
  }

  vfio_agent::testing::TempDir dir_;
  std::unique_ptr<sim::KubeApiSim> api_;
  std::filesystem::path kubeconfig_;
};

TEST_F(RouterProcessTest, OneOfTwoActsAndTheStandbyTakesOverWhenTheLeaderIsKilled) {
  std::map<std::string, std::unique_ptr<RouterProcess>> routers;
  routers["router-0"] = Start("router-0");
  routers["router-1"] = Start("router-1");
  ASSERT_TRUE(sim::KubeApiSim::WaitFor([&] { return !Holder().empty(); }));
  const std::string leader = Holder();
  const std::string standby = leader == "router-0" ? "router-1" : "router-0";
  testing::PutClaim(*api_, Claim("vm-1", Allocation(kDriver, "node-a")));
  ASSERT_TRUE(LabelIs("vm-1", "node-a"));
  // The leader logs the label once the PATCH has returned, which may be after the label is seen here.
  EXPECT_TRUE(LogSays(*routers[leader], "claim vms/vm-1 labeled")) << routers[leader]->Log();
  EXPECT_EQ(routers[standby]->Log().find("leading"), std::string::npos) << routers[standby]->Log();
  EXPECT_EQ(routers[standby]->Log().find("labeled"), std::string::npos) << routers[standby]->Log();

  // Killed: no release. Claims allocated meanwhile wait for the standby, which takes the lease over once it has
  // seen no renewal for the lease's duration.
  routers[leader]->Signal(SIGKILL);
  testing::PutClaim(*api_, Claim("vm-2", Allocation(kDriver, "node-b")));
  ASSERT_TRUE(sim::KubeApiSim::WaitFor([&] { return Holder() == standby; }));
  // Taken over from the dead holder (not handed back): only once its lease expired.
  EXPECT_TRUE(LogSays(*routers[standby], "over from \"" + leader + "\"")) << routers[standby]->Log();
  ASSERT_TRUE(LabelIs("vm-2", "node-b"));
  EXPECT_TRUE(LogSays(*routers[standby], "claim vms/vm-2 labeled")) << routers[standby]->Log();
}

TEST_F(RouterProcessTest, SigtermReleasesTheLeaseAndExitsZero) {
  auto first = Start("router-0");
  ASSERT_TRUE(sim::KubeApiSim::WaitFor([&] { return Holder() == "router-0"; }));
  auto second = Start("router-1");
  ASSERT_TRUE(sim::KubeApiSim::WaitFor([&] { return second->Log().find("candidate") != std::string::npos; }));
  const int status = first->Signal(SIGTERM);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_NE(first->Log().find("lease released"), std::string::npos) << first->Log();
  ASSERT_TRUE(sim::KubeApiSim::WaitFor([&] { return Holder() == "router-1"; }));
  testing::PutClaim(*api_, Claim("vm-1", Allocation(kDriver, "node-a")));
  ASSERT_TRUE(LabelIs("vm-1", "node-a"));
}

TEST_F(RouterProcessTest, ARestartedRouterListsAndConverges) {
  auto router = Start("router-0");
  testing::PutClaim(*api_, Claim("vm-1", Allocation(kDriver, "node-a")));
  ASSERT_TRUE(LabelIs("vm-1", "node-a"));
  router->Signal(SIGTERM);
  // While no router runs: nothing breaks, claims wait unlabeled (and a moved one keeps its old label).
  testing::PutClaim(*api_, Claim("vm-2", Allocation(kDriver, "node-b")));
  testing::SetStatus(*api_, "vm-1", Allocation(kDriver, "node-c"));
  testing::PutClaim(*api_, Claim("other", Allocation("gpu.nvidia.com", "node-a")));
  EXPECT_EQ(NodeLabel(*api_, "vm-2"), std::nullopt);
  router = Start("router-0");
  ASSERT_TRUE(LabelIs("vm-2", "node-b"));
  ASSERT_TRUE(LabelIs("vm-1", "node-c"));
  EXPECT_EQ(NodeLabel(*api_, "other"), std::nullopt);
}

}  // namespace
}  // namespace vfio_agent::router
