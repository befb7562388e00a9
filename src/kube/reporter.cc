#include "reporter.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "curl_library.h"
#include "vfio_gpu_agent/kube/kubevirt_reader.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/common/thread_name.h"

namespace vfio_agent::kube {
namespace {

using Json = nlohmann::json;
using TimePoint = Clock::TimePoint;

constexpr char kStrategicMergePatch[] = "application/strategic-merge-patch+json";
constexpr char kMergePatch[] = "application/merge-patch+json";
// Events of a cluster-scoped object (the Node) live in namespace default, as kubectl and client-go put them.
constexpr char kEventNamespace[] = "default";
constexpr size_t kNoteLimit = 1024;  // events.k8s.io/v1 validation
constexpr size_t kReasonLimit = 128;
constexpr size_t kSeriesMemory = 256;  // distinct (type, reason, note) whose Event we remember for series

class SteadyClock final : public Clock {
 public:
  TimePoint Now() override { return std::chrono::steady_clock::now(); }
  std::chrono::system_clock::time_point WallNow() override { return std::chrono::system_clock::now(); }
  void WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, TimePoint deadline) override {
    if (deadline == TimePoint::max()) {
      cv.wait(lock);
    } else {
      cv.wait_until(lock, deadline);
    }
  }
};

// Cut at a UTF-8 character boundary so that the JSON stays valid.
std::string Truncate(const std::string& text, size_t limit) {
  if (text.size() <= limit) return text;
  size_t end = limit;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  return text.substr(0, end);
}

ConditionStatus ParseConditionStatus(const std::string& text) {
  if (text == "True") return ConditionStatus::kTrue;
  if (text == "False") return ConditionStatus::kFalse;
  return ConditionStatus::kUnknown;
}

std::string Dump(const Json& json) { return json.dump(-1, ' ', false, Json::error_handler_t::replace); }

// What went wrong, for "logged once per kind" and for the retry policy.
enum class Failure { kNone, kUnreachable, kCut, kTimeout, kUnauthorized, kForbidden, kNotFound, kConflict,
                     kThrottled, kServerError, kRejected, kDenied, kNoClient };

// An admission policy's answer (ValidatingAdmissionPolicy, 403 or 422): the same write gets the same answer,
// so it is not retried.
bool DeniedByPolicy(long code, const std::string& message) {
  return (code == 403 || code == 422) && absl::StrContains(message, "ValidatingAdmissionPolicy");
}

const char* Describe(Failure failure) {
  switch (failure) {
    case Failure::kNone: return "ok";
    case Failure::kUnreachable: return "API server unreachable";
    case Failure::kCut: return "connection cut mid-request";
    case Failure::kTimeout: return "request timed out";
    case Failure::kUnauthorized: return "401 Unauthorized (token rejected)";
    case Failure::kForbidden: return "403 Forbidden (RBAC)";
    case Failure::kNotFound: return "404 Not Found";
    case Failure::kConflict: return "409 Conflict";
    case Failure::kThrottled: return "429 Too Many Requests";
    case Failure::kServerError: return "server error (5xx)";
    case Failure::kRejected: return "request rejected";
    case Failure::kDenied: return "denied by an admission policy";
    case Failure::kNoClient: return "no HTTP client";
  }
  return "unknown";
}

struct Outcome {
  Failure failure = Failure::kNone;
  long code = 0;
  std::string detail;  // method, URL and the server's message
  std::optional<std::chrono::seconds> retry_after;
  Json body;
  bool ok() const { return failure == Failure::kNone; }
};

using EventKey = std::tuple<EventType, std::string, std::string, std::string>;  // type, reason, action, note

struct PendingEvent {
  EventKey key;
  uint64_t occurrences = 0;  // recorded and not yet written
  std::chrono::system_clock::time_point first_seen;
  std::chrono::system_clock::time_point last_seen;
};

struct SentEvent {
  std::string name;
  uint64_t count = 0;  // series.count on the server (1: no series yet)
  uint64_t order = 0;  // for forgetting the oldest
};

class NodeReporterImpl final : public NodeReporter {
 public:
  NodeReporterImpl(std::unique_ptr<ApiClient> client, ReporterOptions options)
      : client_(std::move(client)),
        options_(std::move(options)),
        clock_(*options_.clock),
        tokens_(options_.write_burst),
        refilled_at_(clock_.Now()),
        backoff_(options_.backoff_initial) {
    worker_ = std::thread([this] {
      NameThisThread("va-kube-api");
      Run();
    });
  }

  ~NodeReporterImpl() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    abort_ = true;           // an in-flight request gives up at its next progress callback
    watch_cancel_.Cancel();  // the watch at once: it sleeps in poll(2), with no progress callback to wait for
    cv_.notify_all();
    worker_.join();
    if (watcher_.joinable()) watcher_.join();
  }

  bool WatchLabels(std::function<void(const std::map<std::string, std::string>&)> on_labels) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (watcher_.joinable() || stopping_) return false;
    on_labels_ = std::move(on_labels);
    watcher_ = std::thread([this] {
      NameThisThread("va-kube-watch");
      WatchLoop();
    });
    return true;
  }

  bool WatchKubevirtRelease(std::function<void(const std::optional<KubevirtRelease>&)> on_release) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (on_release_ || stopping_) return false;
      on_release_ = std::move(on_release);
      next_kubevirt_read_ = clock_.Now();
    }
    cv_.notify_all();
    return true;
  }

  void SetCondition(const NodeCondition& condition) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (wanted_ == condition) return;
      wanted_ = condition;
    }
    cv_.notify_all();
  }

  void SetLabel(const std::string& key, const std::string& value) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (auto it = wanted_labels_.find(key); it != wanted_labels_.end() && it->second == value) return;
      wanted_labels_[key] = value;
    }
    cv_.notify_all();
  }

  void RecordEvent(EventType type, const std::string& reason, const std::string& action,
                   const std::string& note) override {
    const auto now = clock_.WallNow();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      EventKey key{type, reason, action, note};
      for (PendingEvent& pending : events_) {
        if (pending.key == key) {  // a repeat not yet written joins it: one write for both
          ++pending.occurrences;
          pending.last_seen = now;
          return;
        }
      }
      if (events_.size() >= options_.queue_limit) {
        ++stats_.events_dropped;
        if (!drop_logged_) {
          spdlog::warn("node {}: Kubernetes event queue full ({} distinct events waiting), dropping {} \"{}\" and "
                       "further ones until it drains", options_.node_name, events_.size(), reason, note);
          drop_logged_ = true;
        }
        return;
      }
      events_.push_back(PendingEvent{std::move(key), 1, now, now});
    }
    cv_.notify_all();
  }

  absl::StatusOr<std::map<std::string, std::string>> NodeLabels(std::chrono::milliseconds timeout) override {
    Outcome outcome = Request("GET", NodePath(), "", "", timeout);
    if (!outcome.ok()) return ToStatus(outcome);
    return LabelsOf(outcome.body);
  }

  ReporterStats Stats() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return StatsLocked();
  }

  void OnStats(std::function<void(const ReporterStats&)> listener) override {
    std::lock_guard<std::mutex> lock(mutex_);
    listener_ = std::move(listener);
  }

  absl::Status FlushCondition(std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mutex_);
    // The last word before a stop is worth an attempt now rather than after the current backoff.
    retry_at_ = TimePoint{};
    cv_.notify_all();
    if (!flushed_cv_.wait_for(lock, timeout, [&] { return !ConditionDue(); })) {
      return absl::DeadlineExceededError(absl::StrCat("node ", options_.node_name, ": the ", kConditionType,
                                                      " condition was not stored within ", timeout.count(), " ms"));
    }
    if (wanted_ && wanted_ == rejected_) {
      return absl::FailedPreconditionError(absl::StrCat("node ", options_.node_name, ": the API refused the ",
                                                        kConditionType, " condition"));
    }
    return absl::OkStatus();
  }

 private:
  std::string NodePath() const { return absl::StrCat("/api/v1/nodes/", options_.node_name); }

  static absl::Status ToStatus(const Outcome& outcome) {
    switch (outcome.failure) {
      case Failure::kUnauthorized: return absl::UnauthenticatedError(outcome.detail);
      case Failure::kForbidden: return absl::PermissionDeniedError(outcome.detail);
      case Failure::kNotFound: return absl::NotFoundError(outcome.detail);
      case Failure::kTimeout: return absl::DeadlineExceededError(outcome.detail);
      case Failure::kRejected: return absl::InvalidArgumentError(outcome.detail);
      case Failure::kDenied: return absl::PermissionDeniedError(outcome.detail);
      case Failure::kNoClient: return absl::FailedPreconditionError(outcome.detail);
      default: return absl::UnavailableError(outcome.detail);
    }
  }

  // One request, no lock held. Counts it; classifies the answer; parses a 2xx body.
  Outcome Request(const std::string& method, const std::string& path, const std::string& content_type,
                  const std::string& body, std::chrono::milliseconds timeout) {
    absl::StatusOr<ApiResponse> response = client_->Send(method, path, content_type, body, timeout, &abort_);
    Outcome outcome;
    const std::string where = absl::StrCat(method, " ", client_->Url(path));
    if (!response.ok()) {
      outcome.detail = std::string(response.status().message());
      switch (response.status().code()) {
        case absl::StatusCode::kDeadlineExceeded: outcome.failure = Failure::kTimeout; break;
        case absl::StatusCode::kAborted: outcome.failure = Failure::kCut; break;
        case absl::StatusCode::kUnauthenticated: outcome.failure = Failure::kUnauthorized; break;
        case absl::StatusCode::kFailedPrecondition: outcome.failure = Failure::kNoClient; break;
        default: outcome.failure = Failure::kUnreachable; break;
      }
    } else {
      outcome.code = response->code;
      outcome.retry_after = response->retry_after;
      outcome.body = Json::parse(response->body, nullptr, /*allow_exceptions=*/false);
      if (outcome.code >= 200 && outcome.code < 300) {
        if (outcome.body.is_discarded()) {
          outcome.failure = Failure::kCut;
          outcome.detail = absl::StrCat(where, ": ", outcome.code, " with a body that is not JSON");
        }
      } else {
        std::string message = outcome.body.is_object() && outcome.body.contains("message") && outcome.body["message"].is_string()
                                  ? outcome.body["message"].get<std::string>()
                                  : Truncate(response->body, 200);
        outcome.detail = absl::StrCat(where, ": ", outcome.code, " ", message);
        if (DeniedByPolicy(outcome.code, message)) outcome.failure = Failure::kDenied;
        else if (outcome.code == 401) outcome.failure = Failure::kUnauthorized;
        else if (outcome.code == 403) outcome.failure = Failure::kForbidden;
        else if (outcome.code == 404) outcome.failure = Failure::kNotFound;
        else if (outcome.code == 409) outcome.failure = Failure::kConflict;
        else if (outcome.code == 429) outcome.failure = Failure::kThrottled;
        else if (outcome.code >= 500) outcome.failure = Failure::kServerError;
        else outcome.failure = Failure::kRejected;
      }
    }
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.requests = client_->requests();
    if (!outcome.ok()) ++stats_.failures;
    return outcome;
  }

  static std::map<std::string, std::string> LabelsOf(const Json& node) {
    std::map<std::string, std::string> labels;
    if (!node.is_object() || !node.contains("metadata")) return labels;
    const Json& metadata = node["metadata"];
    if (metadata.is_object() && metadata.contains("labels") && metadata["labels"].is_object()) {
      for (const auto& [name, value] : metadata["labels"].items()) {
        if (value.is_string()) labels[name] = value.get<std::string>();
      }
    }
    return labels;
  }

  static std::string ResourceVersionOf(const Json& object) {
    if (!object.is_object() || !object.contains("metadata") || !object["metadata"].is_object()) return "";
    const Json& metadata = object["metadata"];
    return metadata.contains("resourceVersion") && metadata["resourceVersion"].is_string()
               ? metadata["resourceVersion"].get<std::string>()
               : "";
  }

  // --- label watch (its own thread; mutex_ only for stopping_ and the stats) ---

  void DeliverLabels(const std::map<std::string, std::string>& labels) {
    if (delivered_labels_ && *delivered_labels_ == labels) return;
    delivered_labels_ = labels;
    on_labels_(labels);
  }

  // The stream of one watch request: OK when the server ended it after events or its timeout, or a failure to back
  // off from. `resource_version` follows the events; cleared after 410 Gone (the caller lists again).
  absl::Status WatchOnce(const std::string& selector, std::string& resource_version) {
    bool gone = false;
    std::string error;
    int events = 0;
    const auto on_line = [&](absl::string_view line) {
      const Json event = Json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!event.is_object() || !event.contains("object")) return true;
      ++events;
      const std::string type = event.value("type", "");
      const Json& object = event["object"];
      if (type == "ERROR") {
        if (object.is_object() && object.value("code", 0) == 410) {
          gone = true;
        } else {
          error = object.is_object() ? object.value("message", std::string("watch error")) : "watch error";
        }
        return true;
      }
      if (std::string rv = ResourceVersionOf(object); !rv.empty()) resource_version = rv;
      if (type == "ADDED" || type == "MODIFIED") DeliverLabels(LabelsOf(object));
      if (type == "DELETED") DeliverLabels({});
      return true;
    };
    const std::string path = absl::StrCat("/api/v1/nodes?", selector, "&watch=1&allowWatchBookmarks=true&resourceVersion=",
                                          resource_version, "&timeoutSeconds=", kWatchSeconds);
    const auto started = std::chrono::steady_clock::now();
    absl::StatusOr<ApiResponse> response =
        client_->Stream(path, on_line, std::chrono::seconds(kWatchSeconds + 30), watch_cancel_);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stats_.requests = client_->requests();
      if (!response.ok() || response->code < 200 || response->code >= 300) ++stats_.failures;
    }
    if (!response.ok()) return response.status();
    if (response->code == 410 || gone) {
      spdlog::info("node {}: label watch: resourceVersion {} expired (410 Gone); listing again", options_.node_name,
                   resource_version);
      resource_version.clear();
      return absl::OkStatus();
    }
    if (response->code < 200 || response->code >= 300) {
      return absl::UnavailableError(absl::StrCat("GET ", client_->Url(path), ": ", response->code, " ",
                                                 ServerMessage(*response)));
    }
    if (!error.empty()) return absl::UnavailableError(absl::StrCat("watch of node ", options_.node_name, ": ", error));
    // A server that ends every watch at once would otherwise be asked again in a tight loop.
    if (events == 0 && std::chrono::steady_clock::now() - started < std::chrono::seconds(1)) {
      return absl::UnavailableError(absl::StrCat("GET ", client_->Url(path), ": the watch ended at once"));
    }
    return absl::OkStatus();
  }

  void WatchLoop() {
    const std::string selector = absl::StrCat("fieldSelector=metadata.name%3D", options_.node_name);
    std::string resource_version;  // empty: list first
    std::chrono::milliseconds backoff = kWatchBackoffInitial;
    bool failure_logged = false;
    while (true) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (stopping_) return;
      }
      absl::Status status = absl::OkStatus();
      if (resource_version.empty()) {
        Outcome outcome = Request("GET", absl::StrCat("/api/v1/nodes?", selector), "", "", kWatchListTimeout);
        if (!outcome.ok()) {
          status = ToStatus(outcome);
        } else {
          resource_version = ResourceVersionOf(outcome.body);
          const Json& items = outcome.body["items"];
          DeliverLabels(items.is_array() && !items.empty() ? LabelsOf(items[0]) : std::map<std::string, std::string>{});
          if (resource_version.empty()) status = absl::UnavailableError("node list without a resourceVersion");
        }
      } else {
        status = WatchOnce(selector, resource_version);
      }
      if (status.ok()) {
        if (failure_logged) spdlog::info("node {}: label watch: connected again", options_.node_name);
        backoff = kWatchBackoffInitial;
        failure_logged = false;
        continue;
      }
      if (status.code() == absl::StatusCode::kCancelled) return;  // the destructor aborted it
      if (!failure_logged) {
        spdlog::warn("node {}: label watch: {}; retrying with backoff (up to {} s)", options_.node_name,
                     std::string(status.message()), kWatchBackoffMax.count() / 1000);
        failure_logged = true;
      }
      std::unique_lock<std::mutex> lock(mutex_);
      if (cv_.wait_for(lock, backoff, [&] { return stopping_; })) return;
      backoff = std::min(backoff * 2, kWatchBackoffMax);
    }
  }

  // --- worker (mutex_ held except around requests) ---

  bool ConditionDue() const { return wanted_ && wanted_ != accepted_ && wanted_ != rejected_; }

  // The wanted labels the node does not carry yet (and the API has not refused).
  std::map<std::string, std::string> LabelsDue() const {
    std::map<std::string, std::string> due;
    for (const auto& [key, value] : wanted_labels_) {
      auto accepted = accepted_labels_.find(key);
      auto rejected = rejected_labels_.find(key);
      if (accepted != accepted_labels_.end() && accepted->second == value) continue;
      if (rejected != rejected_labels_.end() && rejected->second == value) continue;
      due[key] = value;
    }
    return due;
  }

  ReporterStats StatsLocked() const {
    ReporterStats stats = stats_;
    stats.pending_writes = events_.size() + (ConditionDue() ? 1 : 0) + (LabelsDue().empty() ? 0 : 1);
    return stats;
  }

  // The listener runs without the lock, so that it may read anything it likes.
  void ReportStats(std::unique_lock<std::mutex>& lock) {
    if (!listener_) return;
    const ReporterStats stats = StatsLocked();
    if (reported_ && *reported_ == stats) return;
    reported_ = stats;
    const std::function<void(const ReporterStats&)> listener = listener_;
    lock.unlock();
    listener(stats);
    lock.lock();
  }

  // The stored condition is the wanted one and its lastHeartbeatTime is one interval old.
  std::optional<std::chrono::system_clock::time_point> HeartbeatAt() const {
    if (!node_known_ || !wanted_ || stored_ != wanted_ || ConditionDue()) return std::nullopt;
    if (!stored_heartbeat_) return std::chrono::system_clock::time_point{};  // unreadable: refresh it now
    return *stored_heartbeat_ + options_.heartbeat_interval;
  }
  bool HeartbeatDue() const {
    const auto at = HeartbeatAt();
    return at && clock_.WallNow() >= *at;
  }
  TimePoint NextHeartbeat() const {
    const auto at = HeartbeatAt();
    if (!at) return TimePoint::max();
    return clock_.Now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(*at - clock_.WallNow());
  }

  bool TakeWriteToken(TimePoint now) {
    const double elapsed = std::chrono::duration<double>(now - refilled_at_).count();
    tokens_ = std::min<double>(options_.write_burst, tokens_ + elapsed * options_.writes_per_second);
    refilled_at_ = now;
    if (tokens_ < 1.0) return false;
    tokens_ -= 1.0;
    return true;
  }

  TimePoint NextWriteToken() const {
    const double wait = (1.0 - tokens_) / options_.writes_per_second;
    return refilled_at_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(wait));
  }

  void Succeeded() {
    backoff_ = options_.backoff_initial;
    if (!logged_failures_.empty()) {
      spdlog::info("node {}: Kubernetes API requests succeed again", options_.node_name);
      logged_failures_.clear();
    }
  }

  // Logged once per kind until a request succeeds; the next attempt waits Retry-After or the backoff.
  void Failed(const Outcome& outcome, TimePoint now, bool back_off = true) {
    if (stopping_) return;  // the request was aborted by the destructor
    // A 409 is optimistic concurrency doing its job (the kubelet updates the node every few seconds): the node is
    // read again and the patch decided again, nothing an operator should be told about.
    if (outcome.failure == Failure::kConflict) {
      spdlog::debug("node {}: Kubernetes API: {}; reading the node again", options_.node_name, outcome.detail);
    } else if (logged_failures_.insert(outcome.failure).second) {
      spdlog::warn("node {}: Kubernetes API: {}: {}; retrying with backoff (further failures of this kind are not "
                   "logged until a request succeeds)", options_.node_name, Describe(outcome.failure), outcome.detail);
    }
    if (outcome.retry_after) {
      retry_at_ = now + *outcome.retry_after;
    } else if (back_off) {
      retry_at_ = now + backoff_;
      backoff_ = std::min(backoff_ * 2, options_.backoff_max);
    }
  }

  void Run() {
    // Opening libcurl takes ~10 ms; here it overlaps whatever the caller does before its first request.
    (void)Curl();
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopping_) {
      ReportStats(lock);
      if (stopping_) break;
      const bool work =
          ConditionDue() || !events_.empty() || !LabelsDue().empty() || HeartbeatDue() || KubevirtReadDue();
      if (!work) {
        clock_.WaitUntil(cv_, lock, std::min(NextHeartbeat(), NextKubevirtRead()));
        continue;
      }
      const TimePoint now = clock_.Now();
      if (now < retry_at_) {
        clock_.WaitUntil(cv_, lock, retry_at_);
        continue;
      }
      if (KubevirtReadDue()) {
        ReadKubevirt(lock, now);
        continue;
      }
      if (!node_known_) {
        FetchNode(lock, now);
        continue;
      }
      // The fetched node may already carry the condition.
      if (!ConditionDue() && events_.empty() && LabelsDue().empty() && !HeartbeatDue()) continue;
      if (!TakeWriteToken(now)) {
        clock_.WaitUntil(cv_, lock, NextWriteToken());
        continue;
      }
      if (ConditionDue()) {
        PatchCondition(lock, now, /*heartbeat=*/false);
      } else if (!LabelsDue().empty()) {
        PatchLabels(lock, now);
      } else if (!events_.empty()) {
        WriteEvent(lock, now);
      } else {
        PatchCondition(lock, now, /*heartbeat=*/true);
      }
    }
  }

  // --- the KubeVirt release (on the worker; a read, so no write token) ---

  TimePoint NextKubevirtRead() const { return on_release_ ? next_kubevirt_read_ : TimePoint::max(); }
  bool KubevirtReadDue() const { return on_release_ && clock_.Now() >= next_kubevirt_read_; }

  // The first item's status.observedKubeVirtVersion: KubeVirt runs one CR per cluster.
  static std::optional<KubevirtRelease> ReleaseOfList(const Json& list) {
    if (!list.is_object() || !list.contains("items") || !list["items"].is_array()) return std::nullopt;
    for (const Json& item : list["items"]) {
      if (!item.is_object() || !item.contains("status") || !item["status"].is_object()) continue;
      const Json& status = item["status"];
      if (status.contains("observedKubeVirtVersion") && status["observedKubeVirtVersion"].is_string()) {
        return ParseKubevirtRelease(status["observedKubeVirtVersion"].get<std::string>());
      }
    }
    return std::nullopt;
  }

  void ReadKubevirt(std::unique_lock<std::mutex>& lock, TimePoint now) {
    lock.unlock();
    Outcome outcome = Request("GET", kKubevirtsPath, "", "", options_.request_timeout);
    lock.lock();
    std::optional<KubevirtRelease> release;
    if (outcome.ok()) {
      Succeeded();
      release = ReleaseOfList(outcome.body);
    } else if (outcome.failure == Failure::kNotFound || outcome.failure == Failure::kForbidden) {
      // Not a passing fault: KubeVirt is not installed, or RBAC does not let us read its CR. Unknown, asked again
      // at the next interval.
      if (!kubevirt_unreadable_logged_) {
        spdlog::info("node {}: no KubeVirt release ({}); the device plugin's --vfio-backend auto takes the newest "
                     "release's nodes", options_.node_name, outcome.detail);
        kubevirt_unreadable_logged_ = true;
      }
    } else {
      Failed(outcome, now);  // next_kubevirt_read_ stays due: read again after the backoff
      return;
    }
    next_kubevirt_read_ = now + options_.kubevirt_interval;
    if (delivered_release_ && *delivered_release_ == release) return;
    spdlog::info("node {}: KubeVirt release {}", options_.node_name, release ? release->text : "unknown");
    delivered_release_ = release;
    const std::function<void(const std::optional<KubevirtRelease>&)> on_release = on_release_;
    lock.unlock();
    on_release(release);
    lock.lock();
  }

  // The node's uid (for events), resourceVersion (for the patch precondition) and our condition as stored.
  void FetchNode(std::unique_lock<std::mutex>& lock, TimePoint now) {
    lock.unlock();
    Outcome outcome = Request("GET", NodePath(), "", "", options_.request_timeout);
    lock.lock();
    if (!outcome.ok()) {
      Failed(outcome, now);
      return;
    }
    const Json& metadata = outcome.body["metadata"];
    node_uid_ = metadata.value("uid", "");
    node_resource_version_ = metadata.value("resourceVersion", "");
    stored_ = std::nullopt;
    stored_heartbeat_ = std::nullopt;
    const Json& conditions = outcome.body["status"]["conditions"];
    if (conditions.is_array()) {
      for (const Json& condition : conditions) {
        if (condition.is_object() && condition.value("type", "") == kConditionType) {
          stored_ = NodeCondition{.status = ParseConditionStatus(condition.value("status", "")),
                                  .reason = condition.value("reason", ""),
                                  .message = condition.value("message", "")};
          stored_heartbeat_ = ParseRfc3339(condition.value("lastHeartbeatTime", ""));
        }
      }
    }
    // Already there (a restart in an unchanged state): nothing to write.
    if (stored_ && wanted_ && *stored_ == *wanted_) accepted_ = wanted_;
    accepted_labels_.clear();
    if (metadata.contains("labels") && metadata["labels"].is_object()) {
      for (const auto& [key, value] : wanted_labels_) {
        if (metadata["labels"].value(key, Json()) == value) accepted_labels_[key] = value;
      }
    }
    node_known_ = true;
    Succeeded();
  }

  void PatchCondition(std::unique_lock<std::mutex>& lock, TimePoint now, bool heartbeat) {
    const NodeCondition sending = *wanted_;
    const auto sent_at = std::chrono::time_point_cast<std::chrono::seconds>(clock_.WallNow());
    const std::string stamp = Rfc3339(sent_at);
    Json condition = {{"type", kConditionType},
                      {"status", ConditionStatusName(sending.status)},
                      {"reason", sending.reason},
                      {"message", sending.message},
                      {"lastHeartbeatTime", stamp}};
    // Strategic merge keeps the stored lastTransitionTime when the patch leaves it out.
    if (!stored_ || stored_->status != sending.status) condition["lastTransitionTime"] = stamp;
    Json patch = {{"status", {{"conditions", Json::array({condition})}}}};
    // The precondition makes a patch decided on a stale view (lastTransitionTime) fail with 409. A heartbeat
    // decides nothing (same status, no transition time), and the kubelet's own status updates would make
    // most of them a 409 and a read: it goes without.
    if (!heartbeat) patch["metadata"] = {{"resourceVersion", node_resource_version_}};
    lock.unlock();
    Outcome outcome = Request("PATCH", NodePath() + "/status", kStrategicMergePatch, Dump(patch), options_.request_timeout);
    lock.lock();
    if (outcome.ok()) {
      accepted_ = sending;
      stored_ = sending;
      stored_heartbeat_ = sent_at;
      node_resource_version_ = outcome.body["metadata"].value("resourceVersion", node_resource_version_);
      ++stats_.condition_patches;
      Succeeded();
      flushed_cv_.notify_all();
      return;
    }
    if (outcome.failure == Failure::kConflict || outcome.failure == Failure::kNotFound) {
      node_known_ = false;  // read the node again, then decide again
      Failed(outcome, now, /*back_off=*/outcome.failure == Failure::kNotFound);
      return;
    }
    if (outcome.failure == Failure::kRejected || outcome.failure == Failure::kDenied) {
      if (outcome.failure == Failure::kRejected || logged_failures_.insert(Failure::kDenied).second) {
        spdlog::error("node {}: Kubernetes API {} the {} condition, not retrying it: {}", options_.node_name,
                      outcome.failure == Failure::kDenied ? "denied (admission policy)" : "rejected", kConditionType,
                      outcome.detail);
      }
      rejected_ = sending;
      flushed_cv_.notify_all();
      return;
    }
    Failed(outcome, now);
  }

  // A merge patch of the node's metadata.labels: no resourceVersion precondition, each label is its own.
  void PatchLabels(std::unique_lock<std::mutex>& lock, TimePoint now) {
    const std::map<std::string, std::string> sending = LabelsDue();
    Json labels = Json::object();
    // null removes a label in a merge patch.
    for (const auto& [key, value] : sending) labels[key] = value.empty() ? Json(nullptr) : Json(value);
    const Json patch = {{"metadata", {{"labels", labels}}}};
    lock.unlock();
    Outcome outcome = Request("PATCH", NodePath(), kMergePatch, Dump(patch), options_.request_timeout);
    lock.lock();
    if (outcome.ok()) {
      for (const auto& [key, value] : sending) accepted_labels_[key] = value;
      ++stats_.label_patches;
      Succeeded();
      return;
    }
    if (outcome.failure == Failure::kNotFound) {
      node_known_ = false;
      Failed(outcome, now);
      return;
    }
    // RBAC without `patch` on nodes (a passthrough ClusterRole) answers the same until the agent is redeployed.
    if (outcome.failure == Failure::kRejected || outcome.failure == Failure::kDenied ||
        outcome.failure == Failure::kForbidden) {
      spdlog::error("node {}: Kubernetes API refused the node labels, not retrying them: {}", options_.node_name,
                    outcome.detail);
      for (const auto& [key, value] : sending) rejected_labels_[key] = value;
      return;
    }
    Failed(outcome, now);
  }

  // Once until a request succeeds: a policy that denies one event denies the next for the same reason.
  void LogDenied(const Outcome& outcome) {
    if (!logged_failures_.insert(Failure::kDenied).second) return;
    spdlog::error("node {}: Kubernetes API denied an event (admission policy), dropping it and not retrying; "
                  "further denials are not logged until a request succeeds: {}", options_.node_name, outcome.detail);
  }

  std::string NextEventName(std::chrono::system_clock::time_point time) {
    // client-go's scheme, <object>.<hex nanoseconds>, kept strictly increasing for events in the same instant.
    uint64_t nanos = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(time.time_since_epoch()).count());
    nanos = std::max(nanos, last_event_nanos_ + 1);
    last_event_nanos_ = nanos;
    return absl::StrFormat("%s.%x", options_.node_name, nanos);
  }

  Json NewEvent(const PendingEvent& pending, const std::string& name) const {
    const auto& [type, reason, action, note] = pending.key;
    Json event = {{"apiVersion", "events.k8s.io/v1"},
                  {"kind", "Event"},
                  {"metadata", {{"name", name}, {"namespace", kEventNamespace}}},
                  {"eventTime", Rfc3339Micro(pending.first_seen)},
                  {"reportingController", kReportingController},
                  {"reportingInstance", Truncate(options_.node_name, kReasonLimit)},
                  {"action", Truncate(action, kReasonLimit)},
                  {"reason", Truncate(reason, kReasonLimit)},
                  {"note", Truncate(note, kNoteLimit)},
                  {"type", type == EventType::kWarning ? "Warning" : "Normal"},
                  {"regarding", {{"apiVersion", "v1"}, {"kind", "Node"}, {"name", options_.node_name}, {"uid", node_uid_}}}};
    if (pending.occurrences > 1) {
      event["series"] = {{"count", pending.occurrences}, {"lastObservedTime", Rfc3339Micro(pending.last_seen)}};
    }
    return event;
  }

  // Repeats recorded while the write was in flight stay queued for the next series update.
  void Consume(uint64_t written) {
    PendingEvent& front = events_.front();
    front.occurrences -= std::min(written, front.occurrences);
    if (front.occurrences == 0) events_.pop_front();
    if (events_.empty()) drop_logged_ = false;
  }

  void Remember(const EventKey& key, SentEvent sent) {
    sent.order = ++sent_order_;
    sent_[key] = std::move(sent);
    if (sent_.size() <= kSeriesMemory) return;
    auto oldest = std::min_element(sent_.begin(), sent_.end(),
                                   [](const auto& a, const auto& b) { return a.second.order < b.second.order; });
    sent_.erase(oldest);
  }

  void WriteEvent(std::unique_lock<std::mutex>& lock, TimePoint now) {
    const PendingEvent pending = events_.front();
    auto sent = sent_.find(pending.key);
    if (sent != sent_.end()) {
      const uint64_t count = sent->second.count + pending.occurrences;
      Json patch = {{"series", {{"count", count}, {"lastObservedTime", Rfc3339Micro(pending.last_seen)}}}};
      const std::string path = absl::StrCat("/apis/events.k8s.io/v1/namespaces/", kEventNamespace, "/events/", sent->second.name);
      lock.unlock();
      Outcome outcome = Request("PATCH", path, kMergePatch, Dump(patch), options_.request_timeout);
      lock.lock();
      if (outcome.ok()) {
        if (auto it = sent_.find(pending.key); it != sent_.end()) it->second.count = count;
        ++stats_.events_updated;
        Consume(pending.occurrences);
        Succeeded();
      } else if (outcome.failure == Failure::kNotFound) {
        sent_.erase(pending.key);  // the Event expired (its TTL is an hour): the next write creates a new one
      } else if (outcome.failure == Failure::kRejected || outcome.failure == Failure::kConflict) {
        spdlog::error("node {}: Kubernetes API rejected the series update of event {}: {}", options_.node_name,
                      sent->second.name, outcome.detail);
        sent_.erase(pending.key);
      } else if (outcome.failure == Failure::kDenied) {
        LogDenied(outcome);
        ++stats_.events_dropped;
        Consume(pending.occurrences);
      } else {
        Failed(outcome, now);
      }
      return;
    }
    const std::string name = NextEventName(pending.first_seen);
    const std::string body = Dump(NewEvent(pending, name));
    const std::string path = absl::StrCat("/apis/events.k8s.io/v1/namespaces/", kEventNamespace, "/events");
    lock.unlock();
    Outcome outcome = Request("POST", path, "application/json", body, options_.request_timeout);
    lock.lock();
    if (outcome.ok()) {
      Remember(pending.key, SentEvent{.name = name, .count = std::max<uint64_t>(pending.occurrences, 1)});
      ++stats_.events_created;
      Consume(pending.occurrences);
      Succeeded();
    } else if (outcome.failure == Failure::kConflict) {
      Failed(outcome, now, /*back_off=*/false);  // name taken: the next attempt has a new one
    } else if (outcome.failure == Failure::kRejected) {
      spdlog::error("node {}: Kubernetes API rejected event {} \"{}\", dropping it: {}", options_.node_name,
                    std::get<1>(pending.key), std::get<2>(pending.key), outcome.detail);
      ++stats_.events_dropped;
      Consume(pending.occurrences);
    } else if (outcome.failure == Failure::kDenied) {
      LogDenied(outcome);
      ++stats_.events_dropped;
      Consume(pending.occurrences);
    } else {
      Failed(outcome, now);
    }
  }

  const std::unique_ptr<ApiClient> client_;
  const ReporterOptions options_;
  Clock& clock_;

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::condition_variable flushed_cv_;  // a condition patch ended (accepted or refused)
  bool stopping_ = false;
  std::atomic<bool> abort_{false};
  StreamCanceller watch_cancel_;  // the label watch's stream
  ReporterStats stats_;

  std::optional<NodeCondition> wanted_;
  std::optional<NodeCondition> accepted_;
  std::optional<NodeCondition> rejected_;
  std::optional<NodeCondition> stored_;  // as the node carried it at the last read or accepted patch
  std::optional<std::chrono::system_clock::time_point> stored_heartbeat_;  // its lastHeartbeatTime
  std::map<std::string, std::string> wanted_labels_;
  std::map<std::string, std::string> accepted_labels_;  // as the node carries them (of the wanted keys)
  std::map<std::string, std::string> rejected_labels_;
  std::function<void(const ReporterStats&)> listener_;
  std::optional<ReporterStats> reported_;
  bool node_known_ = false;
  std::string node_uid_;
  std::string node_resource_version_;

  std::deque<PendingEvent> events_;
  bool drop_logged_ = false;
  std::map<EventKey, SentEvent> sent_;
  uint64_t sent_order_ = 0;
  uint64_t last_event_nanos_ = 0;

  double tokens_;
  TimePoint refilled_at_;
  TimePoint retry_at_{};
  std::chrono::milliseconds backoff_;
  std::set<Failure> logged_failures_;

  // The label watch: owned by watcher_ (on_labels_ set before it starts, never changed after).
  static constexpr int kWatchSeconds = 300;  // the server ends each watch then; it is opened again at once
  static constexpr std::chrono::milliseconds kWatchListTimeout{10000};
  static constexpr std::chrono::milliseconds kWatchBackoffInitial{1000};
  static constexpr std::chrono::milliseconds kWatchBackoffMax{30000};
  std::function<void(const std::map<std::string, std::string>&)> on_labels_;
  std::optional<std::map<std::string, std::string>> delivered_labels_;

  // WatchKubevirtRelease: set once under mutex_, then the worker's.
  std::function<void(const std::optional<KubevirtRelease>&)> on_release_;
  TimePoint next_kubevirt_read_ = TimePoint::max();
  std::optional<std::optional<KubevirtRelease>> delivered_release_;  // outer nullopt: nothing told yet
  bool kubevirt_unreadable_logged_ = false;

  std::thread worker_;  // started in the constructor's body, once every member is initialised
  std::thread watcher_;  // started by WatchLabels
};

}  // namespace

const char* ConditionStatusName(ConditionStatus status) {
  switch (status) {
    case ConditionStatus::kTrue: return "True";
    case ConditionStatus::kFalse: return "False";
    case ConditionStatus::kUnknown: return "Unknown";
  }
  return "Unknown";
}

Clock& RealClock() {
  static SteadyClock clock;
  return clock;
}

std::string Rfc3339(std::chrono::system_clock::time_point time) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::FromChrono(time), absl::UTCTimeZone());
}

std::optional<std::chrono::system_clock::time_point> ParseRfc3339(const std::string& text) {
  absl::Time time;
  std::string error;
  if (text.empty() || !absl::ParseTime(absl::RFC3339_full, text, &time, &error)) return std::nullopt;
  return absl::ToChronoTime(time);
}

std::string Rfc3339Micro(std::chrono::system_clock::time_point time) {
  const absl::Time t = absl::FromChrono(time);
  // %E6S gives seconds with exactly six fractional digits, as metav1.MicroTime requires.
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", t, absl::UTCTimeZone());
}

std::unique_ptr<NodeReporter> StartNodeReporter(std::unique_ptr<ApiClient> client, ReporterOptions options) {
  return std::make_unique<NodeReporterImpl>(std::move(client), std::move(options));
}

}  // namespace vfio_agent::kube
