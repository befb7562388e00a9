// The fake API server is strict where kube-apiserver is: these tests hold it to that, through ApiClient.
#include <fstream>

#include "api_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "api_sim_fixture.h"
#include "kube_api_sim.h"
#include "nlohmann/json.hpp"
#include "support/sysfs_tree.h"

namespace vfio_agent::kube {
namespace {

using Json = nlohmann::json;
using sim::KubeApiSim;
using ::testing::HasSubstr;

constexpr std::chrono::seconds kTimeout(10);
constexpr char kEvents[] = "/apis/events.k8s.io/v1/namespaces/default/events";

class ApiSimTest : public testing::KubeApiSimTest {
 protected:
  void SetUp() override {
    testing::KubeApiSimTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    client_ = std::make_unique<ApiClient>(ClusterConfig{.server = api_->url(), .token = api_->token()});
  }

  ApiResponse Send(const std::string& method, const std::string& path, const std::string& content_type = "",
                   const Json& body = nullptr) {
    absl::StatusOr<ApiResponse> response =
        client_->Send(method, path, content_type, body.is_null() ? "" : body.dump(), kTimeout);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? *response : ApiResponse{};
  }

  static Json ValidEvent(const std::string& name) {
    return {{"apiVersion", "events.k8s.io/v1"}, {"kind", "Event"}, {"metadata", {{"name", name}}},
            {"eventTime", "2026-12-01T10:00:00.000001Z"}, {"reportingController", "vfio-gpu-agent"},
            {"reportingInstance", "node-a"}, {"action", "Bind"}, {"reason", "Bound"}, {"note", "ok"},
            {"type", "Normal"}, {"regarding", {{"kind", "Node"}, {"name", "node-a"}}}};
  }

  std::unique_ptr<ApiClient> client_;
};

TEST_F(ApiSimTest, BearerTokenRequired) {
  ApiClient anonymous(ClusterConfig{.server = api_->url()});
  absl::StatusOr<ApiResponse> response = anonymous.Send("GET", "/api/v1/nodes/node-a", "", "", kTimeout);
  ASSERT_TRUE(response.ok());
  EXPECT_EQ(response->code, 401);
  EXPECT_EQ(Send("GET", "/api/v1/nodes/node-a").code, 200);
  EXPECT_EQ(Send("GET", "/api/v1/nodes/ghost").code, 404);
}

TEST_F(ApiSimTest, StatusPatchContentTypesAndConflicts) {
  const Json condition = {{"status", {{"conditions", {{{"type", "GPUPassthroughReady"}, {"status", "True"}}}}}}};
  EXPECT_EQ(Send("PATCH", "/api/v1/nodes/node-a/status", "application/json", condition).code, 415);
  EXPECT_EQ(Send("PATCH", "/api/v1/nodes/node-a/status", "application/strategic-merge-patch+json", condition).code, 200);
  Json node = *api_->Node("node-a");
  // Strategic merge by type: the kubelet's Ready condition is still there beside ours.
  EXPECT_EQ(node["status"]["conditions"].size(), 2u);
  Json stale = condition;
  stale["metadata"]["resourceVersion"] = "1";
  EXPECT_EQ(Send("PATCH", "/api/v1/nodes/node-a/status", "application/merge-patch+json", stale).code, 409);
  stale["metadata"]["resourceVersion"] = node["metadata"]["resourceVersion"];
  EXPECT_EQ(Send("PATCH", "/api/v1/nodes/node-a/status", "application/merge-patch+json", stale).code, 200);
  // A JSON merge patch replaces the list.
  EXPECT_EQ((*api_->Node("node-a"))["status"]["conditions"].size(), 1u);
}

TEST_F(ApiSimTest, EventSchemaIsEnforced) {
  EXPECT_EQ(Send("POST", kEvents, "application/json", ValidEvent("node-a.1")).code, 201);
  EXPECT_EQ(Send("POST", kEvents, "application/json", ValidEvent("node-a.1")).code, 409);  // name taken
  for (const char* field : {"eventTime", "reportingController", "reportingInstance", "action", "reason", "regarding"}) {
    Json event = ValidEvent(std::string("node-a.missing-") + field);
    event.erase(field);
    EXPECT_EQ(Send("POST", kEvents, "application/json", event).code, 422) << field;
  }
  Json bad_type = ValidEvent("node-a.t");
  bad_type["type"] = "Error";
  EXPECT_EQ(Send("POST", kEvents, "application/json", bad_type).code, 422);
  Json long_note = ValidEvent("node-a.n");
  long_note["note"] = std::string(1025, 'x');
  EXPECT_EQ(Send("POST", kEvents, "application/json", long_note).code, 422);
  Json seconds_only = ValidEvent("node-a.s");
  seconds_only["eventTime"] = "2026-12-01T10:00:00Z";
  EXPECT_EQ(Send("POST", kEvents, "application/json", seconds_only).code, 422);

  const std::string path = std::string(kEvents) + "/node-a.1";
  EXPECT_EQ(Send("PATCH", path, "application/merge-patch+json", {{"series", {{"count", 1}}}}).code, 422);
  EXPECT_EQ(Send("PATCH", path, "application/merge-patch+json", {{"note", "changed"}}).code, 422);
  EXPECT_EQ(Send("PATCH", path, "application/merge-patch+json",
                 {{"series", {{"count", 2}, {"lastObservedTime", "2026-12-01T10:00:01.000000Z"}}}}).code, 200);
  EXPECT_EQ(Send("PATCH", std::string(kEvents) + "/gone", "application/merge-patch+json", {{"series", nullptr}}).code, 404);
}

TEST_F(ApiSimTest, InjectedFaults) {
  ASSERT_TRUE(api_->Control("fail GET /api/v1/nodes 429 1 3").ok());
  ApiResponse throttled = Send("GET", "/api/v1/nodes/node-a");
  EXPECT_EQ(throttled.code, 429);
  EXPECT_EQ(throttled.retry_after, std::chrono::seconds(3));
  EXPECT_EQ(Send("GET", "/api/v1/nodes/node-a").code, 200);  // count 1: only the first

  ASSERT_TRUE(api_->Control("cut * /api 1").ok());
  absl::StatusOr<ApiResponse> cut = client_->Send("GET", "/api/v1/nodes/node-a", "", "", kTimeout);
  EXPECT_TRUE(absl::IsAborted(cut.status())) << cut.status();
  EXPECT_THAT(cut.status().message(), HasSubstr(api_->url() + "/api/v1/nodes/node-a"));

  ASSERT_TRUE(api_->Control("fail * / 503 -1").ok());
  EXPECT_EQ(Send("GET", "/api/v1/nodes/node-a").code, 503);
  EXPECT_EQ(Send("GET", "/api/v1/nodes/node-a").code, 503);
  ASSERT_TRUE(api_->Control("clear-faults").ok());
  EXPECT_EQ(Send("GET", "/api/v1/nodes/node-a").code, 200);
  EXPECT_EQ(api_->Count("GET", "/api/v1/nodes/node-a", "503"), 2u);
  EXPECT_EQ(api_->Count("GET", "/api/v1/nodes/node-a", "cut"), 1u);
}

TEST_F(ApiSimTest, UnreachableServerIsATransportErrorNamingTheUrl) {
  ApiClient nowhere(ClusterConfig{.server = "http://127.0.0.1:1", .token = "t"});
  absl::StatusOr<ApiResponse> response = nowhere.Send("GET", "/api/v1/nodes/node-a", "", "", kTimeout);
  EXPECT_TRUE(absl::IsUnavailable(response.status())) << response.status();
  EXPECT_THAT(response.status().message(), HasSubstr("http://127.0.0.1:1/api/v1/nodes/node-a"));
}

}  // namespace
}  // namespace vfio_agent::kube
