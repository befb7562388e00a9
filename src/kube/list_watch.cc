#include "list_watch.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "api_client.h"
#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/common/thread_name.h"

namespace vfio_agent::kube {
namespace {

using Json = nlohmann::json;
using namespace std::chrono_literals;

// What a request's answer means to the caller: its error, with the request and the server's words.
absl::Status ListStatus(const absl::StatusOr<ApiResponse>& response, const std::string& request) {
  if (!response.ok()) return response.status();
  if (response->code >= 200 && response->code < 300) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(request, ": ", response->code, " ", ServerMessage(*response)));
}

}  // namespace

ListWatcher::ListWatcher(std::shared_ptr<ApiClient> client, std::string path, std::string what,
                         std::string thread_name, Handlers handlers)
    : client_(std::move(client)),
      path_(std::move(path)),
      what_(std::move(what)),
      thread_name_(std::move(thread_name)),
      handlers_(std::move(handlers)),
      cancel_(std::make_unique<StreamCanceller>()) {
  thread_ = std::thread([this] { Run(); });
}

ListWatcher::~ListWatcher() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cancel_->Cancel();
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool ListWatcher::WaitBackoff(std::chrono::milliseconds backoff) {
  std::unique_lock lock(mu_);
  return !cv_.wait_for(lock, backoff, [this] { return stopping_.load(); });
}

void ListWatcher::Run() {
  NameThisThread(thread_name_.c_str());
  constexpr std::chrono::milliseconds kFirstBackoff = 1s;
  constexpr std::chrono::milliseconds kMaxBackoff = 30s;
  std::chrono::milliseconds backoff = kFirstBackoff;
  std::string version;  // empty: list first
  bool listed = false;
  std::string failing;  // the error logged, until a watch works again
  // client-go's reflector asks for a random 5 to 10 minutes, so that a fleet's watches do not all end at once.
  std::mt19937 random(std::random_device{}());
  auto failed = [&](const std::string& why) {
    if (why != failing) spdlog::warn("watch of {} {}: {}; retried in {} s", what_, path_, why, backoff.count() / 1000);
    failing = why;
    if (!WaitBackoff(backoff)) return false;
    backoff = std::min(backoff * 2, kMaxBackoff);
    return true;
  };
  while (!stopping_) {
    if (version.empty()) {
      ++lists_;
      absl::StatusOr<ApiResponse> list = client_->Send("GET", path_, "", "", 10s, &stopping_);
      if (stopping_) return;
      absl::Status status = ListStatus(list, absl::StrCat("GET ", client_->Url(path_)));
      Json body;
      if (status.ok()) body = Json::parse(list->body, nullptr, /*allow_exceptions=*/false);
      if (status.ok() && (!body.is_object() || !body.contains("metadata") || !body["metadata"].is_object() ||
                          !body["metadata"].contains("resourceVersion") ||
                          !body["metadata"]["resourceVersion"].is_string())) {
        status = absl::DataLossError("the list has no metadata.resourceVersion");
      }
      if (!status.ok()) {
        if (!failed(std::string(status.message()))) return;
        continue;
      }
      version = body["metadata"]["resourceVersion"].get<std::string>();
      if (handlers_.listed) handlers_.listed(body, listed);
      listed = true;
    }
    const int timeout_seconds = std::uniform_int_distribution<int>(300, 600)(random);
    const std::string path = absl::StrCat(path_, "&watch=true&allowWatchBookmarks=true&resourceVersion=", version,
                                          "&timeoutSeconds=", timeout_seconds);
    ++watches_;
    bool gone = false;
    std::string error;
    const auto started = std::chrono::steady_clock::now();
    absl::StatusOr<ApiResponse> answer = client_->Stream(
        path,
        [&](absl::string_view line) {
          const Json event = Json::parse(line, nullptr, /*allow_exceptions=*/false);
          if (!event.is_object() || !event.contains("type") || !event["type"].is_string() ||
              !event.contains("object") || !event["object"].is_object()) {
            error = absl::StrCat("not a watch event: ", line.substr(0, 200));
            return false;
          }
          const std::string type = event["type"].get<std::string>();
          const Json& object = event["object"];
          if (type == "ERROR") {
            if (object.value("code", 0) == 410) {
              gone = true;
            } else {
              error = absl::StrCat("ERROR event: ", object.value("code", 0), " ", object.value("message", ""));
            }
            return false;
          }
          if (object.contains("metadata") && object["metadata"].is_object()) {
            const Json& meta = object["metadata"];
            if (meta.contains("resourceVersion") && meta["resourceVersion"].is_string()) {
              version = meta["resourceVersion"].get<std::string>();
            }
          }
          if (type != "BOOKMARK" && handlers_.event) handlers_.event(type, object);
          return true;
        },
        std::chrono::seconds(timeout_seconds + 30), *cancel_);
    if (stopping_) return;
    if (answer.ok() && answer->code == 410) gone = true;
    if (gone) {
      // The resourceVersion is compacted away: list again (the list's answer is what we may have missed).
      spdlog::info("watch of {} {}: resourceVersion {} is gone (410); listing again", what_, path_, version);
      version.clear();
      continue;
    }
    if (!answer.ok()) error = std::string(answer.status().message());
    if (error.empty() && answer->code / 100 != 2) {
      error = absl::StrCat(answer->code, " ", ServerMessage(*answer));
    }
    if (!error.empty()) {
      if (!failed(error)) return;
      continue;
    }
    if (std::chrono::steady_clock::now() - started < kFirstBackoff) {
      // Ended at once without an error (a proxy that cuts watches): not a reason to hammer the server.
      if (!failed("the server ended the watch at once")) return;
      continue;
    }
    if (!failing.empty()) spdlog::info("watch of {} {}: watching again", what_, path_);
    failing.clear();
    backoff = kFirstBackoff;
  }
}

}  // namespace vfio_agent::kube
