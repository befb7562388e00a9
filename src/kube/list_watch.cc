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

// What joins a query parameter to `path`.
const char* Separator(const std::string& path) { return path.find('?') == std::string::npos ? "?" : "&"; }

}  // namespace

ListWatcher::ListWatcher(std::shared_ptr<ApiClient> client, std::string path, std::string what,
                         std::string thread_name, Handlers handlers, int list_page)
    : client_(std::move(client)),
      path_(std::move(path)),
      what_(std::move(what)),
      thread_name_(std::move(thread_name)),
      handlers_(std::move(handlers)),
      list_page_(list_page),
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

absl::StatusOr<Json> ListWatcher::List() {
  Json whole;
  std::string continue_token;
  do {
    std::string path = path_;
    if (list_page_ > 0) absl::StrAppend(&path, Separator(path), "limit=", list_page_);
    if (!continue_token.empty()) absl::StrAppend(&path, "&continue=", continue_token);
    absl::StatusOr<ApiResponse> page = client_->Send("GET", path, "", "", list_page_ > 0 ? 30s : 10s, &stopping_);
    if (stopping_) return absl::CancelledError("stopping");
    if (page.ok() && page->code == 410 && !continue_token.empty()) {
      continue_token.clear();  // the continue token expired between pages: start over
      whole = Json();
      continue;
    }
    if (absl::Status status = ListStatus(page, absl::StrCat("GET ", client_->Url(path))); !status.ok()) return status;
    Json body = Json::parse(page->body, nullptr, /*allow_exceptions=*/false);
    if (!body.is_object() || !body.contains("metadata") || !body["metadata"].is_object() ||
        !body["metadata"].contains("resourceVersion") || !body["metadata"]["resourceVersion"].is_string()) {
      return absl::DataLossError(absl::StrCat("GET ", client_->Url(path), ": the list has no metadata.resourceVersion"));
    }
    continue_token = body["metadata"].value("continue", "");
    if (whole.is_null()) {
      whole = std::move(body);
    } else {
      // Later pages: their items, and the resourceVersion of the list as a whole (the same on every page).
      if (body.contains("items") && body["items"].is_array()) {
        if (!whole.contains("items") || !whole["items"].is_array()) whole["items"] = Json::array();
        for (Json& item : body["items"]) whole["items"].push_back(std::move(item));
      }
      whole["metadata"]["resourceVersion"] = body["metadata"]["resourceVersion"];
    }
  } while (!continue_token.empty());
  whole["metadata"].erase("continue");
  return whole;
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
      absl::StatusOr<Json> body = List();
      if (stopping_) return;
      if (!body.ok()) {
        if (!failed(std::string(body.status().message()))) return;
        continue;
      }
      version = (*body)["metadata"]["resourceVersion"].get<std::string>();
      if (handlers_.listed) handlers_.listed(*body, listed);
      listed = true;
    }
    const int timeout_seconds = std::uniform_int_distribution<int>(300, 600)(random);
    const std::string path = absl::StrCat(path_, Separator(path_), "watch=true&allowWatchBookmarks=true&resourceVersion=", version,
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
