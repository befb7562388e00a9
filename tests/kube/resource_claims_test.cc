// The claim watch (by the router's node label) and the status.devices apply, against the fake API server, which
// serves labelSelector lists and watches and validates status.devices as kube-apiserver 1.36 does.
#include "vfio_gpu_agent/kube/resource_claims.h"

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "api_sim_fixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kube_api_sim.h"
#include "vfio_gpu_agent/kube/claim_routing.h"
#include "vfio_gpu_agent/kube/resource_slices.h"

namespace vfio_agent::kube {
namespace {

using Json = nlohmann::json;
using ::testing::HasSubstr;

constexpr char kDriver[] = "gpu.vfio-agent.cozystack.io";
constexpr char kBound[] = "gpu.vfio-agent.cozystack.io/vfio-bound";
constexpr char kFailed[] = "gpu.vfio-agent.cozystack.io/bind-failed";

class ResourceClaimsTest : public testing::KubeApiSimTest {
 protected:
  void SetUp() override {
    testing::KubeApiSimTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    auto kubeconfig = api_->WriteKubeconfig(dir_.path() / "kubeconfig");
    ASSERT_TRUE(kubeconfig.ok()) << kubeconfig.status();
    kubeconfig_ = *kubeconfig;
  }

  std::unique_ptr<ResourceClaimClient> Client(const std::string& node) {
    auto client = ConnectResourceClaimClient(kubeconfig_, "", {.node_name = node, .driver = kDriver});
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  // A claim of one GPU request, stored unallocated.
  void AddClaim(const std::string& name) {
    ASSERT_TRUE(api_->Control(absl::StrCat(R"(claim {"metadata":{"namespace":"vms","name":")", name,
                                           R"("},"spec":{"devices":{"requests":[{"name":"gpu","exactly":)",
                                           R"({"deviceClassName":"vfio-gpu"}}]}}})"))
                    .ok());
  }
  void Allocate(const std::string& name, const std::string& node, const std::string& device) {
    auto done = api_->Control(absl::StrCat("allocate vms ", name, " ", node, R"( [{"resource":"pods","name":"vm","uid":"pod-)",
                                           name, R"("}] [{"request":"gpu","driver":")", kDriver, R"(","pool":")", node,
                                           R"(","device":")", device, R"("}])"));
    ASSERT_TRUE(done.ok()) << done.status();
  }
  Json StoredClaim(const std::string& name) {
    auto reply = api_->Control(absl::StrCat("get-claim vms ", name));
    EXPECT_TRUE(reply.ok()) << reply.status();
    return reply.ok() ? Json::parse(*reply) : Json();
  }

  std::filesystem::path kubeconfig_;
};

// What the watch delivered, by claim name (the last state), and the names gone.
struct Seen {
  std::mutex mu;
  std::map<std::string, ResourceClaim> claims;
  std::vector<std::string> gone;
  int lists = 0;
  ResourceClaimWatch::Handlers Handlers() {
    return {.listed =
                [this](std::vector<ResourceClaim> all) {
                  std::lock_guard lock(mu);
                  ++lists;
                  claims.clear();
                  for (ResourceClaim& claim : all) claims[claim.name] = std::move(claim);
                },
            .changed =
                [this](const ResourceClaim& claim, bool is_gone) {
                  std::lock_guard lock(mu);
                  if (is_gone) {
                    claims.erase(claim.name);
                    gone.push_back(claim.name);
                  } else {
                    claims[claim.name] = claim;
                  }
                }};
  }
  bool Has(const std::string& name) {
    std::lock_guard lock(mu);
    return claims.contains(name);
  }
  bool Gone(const std::string& name) {
    std::lock_guard lock(mu);
    return std::find(gone.begin(), gone.end(), name) != gone.end();
  }
};

// Each agent receives only its own node's claims: the router's label, the hashed value for a node whose name is
// no label value, and a claim that loses its label (or is deleted) is gone for the watch.
TEST_F(ResourceClaimsTest, AnAgentWatchesOnlyItsOwnNodesClaims) {
  const std::string long_node = std::string(60, 'n') + ".example.com";  // 72 characters: hashed
  AddClaim("a1");
  AddClaim("b1");
  AddClaim("l1");
  Allocate("a1", "node-a", "gpu-0000-01-00-0");
  Seen a, l;
  auto client_a = Client("node-a");
  auto client_l = Client(long_node);
  auto watch_a = client_a->Watch(a.Handlers());
  auto watch_l = client_l->Watch(l.Handlers());
  ASSERT_TRUE(sim::KubeApiSim::WaitFor([&] { return a.Has("a1"); }));
  Allocate("b1", "node-b", "gpu-0000-01-00-0");
  Allocate("l1", long_node, "gpu-0000-01-00-0");
  ASSERT_TRUE(sim::KubeApiSim::WaitFor([&] { return l.Has("l1"); }));
  EXPECT_EQ(StoredClaim("l1")["metadata"]["labels"][std::string(kClaimNodeLabel)],
            ClaimNodeLabelValue(long_node));  // the fake router's rule is the header's
  EXPECT_FALSE(a.Has("b1"));
  EXPECT_FALSE(a.Has("l1"));
  EXPECT_FALSE(l.Has("a1"));
  {
    std::lock_guard lock(a.mu);
    ASSERT_EQ(a.claims["a1"].results.size(), 1u);
    EXPECT_TRUE(a.claims["a1"].allocated);
  }
  ASSERT_TRUE(api_->Control("unlabel vms a1").ok());
  ASSERT_TRUE(sim::KubeApiSim::WaitFor([&] { return a.Gone("a1"); }));
  ASSERT_TRUE(api_->Control("delete-claim vms l1").ok());
  ASSERT_TRUE(sim::KubeApiSim::WaitFor([&] { return l.Gone("l1"); }));
  // The requests were the label-selected list and watch, nothing cluster-wide.
  for (const sim::KubeApiRequest& request : api_->Log()) {
    if (request.path.starts_with(kResourceClaimsPath)) {
      EXPECT_EQ(request.method, "GET");
    }
  }
}

// The scheduler copies a device's binding conditions into its allocation result; the agent reads them.
TEST_F(ResourceClaimsTest, AllocationResultsCarryTheSlicesBindingConditions) {
  auto kubeconfig = api_->WriteKubeconfig(dir_.path() / "kubeconfig");
  auto publisher = ConnectResourceSlicePublisher(*kubeconfig, "", {.driver = kDriver, .node_name = "node-a"});
  ASSERT_TRUE(publisher.ok()) << publisher.status();
  ASSERT_TRUE((*publisher)
                  ->Publish({{.name = "gpu-0000-01-00-0",
                              .binding_conditions = {kBound},
                              .binding_failure_conditions = {kFailed}}})
                  .ok());
  AddClaim("a1");
  Allocate("a1", "node-a", "gpu-0000-01-00-0");
  Seen seen;
  auto client = Client("node-a");
  auto watch = client->Watch(seen.Handlers());
  ASSERT_TRUE(sim::KubeApiSim::WaitFor([&] { return seen.Has("a1"); }));
  std::lock_guard lock(seen.mu);
  const AllocationResult& result = seen.claims["a1"].results.at(0);
  EXPECT_EQ(result.binding_conditions, std::vector<std::string>{kBound});
  EXPECT_EQ(result.binding_failure_conditions, std::vector<std::string>{kFailed});
}

// Server-side apply sets exactly our entries (another driver's stay), validated as 1.36 validates status.devices.
TEST_F(ResourceClaimsTest, ApplyingDeviceStatusSetsOurEntriesAndIsValidated) {
  AddClaim("a1");
  ASSERT_TRUE(api_->Control(R"(allocate vms a1 node-a [] [{"request":"gpu","driver":"gpu.vfio-agent.cozystack.io","pool":"node-a","device":"gpu-1"},{"request":"gpu","driver":"net.example.com","pool":"node-a","device":"nic-1"}])").ok());
  Json stored = StoredClaim("a1");
  ResourceClaim claim{.namespace_name = "vms", .name = "a1", .uid = stored["metadata"]["uid"]};
  const DeviceCondition bound{.type = kBound, .status = "True", .reason = "Bound", .message = "0000:01:00.0 on vfio-pci",
                              .last_transition_time = "2026-12-05T08:00:00Z", .observed_generation = 1};
  auto client = Client("node-a");

  ASSERT_TRUE(client->ApplyDeviceStatus(claim, {{.driver = kDriver, .pool = "node-a", .device = "gpu-1",
                                                 .conditions = {bound}}})
                  .ok());
  stored = StoredClaim("a1");
  ASSERT_EQ(stored["status"]["devices"].size(), 1u);
  EXPECT_EQ(stored["status"]["devices"][0]["conditions"][0]["type"], kBound);
  EXPECT_EQ(stored["status"]["devices"][0]["conditions"][0]["status"], "True");
  const sim::KubeApiRequest last = api_->Log().back();
  EXPECT_EQ(last.content_type, "application/apply-patch+yaml");
  EXPECT_THAT(last.path, HasSubstr("/namespaces/vms/resourceclaims/a1/status"));

  // Not an allocated device: 422 in kube-apiserver's words.
  absl::Status refused = client->ApplyDeviceStatus(
      claim, {{.driver = kDriver, .pool = "node-a", .device = "gpu-9", .conditions = {bound}}});
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("must be an allocated device in the claim"));
  // An invalid condition (no reason): 422.
  DeviceCondition no_reason = bound;
  no_reason.reason = "";
  EXPECT_EQ(client->ApplyDeviceStatus(claim, {{.driver = kDriver, .pool = "node-a", .device = "gpu-1",
                                               .conditions = {no_reason}}})
                .code(),
            absl::StatusCode::kInvalidArgument);
  // The claim deleted and created again under its name: the old UID is a conflict, nothing written.
  ResourceClaim old = claim;
  old.uid = "00000000-0000-0000-0000-000000000000";
  EXPECT_EQ(client->ApplyDeviceStatus(old, {{.driver = kDriver, .pool = "node-a", .device = "gpu-1",
                                             .conditions = {bound}}})
                .code(),
            absl::StatusCode::kAborted);
  // Our failure condition replaces our entry; no entry at all takes it away.
  DeviceCondition failed{.type = kFailed, .status = "True", .reason = "HeldByProcess", .message = "pid 42 qemu",
                         .last_transition_time = "2026-12-05T08:00:01Z", .observed_generation = 1};
  ASSERT_TRUE(client->ApplyDeviceStatus(claim, {{.driver = kDriver, .pool = "node-a", .device = "gpu-1",
                                                 .conditions = {failed}}})
                  .ok());
  stored = StoredClaim("a1");
  ASSERT_EQ(stored["status"]["devices"][0]["conditions"].size(), 1u);
  EXPECT_EQ(stored["status"]["devices"][0]["conditions"][0]["type"], kFailed);
  ASSERT_TRUE(client->ApplyDeviceStatus(claim, {}).ok());
  EXPECT_FALSE(StoredClaim("a1")["status"].contains("devices"));
}

}  // namespace
}  // namespace vfio_agent::kube
