// The claim router in-process against the fake API server: which claims it labels, reallocation, relists, and
// leader election between two routers.
#include "vfio_gpu_agent/router/claim_router.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "api_client.h"
#include "config.h"
#include "gtest/gtest.h"
#include "kube_api_sim.h"
#include "router_fixture.h"
#include "support/sysfs_tree.h"
#include "vfio_gpu_agent/kube/claim_routing.h"

namespace vfio_agent::router {
namespace {

using namespace std::chrono_literals;
using Json = nlohmann::json;
using testing::Allocation;
using testing::Claim;
using testing::kDriver;
using testing::kNamespace;
using testing::NodeLabel;

TEST(RouteOfTest, OurDriverAllocatedGetsItsPoolsNode) {
  absl::StatusOr<ClaimRoute> route = RouteOf(Claim("a", Allocation(kDriver, "node-a", 2)).dump(), kDriver);
  ASSERT_TRUE(route.ok()) << route.status();
  EXPECT_EQ(route->namespace_name, kNamespace);
  EXPECT_EQ(route->wanted, "node-a");
  EXPECT_FALSE(route->current.has_value());
  EXPECT_FALSE(route->settled());
  EXPECT_FALSE(route->several_pools);
}

TEST(RouteOfTest, OtherDriversAndUnallocatedClaimsAreLeftAlone) {
  for (const Json& claim : {Claim("b", Allocation("gpu.nvidia.com", "node-a")), Claim("c")}) {
    absl::StatusOr<ClaimRoute> route = RouteOf(claim.dump(), kDriver);
    ASSERT_TRUE(route.ok()) << route.status();
    EXPECT_FALSE(route->wanted.has_value()) << claim.dump();
    EXPECT_TRUE(route->settled()) << claim.dump();
  }
}

TEST(RouteOfTest, DeallocatedClaimLosesItsLabelAndReallocatedOneMoves) {
  Json claim = Claim("a");
  claim["metadata"]["labels"] = {{kube::kClaimNodeLabel, "node-a"}, {"app", "vm"}};
  absl::StatusOr<ClaimRoute> route = RouteOf(claim.dump(), kDriver);
  ASSERT_TRUE(route.ok());
  EXPECT_EQ(route->current, "node-a");
  EXPECT_FALSE(route->wanted.has_value());
  EXPECT_FALSE(route->settled());
  claim["status"] = Allocation(kDriver, "node-b");
  route = RouteOf(claim.dump(), kDriver);
  ASSERT_TRUE(route.ok());
  EXPECT_EQ(route->wanted, "node-b");
}

TEST(RouteOfTest, NotAClaimIsDataLoss) {
  EXPECT_EQ(RouteOf("[]", kDriver).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(RouteOf(R"({"metadata":{"name":"x"}})", kDriver).status().code(), absl::StatusCode::kDataLoss);
}

class ClaimRouterTest : public ::testing::Test {
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
  void TearDown() override {
    for (auto& [router, thread] : routers_) {
      router->Stop();
      thread.join();
    }
  }

  // A router running on its own thread, with short lease times so that a takeover happens within seconds.
  ClaimRouter& StartRouter(const std::string& identity) {
    auto router = ClaimRouter::Connect({.kubeconfig = kubeconfig_,
                                        .lease_namespace = "vfio-gpu-agent",
                                        .identity = identity,
                                        .lease_duration = 2000ms,
                                        .renew_deadline = 1500ms,
                                        .retry_period = 200ms});
    EXPECT_TRUE(router.ok()) << router.status();
    ClaimRouter* raw = router->get();
    routers_.emplace_back(*std::move(router), std::thread([raw] { EXPECT_TRUE(raw->Run().ok()); }));
    return *raw;
  }

  bool LabelIs(const std::string& claim, std::optional<std::string> value) {
    return sim::KubeApiSim::WaitFor([&] { return NodeLabel(*api_, claim) == value; });
  }

  vfio_agent::testing::TempDir dir_;
  std::unique_ptr<sim::KubeApiSim> api_;
  std::filesystem::path kubeconfig_;
  std::vector<std::pair<std::unique_ptr<ClaimRouter>, std::thread>> routers_;
};

TEST_F(ClaimRouterTest, LabelsAllocatedClaimsOfOurDriverOnly) {
  testing::PutClaim(*api_, Claim("ours", Allocation(kDriver, "node-a")));
  testing::PutClaim(*api_, Claim("theirs", Allocation("gpu.nvidia.com", "node-a")));
  testing::PutClaim(*api_, Claim("pending"));
  ClaimRouter& router = StartRouter("router-0");
  ASSERT_TRUE(LabelIs("ours", "node-a"));  // from the list
  // Allocated after the list: from the watch.
  testing::SetStatus(*api_, "pending", Allocation(kDriver, "node-b", 8));
  ASSERT_TRUE(LabelIs("pending", "node-b"));
  testing::SetStatus(*api_, "theirs", Allocation("gpu.nvidia.com", "node-b"));
  // The watch has seen the other driver's claim change (its event came before a later claim's label).
  testing::PutClaim(*api_, Claim("last", Allocation(kDriver, "node-c")));
  ASSERT_TRUE(LabelIs("last", "node-c"));
  EXPECT_EQ(NodeLabel(*api_, "theirs"), std::nullopt);
  EXPECT_EQ(api_->Count("PATCH", absl::StrCat("/apis/resource.k8s.io/v1/namespaces/", kNamespace, "/resourceclaims/theirs")), 0u);
  EXPECT_EQ(router.counters().labeled.load(), 3u);
  EXPECT_EQ(router.counters().lists.load(), 1u);
}

TEST_F(ClaimRouterTest, MovesTheLabelWhenReallocatedAndRemovesItWhenDeallocated) {
  StartRouter("router-0");
  testing::PutClaim(*api_, Claim("vm-1", Allocation(kDriver, "node-a")));
  ASSERT_TRUE(LabelIs("vm-1", "node-a"));
  // The agent on node-a failed the binding: the scheduler deallocates, then allocates on node-b.
  testing::SetStatus(*api_, "vm-1", Json::object());
  ASSERT_TRUE(LabelIs("vm-1", std::nullopt));
  testing::SetStatus(*api_, "vm-1", Allocation(kDriver, "node-b"));
  ASSERT_TRUE(LabelIs("vm-1", "node-b"));
  // Straight from one node to another (no deallocated state seen in between).
  testing::SetStatus(*api_, "vm-1", Allocation(kDriver, "node-c"));
  ASSERT_TRUE(LabelIs("vm-1", "node-c"));
}

TEST_F(ClaimRouterTest, ListsAgainAfterTheWatchIsGone) {
  ClaimRouter& router = StartRouter("router-0");
  testing::PutClaim(*api_, Claim("before", Allocation(kDriver, "node-a")));
  ASSERT_TRUE(LabelIs("before", "node-a"));
  // The router cannot watch for a while; meanwhile a claim is allocated and etcd is compacted past the router's
  // resourceVersion: its next watch gets 410 and only a new list finds the claim.
  ASSERT_TRUE(api_->Control("deny watch resourceclaims.resource.k8s.io").ok());
  const size_t watches = api_->Count("GET", "/apis/resource.k8s.io/v1/resourceclaims");
  ASSERT_TRUE(api_->Control("close-watches").ok());
  ASSERT_TRUE(sim::KubeApiSim::WaitFor([&] {
    return api_->Count("GET", "/apis/resource.k8s.io/v1/resourceclaims", "403") > 0;
  }));
  testing::PutClaim(*api_, Claim("meanwhile", Allocation(kDriver, "node-b")));
  ASSERT_TRUE(api_->Control("compact").ok());
  ASSERT_TRUE(api_->Control("allow watch resourceclaims.resource.k8s.io").ok());
  ASSERT_TRUE(LabelIs("meanwhile", "node-b"));
  EXPECT_EQ(router.counters().lists.load(), 2u);
  EXPECT_GT(api_->Count("GET", "/apis/resource.k8s.io/v1/resourceclaims"), watches);
}

TEST_F(ClaimRouterTest, OnlyTheLeaderActsAndTheStandbyTakesOverWhenItReleases) {
  ClaimRouter& first = StartRouter("router-0");
  ASSERT_TRUE(sim::KubeApiSim::WaitFor([&] { return first.leading(); }));
  ClaimRouter& second = StartRouter("router-1");
  testing::PutClaim(*api_, Claim("vm-1", Allocation(kDriver, "node-a")));
  ASSERT_TRUE(LabelIs("vm-1", "node-a"));
  // The standby has looked at the lease several times meanwhile (every 200 ms) and stayed a standby.
  ASSERT_TRUE(sim::KubeApiSim::WaitFor([&] {
    return api_->Count("GET", "/apis/coordination.k8s.io/v1/namespaces/vfio-gpu-agent/leases/") >= 10;
  }));
  EXPECT_FALSE(second.leading());
  EXPECT_EQ(second.counters().terms.load(), 0u);
  EXPECT_EQ(second.counters().lists.load(), 0u);
  EXPECT_EQ(testing::LeaseHolder(*api_, "vfio-gpu-agent", kDefaultLeaseName), "router-0");

  // SIGTERM's path: the leader releases the lease and the standby takes it on its next look.
  first.Stop();
  routers_.front().second.join();
  routers_.erase(routers_.begin());
  EXPECT_TRUE(testing::LeaseHolder(*api_, "vfio-gpu-agent", kDefaultLeaseName) == "" ||
              testing::LeaseHolder(*api_, "vfio-gpu-agent", kDefaultLeaseName) == "router-1");
  ASSERT_TRUE(sim::KubeApiSim::WaitFor([&] { return second.leading(); }));
  testing::PutClaim(*api_, Claim("vm-2", Allocation(kDriver, "node-b")));
  ASSERT_TRUE(LabelIs("vm-2", "node-b"));
  EXPECT_EQ(second.counters().terms.load(), 1u);
}

// What each agent's watch sees (the binding-conditions side relies on it): only its own node's claims, and a claim
// that moves away ends as DELETED on the old node's watch.
TEST_F(ClaimRouterTest, AnAgentsSelectedWatchSeesItsClaimsArriveAndLeave) {
  StartRouter("router-0");
  auto config = kube::LoadClusterConfig(kubeconfig_, "");
  ASSERT_TRUE(config.ok());
  kube::ApiClient client(*config);
  std::vector<std::string> seen;
  std::mutex mu;
  kube::StreamCanceller cancel;
  std::thread watch([&] {
    const std::string path = absl::StrCat("/apis/resource.k8s.io/v1/resourceclaims?labelSelector=",
                                          std::string(kube::kClaimNodeLabel), "%3Dnode-a&watch=true&resourceVersion=0");
    (void)client.Stream(path, [&](absl::string_view line) {
      const Json event = Json::parse(line, nullptr, false);
      std::lock_guard lock(mu);
      seen.push_back(absl::StrCat(event.value("type", ""), " ", event["object"]["metadata"].value("name", "")));
      return true;
    }, 30s, cancel);
  });
  auto saw = [&](std::vector<std::string> wanted) {
    return sim::KubeApiSim::WaitFor([&] {
      std::lock_guard lock(mu);
      return seen == wanted;
    });
  };
  testing::PutClaim(*api_, Claim("elsewhere", Allocation(kDriver, "node-b")));
  testing::PutClaim(*api_, Claim("vm-1", Allocation(kDriver, "node-a")));
  EXPECT_TRUE(saw({"ADDED vm-1"}));
  // Reallocated: the old node's agent sees the new allocation (the label still names it), then the claim leave.
  testing::SetStatus(*api_, "vm-1", Allocation(kDriver, "node-b"));
  EXPECT_TRUE(saw({"ADDED vm-1", "MODIFIED vm-1", "DELETED vm-1"}));
  ASSERT_TRUE(LabelIs("elsewhere", "node-b"));
  cancel.Cancel();
  watch.join();
  std::lock_guard lock(mu);
  EXPECT_EQ(seen, (std::vector<std::string>{"ADDED vm-1", "MODIFIED vm-1", "DELETED vm-1"}));
}

}  // namespace
}  // namespace vfio_agent::router
