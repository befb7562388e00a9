// The NodeReporter against the fake API server. Time-dependent behaviour (rate limit, backoff, Retry-After)
// runs on a FakeClock: the test reads where the worker sleeps and moves the clock, never waits real seconds.
#include "reporter.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <atomic>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "api_client.h"
#include "vfio_gpu_agent/kube/kubevirt_reader.h"
#include "config.h"
#include "fake_clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "api_sim_fixture.h"
#include "kube_api_sim.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"
#include "support/sysfs_tree.h"

namespace vfio_agent::kube {
namespace {

using Json = nlohmann::json;
using sim::KubeApiSim;
using ::testing::HasSubstr;
using testing::FakeClock;
using TimePoint = Clock::TimePoint;
using vfio_agent::testing::TempDir;
using namespace std::chrono_literals;

constexpr char kStatus[] = "/api/v1/nodes/node-a/status";
constexpr char kNode[] = "/api/v1/nodes/node-a";
constexpr char kEvents[] = "/apis/events.k8s.io/v1/namespaces/default/events";

const NodeCondition kReady{.status = ConditionStatus::kTrue, .reason = "AllDevicesReady", .message = "8 GPUs bound and registered"};
const NodeCondition kNotBound{.status = ConditionStatus::kFalse, .reason = "DeviceNotBound", .message = "check binding.driver: 0000:3b:00.0"};

std::vector<std::string> Statuses(const KubeApiSim& api, const std::string& method, const std::string& path) {
  std::vector<std::string> statuses;
  for (const sim::KubeApiRequest& request : api.Log()) {
    if (request.method == method && request.path == path) statuses.push_back(request.status);
  }
  return statuses;
}

Json OurCondition(const Json& node) {
  for (const Json& condition : node["status"]["conditions"]) {
    if (condition["type"] == kConditionType) return condition;
  }
  return nullptr;
}

class ReporterTest : public testing::KubeApiSimTest {
 protected:
  std::unique_ptr<NodeReporter> Start(ReporterOptions options = {}, const std::string& node = "node-a") {
    auto kubeconfig = api_->WriteKubeconfig(dir_.path() / "kubeconfig");
    EXPECT_TRUE(kubeconfig.ok());
    auto config = LoadKubeconfig(*kubeconfig);
    EXPECT_TRUE(config.ok()) << config.status();
    options.node_name = node;
    return StartNodeReporter(std::make_unique<ApiClient>(*config), options);
  }

  ReporterOptions OnFakeClock() {
    ReporterOptions options;
    options.clock = &clock_;
    return options;
  }

  // The worker waits for a time in the future (rate limit, backoff, Retry-After): everything it could send
  // before is in the log. A sleep whose deadline the clock already passed is one it is waking from.
  std::optional<TimePoint> WaitForTimedSleep() {
    std::optional<TimePoint> until;
    const bool sleeping = KubeApiSim::WaitFor([&] {
      until = clock_.SleepingUntil();
      return until && *until != TimePoint::max() && *until > clock_.Now();
    });
    return sleeping ? until : std::nullopt;
  }

  // Asleep with nothing due for a minute: no write waits (the next heartbeat is minutes away, if any).
  bool WaitForIdle() {
    return KubeApiSim::WaitFor([&] {
      const std::optional<TimePoint> until = clock_.SleepingUntil();
      return until && (*until == TimePoint::max() || *until > clock_.Now() + 1min);
    });
  }

  FakeClock clock_;
};

TEST_F(ReporterTest, ConditionPatchedOnlyWhenItChanges) {
  auto reporter = Start(OnFakeClock());
  reporter->SetCondition(kReady);
  for (int i = 0; i < 5; ++i) reporter->SetCondition(kReady);
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return reporter->Stats().condition_patches == 1; }));
  ASSERT_TRUE(WaitForIdle());
  const Json first = OurCondition(*api_->Node("node-a"));
  EXPECT_EQ(first["status"], "True");
  EXPECT_EQ(first["reason"], "AllDevicesReady");
  EXPECT_EQ(first["message"], kReady.message);

  // Same status, new reason: lastTransitionTime stays, the heartbeat moves.
  clock_.Advance(5s);
  reporter->SetCondition({.status = ConditionStatus::kTrue, .reason = "AllDevicesReady", .message = "7 GPUs bound and registered"});
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return reporter->Stats().condition_patches == 2; }));
  const Json second = OurCondition(*api_->Node("node-a"));
  EXPECT_EQ(second["lastTransitionTime"], first["lastTransitionTime"]);
  EXPECT_NE(second["lastHeartbeatTime"], first["lastHeartbeatTime"]);

  clock_.Advance(5s);
  reporter->SetCondition(kNotBound);
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return reporter->Stats().condition_patches == 3; }));
  ASSERT_TRUE(WaitForIdle());
  const Json third = OurCondition(*api_->Node("node-a"));
  EXPECT_EQ(third["status"], "False");
  EXPECT_NE(third["lastTransitionTime"], first["lastTransitionTime"]);
  // One GET for the node, one PATCH per change, all with the strategic merge content type.
  EXPECT_EQ(Statuses(*api_, "PATCH", kStatus), (std::vector<std::string>{"200", "200", "200"}));
  EXPECT_EQ(api_->Count("GET", kNode), 1u);
  for (const sim::KubeApiRequest& request : api_->Log()) {
    if (request.method == "PATCH") {
      EXPECT_EQ(request.content_type, "application/strategic-merge-patch+json");
    }
  }
  EXPECT_EQ((*api_->Node("node-a"))["status"]["conditions"].size(), 2u);  // the kubelet's Ready is kept
}

TEST_F(ReporterTest, ConditionAlreadyOnTheNodeIsNotPatchedAgain) {
  {
    auto first = Start(OnFakeClock());
    first->SetCondition(kReady);
    ASSERT_TRUE(KubeApiSim::WaitFor([&] { return first->Stats().condition_patches == 1; }));
  }
  auto restarted = Start(OnFakeClock());  // an agent restart in the same state
  restarted->SetCondition(kReady);
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return api_->Count("GET", kNode) == 2; }));
  ASSERT_TRUE(WaitForIdle());
  EXPECT_EQ(restarted->Stats().condition_patches, 0u);
  EXPECT_EQ(api_->Count("PATCH", kStatus), 1u);
}

// nvidia.com/vgpu.config.state: a merge patch of the node's labels, sent only when the node does not carry the
// value, kept from a restarted agent, and a value the API refuses is not retried.
TEST_F(ReporterTest, LabelsArePatchedOnlyWhenTheNodeLacksThem) {
  constexpr char kState[] = "nvidia.com/vgpu.config.state";
  {
    auto reporter = Start(OnFakeClock());
    reporter->SetLabel(kState, "pending");
    ASSERT_TRUE(KubeApiSim::WaitFor([&] { return (*api_->Node("node-a"))["metadata"]["labels"].value(kState, "") == "pending"; }));
    reporter->SetLabel(kState, "success");
    ASSERT_TRUE(KubeApiSim::WaitFor([&] { return reporter->Stats().label_patches == 2; }));
    EXPECT_EQ((*api_->Node("node-a"))["metadata"]["labels"][kState], "success");
    reporter->SetLabel(kState, "success");
    ASSERT_TRUE(WaitForIdle());
    EXPECT_EQ(api_->Count("PATCH", kNode, "200"), 2u + api_->Count("PATCH", kStatus, "200"));
    for (const sim::KubeApiRequest& request : api_->Log()) {
      if (request.method != "PATCH" || request.path != kNode) continue;
      EXPECT_EQ(request.content_type, "application/merge-patch+json");
      EXPECT_EQ(request.body["metadata"].size(), 1u) << request.body.dump();  // labels only, no precondition
    }
  }
  auto restarted = Start(OnFakeClock());
  restarted->SetLabel(kState, "success");
  restarted->SetLabel("nvidia.com/bad", "not a label value!");
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return api_->Count("PATCH", kNode, "422") == 1; }));
  ASSERT_TRUE(WaitForIdle());
  EXPECT_EQ(restarted->Stats().label_patches, 0u);
  EXPECT_EQ(api_->Count("PATCH", kNode, "422"), 1u);  // not retried
  EXPECT_EQ(restarted->Stats().pending_writes, 0u);
}

// In an hour of an unchanged state the API hears the heartbeat alone: 12 PATCHes, each only moving
// lastHeartbeatTime.
TEST_F(ReporterTest, SteadyStateSendsOnlyTheHeartbeat) {
  auto reporter = Start(OnFakeClock());
  reporter->SetCondition(kReady);
  reporter->RecordEvent(EventType::kNormal, "GPUsBound", "Binding", "8 GPUs bound to vfio-pci");
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return reporter->Stats().events_created == 1; }));
  ASSERT_TRUE(WaitForIdle());
  const size_t requests = api_->Log().size();
  const Json first = OurCondition(*api_->Node("node-a"));
  for (int minute = 1; minute <= 60; ++minute) {
    clock_.Advance(1min);
    reporter->SetCondition(kReady);
    const uint64_t beats = static_cast<uint64_t>(minute / 5);
    ASSERT_TRUE(KubeApiSim::WaitFor([&] { return reporter->Stats().condition_patches == 1 + beats; })) << minute;
    // Asleep until the next beat: whatever this minute made it send has gone out.
    ASSERT_TRUE(WaitForTimedSleep()) << minute;
  }
  EXPECT_EQ(api_->Log().size(), requests + 12);
  EXPECT_EQ(reporter->Stats().requests, requests + 12);
  const Json last = OurCondition(*api_->Node("node-a"));
  EXPECT_EQ(last["status"], "True");
  EXPECT_EQ(last["lastTransitionTime"], first["lastTransitionTime"]);
  EXPECT_NE(last["lastHeartbeatTime"], first["lastHeartbeatTime"]);
  EXPECT_EQ(ParseRfc3339(last["lastHeartbeatTime"].get<std::string>()),
            std::chrono::time_point_cast<std::chrono::seconds>(clock_.WallNow()));
}

// The heartbeat's time comes from the node: an agent restarted 3 minutes after the last beat beats 2 minutes
// later, not 5 (nor at once).
TEST_F(ReporterTest, HeartbeatAfterARestartFollowsTheStoredBeat) {
  {
    auto first = Start(OnFakeClock());
    first->SetCondition(kReady);
    ASSERT_TRUE(KubeApiSim::WaitFor([&] { return first->Stats().condition_patches == 1; }));
  }
  clock_.Advance(3min);
  auto restarted = Start(OnFakeClock());
  restarted->SetCondition(kReady);
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return api_->Count("GET", kNode) == 2; }));
  const std::optional<TimePoint> until = WaitForTimedSleep();
  ASSERT_TRUE(until);
  EXPECT_LE(*until - clock_.Now(), std::chrono::steady_clock::duration(2min));
  EXPECT_GT(*until - clock_.Now(), std::chrono::steady_clock::duration(1min));
  EXPECT_EQ(restarted->Stats().condition_patches, 0u);
  clock_.Advance(2min);
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return restarted->Stats().condition_patches == 1; }));
  EXPECT_EQ(OurCondition(*api_->Node("node-a"))["status"], "True");
}

// The last word of a stopping agent: Unknown, stored before FlushCondition returns, even from inside a backoff.
TEST_F(ReporterTest, FlushStoresTheStopConditionWithinItsTimeout) {
  auto reporter = Start();
  reporter->SetCondition(kReady);
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return reporter->Stats().condition_patches == 1; }));
  ASSERT_TRUE(api_->Control("fail PATCH /api/v1/nodes 503 1").ok());
  reporter->SetCondition({.status = ConditionStatus::kFalse, .reason = "DeviceNotBound", .message = "x"});
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return reporter->Stats().failures == 1; }));  // now in a 1 s backoff
  reporter->SetCondition({.status = ConditionStatus::kUnknown, .reason = "AgentStopped", .message = "stopped"});
  EXPECT_TRUE(reporter->FlushCondition(30s).ok());
  const Json condition = OurCondition(*api_->Node("node-a"));
  EXPECT_EQ(condition["status"], "Unknown");
  EXPECT_EQ(condition["reason"], "AgentStopped");
  EXPECT_EQ(reporter->Stats().pending_writes, 0u);
}

TEST_F(ReporterTest, FlushGivesUpAtItsTimeoutWhenTheApiIsDown) {
  ASSERT_TRUE(api_->Control("hang PATCH /api/v1/nodes -1").ok());
  auto reporter = Start();
  reporter->SetCondition({.status = ConditionStatus::kUnknown, .reason = "AgentStopped", .message = "stopped"});
  const absl::Status status = reporter->FlushCondition(200ms);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(status.message(), HasSubstr(kConditionType));
  ASSERT_TRUE(api_->Control("release").ok());
}

// An admission policy's denial is final for that write: logged once with the policy's words, never retried.
TEST_F(ReporterTest, PolicyDenialIsLoggedOnceAndNotRetried) {
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  spdlog::default_logger()->sinks().push_back(sink);
  ASSERT_TRUE(api_->Control("deny-policy PATCH /api/v1/nodes 403 -1").ok());
  ASSERT_TRUE(api_->Control("deny-policy POST /apis/events.k8s.io 403 -1").ok());
  auto reporter = Start(OnFakeClock());
  reporter->SetCondition(kReady);
  reporter->RecordEvent(EventType::kNormal, "GPUsBound", "Binding", "one");
  reporter->RecordEvent(EventType::kNormal, "GPUsBound", "Binding", "two");
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return reporter->Stats().events_dropped == 2; }));
  ASSERT_TRUE(WaitForIdle());
  clock_.Advance(10min);  // no backoff, no heartbeat: nothing is due
  ASSERT_TRUE(WaitForIdle());
  spdlog::default_logger()->sinks().pop_back();
  EXPECT_EQ(Statuses(*api_, "PATCH", kStatus), std::vector<std::string>{"403"});
  EXPECT_EQ(Statuses(*api_, "POST", kEvents), (std::vector<std::string>{"403", "403"}));
  EXPECT_EQ(reporter->Stats().pending_writes, 0u);
  const std::string text = log.str();
  EXPECT_THAT(text, HasSubstr("ValidatingAdmissionPolicy 'vfio-gpu-agent-own-node'"));
  size_t lines = 0;
  for (size_t at = text.find("admission policy"); at != std::string::npos; at = text.find("admission policy", at + 1)) {
    ++lines;
  }
  EXPECT_EQ(lines, 1u) << text;
  // A new condition is a new write: tried once.
  reporter->SetCondition(kNotBound);
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return Statuses(*api_, "PATCH", kStatus).size() == 2; }));
}

// The stats listener hears every completed request: a gauge fed by it is never behind the API.
TEST_F(ReporterTest, StatsListenerHearsEveryCompletedWrite) {
  std::mutex mu;
  std::vector<ReporterStats> heard;
  auto reporter = Start(OnFakeClock());
  reporter->OnStats([&](const ReporterStats& stats) {
    std::lock_guard lock(mu);
    heard.push_back(stats);
  });
  reporter->SetCondition(kReady);
  reporter->RecordEvent(EventType::kNormal, "GPUsBound", "Binding", "8 GPUs bound to vfio-pci");
  ASSERT_TRUE(KubeApiSim::WaitFor([&] {
    std::lock_guard lock(mu);
    return !heard.empty() && heard.back().pending_writes == 0 && heard.back().events_created == 1;
  }));
  std::lock_guard lock(mu);
  EXPECT_EQ(heard.back().condition_patches, 1u);
  EXPECT_EQ(heard.back().requests, api_->Log().size());
  EXPECT_TRUE(std::any_of(heard.begin(), heard.end(), [](const ReporterStats& s) { return s.pending_writes > 0; }));
}

TEST_F(ReporterTest, RepeatsBecomeAnEventSeries) {
  auto reporter = Start(OnFakeClock());
  const std::string note = "0000:3b:00.0 held by nvidia-persistenced (pid 4242)";
  reporter->RecordEvent(EventType::kWarning, "BindBlocked", "Binding", note);
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return reporter->Stats().events_created == 1; }));
  for (int i = 0; i < 3; ++i) {
    clock_.Advance(1s);
    reporter->RecordEvent(EventType::kWarning, "BindBlocked", "Binding", note);
  }
  ASSERT_TRUE(KubeApiSim::WaitFor([&] {
    auto events = api_->Events();
    return events.ok() && events->size() == 1 && (*events)[0].contains("series") && (*events)[0]["series"]["count"] == 4;
  }));
  // The server stores the PATCH before it answers: the reporter counts it once it has read the answer.
  ASSERT_TRUE(WaitForIdle());
  EXPECT_EQ(api_->Count("POST", kEvents), 1u);
  EXPECT_GE(api_->Count("PATCH", kEvents, "200"), 1u);
  EXPECT_EQ(reporter->Stats().events_created, 1u);
  EXPECT_GE(reporter->Stats().events_updated, 1u);

  const Json event = (*api_->Events())[0];
  const Json node = *api_->Node("node-a");
  EXPECT_EQ(event["regarding"]["kind"], "Node");
  EXPECT_EQ(event["regarding"]["name"], "node-a");
  EXPECT_EQ(event["regarding"]["uid"], node["metadata"]["uid"]);
  EXPECT_EQ(event["reportingController"], "vfio-gpu-agent");
  EXPECT_EQ(event["reportingInstance"], "node-a");
  EXPECT_EQ(event["type"], "Warning");
  EXPECT_EQ(event["reason"], "BindBlocked");
  EXPECT_EQ(event["action"], "Binding");
  EXPECT_EQ(event["note"], note);

  // A different note is a different event.
  reporter->RecordEvent(EventType::kNormal, "GPUsBound", "Binding", "8 GPUs bound");
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return reporter->Stats().events_created == 2; }));
  EXPECT_EQ(api_->Count("POST", kEvents, "201"), 2u);
}

TEST_F(ReporterTest, LongNoteIsCutToTheApiLimit) {
  auto reporter = Start(OnFakeClock());
  reporter->RecordEvent(EventType::kWarning, "ValidationFailed", "Validating", std::string(3000, 'n'));
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return reporter->Stats().events_created == 1; }));
  EXPECT_EQ((*api_->Events())[0]["note"].get<std::string>().size(), 1024u);
}

TEST_F(ReporterTest, WritesBurstTenThenOnePerSecond) {
  auto reporter = Start(OnFakeClock());
  for (int i = 0; i < 15; ++i) reporter->RecordEvent(EventType::kNormal, "DeviceRecovered", "HealthChecking", absl::StrCat("device ", i));
  std::optional<TimePoint> until = WaitForTimedSleep();
  ASSERT_TRUE(until);
  EXPECT_EQ(api_->Count("POST", kEvents), 10u);
  EXPECT_EQ(*until, TimePoint() + 1s);  // the next token

  clock_.Advance(1s);
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return api_->Count("POST", kEvents) == 11; }));
  ASSERT_TRUE(WaitForTimedSleep());
  clock_.Advance(500ms);
  until = WaitForTimedSleep();
  ASSERT_TRUE(until);
  EXPECT_EQ(*until, TimePoint() + 2s);
  EXPECT_EQ(api_->Count("POST", kEvents), 11u);
  clock_.Advance(500ms);
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return api_->Count("POST", kEvents) == 12; }));
  clock_.Advance(3s);
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return reporter->Stats().events_created == 15; }));
  EXPECT_EQ(api_->Count("POST", kEvents, "201"), 15u);
}

TEST_F(ReporterTest, QueueIsBoundedAndDropsAreCounted) {
  ReporterOptions options = OnFakeClock();
  options.queue_limit = 4;
  ASSERT_TRUE(api_->Control("hang * / -1").ok());  // the worker is stuck in its first request
  auto reporter = Start(options);
  reporter->RecordEvent(EventType::kNormal, "R", "Testing", "first");
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return api_->Count("GET", kNode, "hang") == 1; }));
  for (int i = 0; i < 10; ++i) reporter->RecordEvent(EventType::kNormal, "R", "Testing", absl::StrCat("n", i));
  reporter->RecordEvent(EventType::kNormal, "R", "Testing", "first");  // a repeat joins the queued one: not a drop
  EXPECT_EQ(reporter->Stats().events_dropped, 7u);
  EXPECT_EQ(reporter->Stats().pending_writes, 4u);  // the queue, its first event (in flight) included
  reporter.reset();  // returns although its request hangs
  ASSERT_TRUE(api_->Control("release").ok());
}

TEST_F(ReporterTest, ApiDownTheWholeTimeNeverBlocksCallers) {
  ClusterConfig nowhere{.server = "http://127.0.0.1:1", .token = "t"};
  ReporterOptions options = OnFakeClock();
  options.node_name = "node-a";
  auto reporter = StartNodeReporter(std::make_unique<ApiClient>(nowhere), options);
  for (int i = 0; i < 1000; ++i) {
    reporter->SetCondition(i % 2 ? kReady : kNotBound);
    reporter->RecordEvent(EventType::kWarning, "DeviceLost", "HealthChecking", absl::StrCat("device ", i % 100));
  }
  // Backoff doubles: 1 s, 2 s, 4 s after the first, second and third failure.
  std::optional<TimePoint> until = WaitForTimedSleep();
  ASSERT_TRUE(until);
  EXPECT_EQ(*until, TimePoint() + 1s);
  clock_.Advance(1s);
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return reporter->Stats().failures == 2; }));
  until = WaitForTimedSleep();
  ASSERT_TRUE(until);
  EXPECT_EQ(*until, TimePoint() + 3s);
  clock_.Advance(2s);
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return reporter->Stats().failures == 3; }));
  until = WaitForTimedSleep();
  ASSERT_TRUE(until);
  EXPECT_EQ(*until, TimePoint() + 7s);
  EXPECT_EQ(reporter->Stats().requests, 3u);
  // Devices 64..99 found the queue full each of the ten times they were recorded.
  EXPECT_EQ(reporter->Stats().events_dropped, 36u * 10u);
  auto labels = reporter->NodeLabels(30s);  // refused at once; the limit only ends a failing test
  EXPECT_TRUE(absl::IsUnavailable(labels.status())) << labels.status();
  EXPECT_THAT(labels.status().message(), HasSubstr("http://127.0.0.1:1/api/v1/nodes/node-a"));
}

TEST_F(ReporterTest, ServerErrorsAreRetriedWithBackoffAndLoggedOnce) {
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  spdlog::default_logger()->sinks().push_back(sink);
  ASSERT_TRUE(api_->Control("fail PATCH /api/v1/nodes 503 3").ok());
  auto reporter = Start(OnFakeClock());
  reporter->SetCondition(kReady);
  for (auto backoff : {1s, 2s, 4s}) {
    ASSERT_TRUE(WaitForTimedSleep());
    EXPECT_EQ(reporter->Stats().pending_writes, 1u);  // the condition, until the API accepts it
    clock_.Advance(backoff);
  }
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return reporter->Stats().condition_patches == 1; }));
  EXPECT_EQ(reporter->Stats().pending_writes, 0u);
  spdlog::default_logger()->sinks().pop_back();
  EXPECT_EQ(Statuses(*api_, "PATCH", kStatus), (std::vector<std::string>{"503", "503", "503", "200"}));
  EXPECT_EQ(reporter->Stats().failures, 3u);
  const std::string text = log.str();
  size_t warnings = 0;
  for (size_t at = text.find("server error (5xx)"); at != std::string::npos; at = text.find("server error (5xx)", at + 1)) ++warnings;
  EXPECT_EQ(warnings, 1u) << text;
  EXPECT_THAT(text, HasSubstr("succeed again"));
}

TEST_F(ReporterTest, TooManyRequestsHonoursRetryAfter) {
  ASSERT_TRUE(api_->Control("fail PATCH /api/v1/nodes 429 1 7").ok());
  auto reporter = Start(OnFakeClock());
  reporter->SetCondition(kReady);
  std::optional<TimePoint> until = WaitForTimedSleep();
  ASSERT_TRUE(until);
  EXPECT_EQ(*until, TimePoint() + 7s);
  clock_.Advance(6s);
  until = WaitForTimedSleep();
  ASSERT_TRUE(until);
  EXPECT_EQ(api_->Count("PATCH", kStatus), 1u);
  clock_.Advance(1s);
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return reporter->Stats().condition_patches == 1; }));
  EXPECT_EQ(Statuses(*api_, "PATCH", kStatus), (std::vector<std::string>{"429", "200"}));
}

TEST_F(ReporterTest, ConnectionCutMidRequestIsRetried) {
  ASSERT_TRUE(api_->Control("cut POST /apis/events.k8s.io 1").ok());
  auto reporter = Start(OnFakeClock());
  reporter->RecordEvent(EventType::kNormal, "GPUsBound", "Binding", "8 GPUs bound");
  ASSERT_TRUE(WaitForTimedSleep());
  clock_.Advance(1s);
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return reporter->Stats().events_created == 1; }));
  EXPECT_EQ(Statuses(*api_, "POST", kEvents), (std::vector<std::string>{"cut", "201"}));
}

TEST_F(ReporterTest, ConflictReadsTheNodeAgainAndRetries) {
  auto reporter = Start(OnFakeClock());
  reporter->SetCondition(kReady);
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return reporter->Stats().condition_patches == 1; }));
  ASSERT_TRUE(api_->Control("touch-node node-a").ok());  // another writer: our resourceVersion is stale
  reporter->SetCondition(kNotBound);
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return reporter->Stats().condition_patches == 2; }));
  EXPECT_EQ(Statuses(*api_, "PATCH", kStatus), (std::vector<std::string>{"200", "409", "200"}));
  EXPECT_EQ(api_->Count("GET", kNode), 2u);
  EXPECT_EQ(OurCondition(*api_->Node("node-a"))["reason"], "DeviceNotBound");
}

TEST_F(ReporterTest, MissingNodeIsRetriedUntilItExists) {
  auto reporter = Start(OnFakeClock(), "node-new");
  reporter->SetCondition(kReady);
  ASSERT_TRUE(WaitForTimedSleep());
  EXPECT_EQ(Statuses(*api_, "GET", "/api/v1/nodes/node-new"), std::vector<std::string>{"404"});
  ASSERT_TRUE(api_->Control("node node-new").ok());
  clock_.Advance(1s);
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return reporter->Stats().condition_patches == 1; }));
}

TEST_F(ReporterTest, RejectedTokenRecoversWhenTheTokenFileRotates) {
  const auto token_file = dir_.path() / "token";
  std::ofstream(token_file) << api_->token();
  ClusterConfig config{.server = api_->url(), .token_file = token_file};
  ReporterOptions options = OnFakeClock();
  options.node_name = "node-a";
  auto reporter = StartNodeReporter(std::make_unique<ApiClient>(config), options);
  ASSERT_TRUE(reporter->NodeLabels(10s).ok());

  // The server moved on to a new token before the kubelet rotated ours: 401, backoff.
  ASSERT_TRUE(api_->Control("token rotated-1").ok());
  reporter->SetCondition(kReady);
  ASSERT_TRUE(WaitForTimedSleep());
  EXPECT_EQ(Statuses(*api_, "GET", kNode).back(), "401");
  { std::ofstream(dir_.path() / "token.new") << "rotated-1"; }
  std::filesystem::rename(dir_.path() / "token.new", token_file);
  clock_.Advance(1s);
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return reporter->Stats().condition_patches == 1; }));

  // A rotation the file's metadata does not show (same inode, size, mtime): the 401 itself makes us re-read.
  struct stat before {};
  ASSERT_EQ(::stat(token_file.c_str(), &before), 0);
  ASSERT_TRUE(api_->Control("token rotated-2").ok());
  { std::fstream(token_file, std::ios::in | std::ios::out) << "rotated-2"; }
  const timespec times[2] = {before.st_atim, before.st_mtim};
  ASSERT_EQ(::utimensat(AT_FDCWD, token_file.c_str(), times, 0), 0);
  reporter->SetCondition(kNotBound);
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return reporter->Stats().condition_patches == 2; }));
  EXPECT_EQ(Statuses(*api_, "PATCH", kStatus), (std::vector<std::string>{"200", "401", "200"}));
}

TEST_F(ReporterTest, NodeLabels) {
  ASSERT_TRUE(api_->Control(R"(node node-b {"nvidia.com/gpu.deploy.sandbox-device-plugin": "true"})").ok());
  auto reporter = Start({}, "node-b");
  auto labels = reporter->NodeLabels(10s);
  ASSERT_TRUE(labels.ok()) << labels.status();
  EXPECT_EQ(labels->at("nvidia.com/gpu.deploy.sandbox-device-plugin"), "true");

  ASSERT_TRUE(api_->Control("fail GET /api/v1/nodes 403 1").ok());
  EXPECT_TRUE(absl::IsPermissionDenied(reporter->NodeLabels(10s).status()));
  EXPECT_EQ(reporter->Stats().requests, 2u);
  EXPECT_EQ(reporter->Stats().failures, 1u);  // the 403
}

TEST_F(ReporterTest, ReadsGiveUpAtTheirTimeout) {
  ASSERT_TRUE(api_->Control("hang GET /api/v1/nodes 1").ok());
  auto reporter = Start();
  auto labels = reporter->NodeLabels(300ms);
  EXPECT_TRUE(absl::IsDeadlineExceeded(labels.status())) << labels.status();
  ASSERT_TRUE(api_->Control("release").ok());
}

TEST(InClusterTlsTest, ServiceAccountOverHttpsWithTokenRotation) {
  if (!KubeApiSim::Available(/*tls=*/true)) GTEST_SKIP() << "python3 or openssl not found";
  TempDir dir;
  auto api = KubeApiSim::Start(dir.path(), {.tls = true});
  ASSERT_TRUE(api.ok()) << api.status();
  const auto sa = dir.path() / "serviceaccount";
  std::filesystem::create_directories(sa);
  std::filesystem::copy_file((*api)->ca_file(), sa / "ca.crt");
  std::ofstream(sa / "token") << (*api)->token() << "\n";
  const std::string url = (*api)->url();
  const std::string port = url.substr(url.rfind(':') + 1);

  ::setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1", 1);
  ::setenv("KUBERNETES_SERVICE_PORT", port.c_str(), 1);
  ConnectOptions options;
  options.service_account_dir = sa;
  options.node_name = "node-a";
  auto reporter = ConnectNodeReporter(options);
  ::unsetenv("KUBERNETES_SERVICE_HOST");
  ::unsetenv("KUBERNETES_SERVICE_PORT");
  ASSERT_TRUE(reporter.ok()) << reporter.status();
  EXPECT_EQ((*api)->Log().size(), 0u);  // connecting does not contact the server
  ASSERT_TRUE((*reporter)->NodeLabels(10s).ok());

  ASSERT_TRUE((*api)->Control("token projected-2").ok());
  { std::ofstream(sa / "token.new") << "projected-2\n"; }
  std::filesystem::rename(sa / "token.new", sa / "token");
  (*reporter)->SetCondition(kReady);
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return (*reporter)->Stats().condition_patches == 1; }));
  EXPECT_EQ((*api)->Count("", "/", "401"), 0u);

  // The server's certificate is checked: without its CA (the system store) the request fails.
  ApiClient untrusted(ClusterConfig{.server = url, .token = "projected-2"});
  auto refused = untrusted.Send("GET", "/api/v1/nodes/node-a", "", "", 10s);
  EXPECT_TRUE(absl::IsUnavailable(refused.status())) << refused.status();
}

TEST(KubeconfigTlsTest, ClientCertificateAndCaDataOverHttps) {
  if (!KubeApiSim::Available(/*tls=*/true)) GTEST_SKIP() << "python3 or openssl not found";
  TempDir dir;
  auto api = KubeApiSim::Start(dir.path(), {.tls = true, .client_cert = true});
  ASSERT_TRUE(api.ok()) << api.status();
  auto base64_of = [](const std::filesystem::path& path) {
    std::ifstream in(path);
    std::stringstream content;
    content << in.rdbuf();
    return absl::Base64Escape(content.str());
  };
  const auto kubeconfig = dir.path() / "kubeconfig";
  std::ofstream(kubeconfig) << "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
                            << "clusters:\n- name: c\n  cluster:\n    server: " << (*api)->url()
                            << "\n    certificate-authority-data: " << base64_of((*api)->ca_file())
                            << "\nusers:\n- name: u\n  user:\n    client-certificate-data: "
                            << base64_of((*api)->client_cert_file())
                            << "\n    client-key-data: " << base64_of((*api)->client_key_file())
                            << "\ncontexts:\n- name: c\n  context: {cluster: c, user: u}\n";
  ConnectOptions options;
  options.kubeconfig = kubeconfig;
  options.node_name = "node-a";
  auto reporter = ConnectNodeReporter(options);
  ASSERT_TRUE(reporter.ok()) << reporter.status();
  auto labels = (*reporter)->NodeLabels(10s);
  EXPECT_TRUE(labels.ok()) << labels.status();

  // Without the client certificate the same server says 401.
  auto config = LoadKubeconfig(kubeconfig);
  ASSERT_TRUE(config.ok());
  config->client_cert_pem.clear();
  config->client_key_pem.clear();
  ApiClient anonymous(*config);
  auto response = anonymous.Send("GET", "/api/v1/nodes/node-a", "", "", 10s);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->code, 401);
}

// The label watch: one list, then one watch request held open; a label change reaches the callback, a change of
// the status (the agent's own condition, a heartbeat) does not; after etcd compacted the history (410 Gone) it
// lists again and goes on.
TEST_F(ReporterTest, LabelWatchDeliversLabelChangesOnlyAndListsAgainAfterGone) {
  std::mutex mutex;
  std::vector<std::map<std::string, std::string>> seen;
  auto seen_count = [&] {
    std::lock_guard lock(mutex);
    return seen.size();
  };
  auto reporter = Start();
  ASSERT_TRUE(reporter->WatchLabels([&](const std::map<std::string, std::string>& labels) {
    std::lock_guard lock(mutex);
    seen.push_back(labels);
  }));
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return seen_count() == 1; }));  // the list
  ASSERT_TRUE(api_->Control(R"(relabel node-a {"nvidia.com/vgpu.config": "a"})").ok());
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return seen_count() == 2; }));
  {
    std::lock_guard lock(mutex);
    EXPECT_EQ(seen[1].at("nvidia.com/vgpu.config"), "a");
  }
  // The status changes (the condition), the labels do not: nothing delivered. The next label change comes after it
  // in the stream, so once it arrives the status change would have too.
  reporter->SetCondition(kReady);
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return !Statuses(*api_, "PATCH", kStatus).empty(); }));
  ASSERT_TRUE(api_->Control(R"(relabel node-a {"nvidia.com/vgpu.config": "b"})").ok());
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return seen_count() == 3; }));

  const size_t lists = Statuses(*api_, "GET", "/api/v1/nodes").size();
  ASSERT_TRUE(api_->Control("compact").ok());
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return Statuses(*api_, "GET", "/api/v1/nodes").size() >= lists + 2; }));
  ASSERT_TRUE(api_->Control(R"(relabel node-a {"nvidia.com/vgpu.config": "c"})").ok());
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return seen_count() == 4; }));
  std::lock_guard lock(mutex);
  EXPECT_EQ(seen[3].at("nvidia.com/vgpu.config"), "c");
}

std::string KubevirtCrs(const std::string& version) {
  Json cr = {{"apiVersion", "kubevirt.io/v1"}, {"kind", "KubeVirt"},
             {"metadata", {{"name", "kubevirt"}, {"namespace", "kubevirt"}}}, {"spec", Json::object()}};
  if (!version.empty()) cr["status"] = {{"observedKubeVirtVersion", version}};
  return "kubevirts " + Json::array({cr}).dump();
}

// --vfio-backend auto's input: one GET of the KubeVirt CRs at the start and one an hour after each read; KubeVirt
// not installed (404) is "unknown", told once; the release is told again only when it changes (v1.8 -> v1.9, an
// upgrade while the agent runs), and a read that fails for a passing reason tells nothing and is retried.
TEST_F(ReporterTest, KubevirtReleaseIsReadHourlyAndToldOnChangeOnly) {
  std::mutex mutex;
  std::vector<std::optional<KubevirtRelease>> told;
  auto told_count = [&] {
    std::lock_guard lock(mutex);
    return told.size();
  };
  auto reporter = Start(OnFakeClock());
  ASSERT_TRUE(reporter->WatchKubevirtRelease([&](const std::optional<KubevirtRelease>& release) {
    std::lock_guard lock(mutex);
    told.push_back(release);
  }));
  EXPECT_FALSE(reporter->WatchKubevirtRelease([](const std::optional<KubevirtRelease>&) {}));  // at most once
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return told_count() == 1; }));
  EXPECT_EQ(told[0], std::nullopt);
  EXPECT_EQ(Statuses(*api_, "GET", kKubevirtsPath), std::vector<std::string>{"404"});
  std::optional<TimePoint> next = WaitForTimedSleep();
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(*next - clock_.Now(), std::chrono::hours(1));

  ASSERT_TRUE(api_->Control(KubevirtCrs("v1.8.1")).ok());
  clock_.Advance(1h);
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return told_count() == 2; }));
  ASSERT_TRUE(told[1].has_value());
  EXPECT_EQ(told[1]->text, "v1.8.1");
  EXPECT_FALSE(HandsOutCdevs(*told[1]));

  // The same release an hour later (a patch release too): read, not told.
  ASSERT_TRUE(api_->Control(KubevirtCrs("v1.8.2")).ok());
  ASSERT_TRUE(WaitForTimedSleep().has_value());
  clock_.Advance(1h);
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return Statuses(*api_, "GET", kKubevirtsPath).size() == 3; }));
  ASSERT_TRUE(WaitForTimedSleep().has_value());
  EXPECT_EQ(told_count(), 2u);

  // A 503 tells nothing; the retry after the backoff reads the upgraded release.
  ASSERT_TRUE(api_->Control(KubevirtCrs("v1.9.0")).ok());
  ASSERT_TRUE(api_->Control(absl::StrCat("fail GET ", kKubevirtsPath, " 503 1")).ok());
  clock_.Advance(1h);
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return Statuses(*api_, "GET", kKubevirtsPath).size() == 4; }));
  EXPECT_EQ(told_count(), 2u);
  clock_.Advance(2s);
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return told_count() == 3; }));
  ASSERT_TRUE(told[2].has_value());
  EXPECT_TRUE(HandsOutCdevs(*told[2]));
  EXPECT_EQ(Statuses(*api_, "GET", kKubevirtsPath), (std::vector<std::string>{"404", "200", "200", "503", "200"}));

  // KubeVirt removed (its CRD gone): unknown again.
  ASSERT_TRUE(api_->Control("no-kubevirt").ok());
  ASSERT_TRUE(WaitForTimedSleep().has_value());
  clock_.Advance(1h);
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return told_count() == 4; }));
  EXPECT_EQ(told[3], std::nullopt);
}

// A CR without a reported version yet (the operator has not deployed) is unknown, not a release.
TEST_F(ReporterTest, KubevirtCrWithoutAVersionIsUnknown) {
  ASSERT_TRUE(api_->Control(KubevirtCrs("")).ok());
  std::atomic<int> calls{0};
  std::optional<KubevirtRelease> last = KubevirtRelease{};
  auto reporter = Start();
  ASSERT_TRUE(reporter->WatchKubevirtRelease([&](const std::optional<KubevirtRelease>& release) {
    last = release;
    ++calls;
  }));
  ASSERT_TRUE(KubeApiSim::WaitFor([&] { return calls.load() == 1; }));
  EXPECT_EQ(last, std::nullopt);
}

TEST(KubevirtReleaseTest, ParsesMajorAndMinorOfWhatTheCrReports) {
  ASSERT_TRUE(ParseKubevirtRelease("v1.10.1-rc.0").has_value());
  EXPECT_EQ(ParseKubevirtRelease("v1.10.1-rc.0")->minor, 10);
  EXPECT_EQ(ParseKubevirtRelease("1.9.0")->major, 1);
  EXPECT_EQ(ParseKubevirtRelease("v1.9.0-alpha.0")->text, "v1.9.0-alpha.0");
  EXPECT_EQ(ParseKubevirtRelease("main"), std::nullopt);
  EXPECT_EQ(ParseKubevirtRelease(""), std::nullopt);
  EXPECT_EQ(ParseKubevirtRelease("v1"), std::nullopt);
  EXPECT_FALSE(HandsOutCdevs(*ParseKubevirtRelease("v1.8.99")));
  EXPECT_TRUE(HandsOutCdevs(*ParseKubevirtRelease("v1.9.0-alpha.0")));
  EXPECT_TRUE(HandsOutCdevs(*ParseKubevirtRelease("v2.0.0")));
}

}  // namespace
}  // namespace vfio_agent::kube
