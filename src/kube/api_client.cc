#include "api_client.h"

#include <algorithm>
#include <climits>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "curl_library.h"
#include "nlohmann/json.hpp"

namespace vfio_agent::kube {
namespace {

// API answers are small (a Node, an Event, the KubeVirt CRs); a bigger one is a misbehaving server.
constexpr size_t kMaxResponse = 8 << 20;

struct Transfer {
  std::string body;
  std::optional<std::chrono::seconds> retry_after;
  const std::atomic<bool>* abort = nullptr;
  bool too_big = false;
};

size_t OnBody(char* data, size_t size, size_t count, void* user) {
  auto* transfer = static_cast<Transfer*>(user);
  if (transfer->body.size() + size * count > kMaxResponse) {
    transfer->too_big = true;
    return 0;
  }
  transfer->body.append(data, size * count);
  return size * count;
}

size_t OnHeader(char* data, size_t size, size_t count, void* user) {
  auto* transfer = static_cast<Transfer*>(user);
  absl::string_view line(data, size * count);
  constexpr absl::string_view kRetryAfter = "retry-after:";
  if (line.size() > kRetryAfter.size() && absl::EqualsIgnoreCase(line.substr(0, kRetryAfter.size()), kRetryAfter)) {
    int64_t seconds = 0;
    // An HTTP-date instead of seconds is allowed too; the caller's backoff covers that case.
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(kRetryAfter.size())), &seconds) && seconds >= 0) {
      transfer->retry_after = std::chrono::seconds(seconds);
    }
  }
  return size * count;
}

int OnProgress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* transfer = static_cast<Transfer*>(user);
  return transfer->abort != nullptr && transfer->abort->load() ? 1 : 0;
}

using HeaderList = std::unique_ptr<curl_slist, void (*)(curl_slist*)>;

// What Send and Stream set alike: URL, method and body, headers, timeouts, TLS and credentials. The header list
// returned must outlive the transfer.
HeaderList Configure(const CurlLibrary& curl, CURL* h, const ClusterConfig& config, absl::string_view method,
                     const std::string& url, absl::string_view content_type, absl::string_view body,
                     const std::string& token, std::chrono::milliseconds timeout) {
  curl_slist* headers = nullptr;
  auto add_header = [&](const std::string& header) { headers = curl.slist_append(headers, header.c_str()); };
  add_header("Accept: application/json");
  add_header("Expect:");  // no 100-continue round trip before a body
  if (!token.empty()) add_header(absl::StrCat("Authorization: Bearer ", token));
  if (!content_type.empty()) add_header(absl::StrCat("Content-Type: ", content_type));
  HeaderList header_list(headers, curl.slist_free_all);

  const std::string method_string(method);
  curl.easy_setopt(h, CURLOPT_URL, url.c_str());
  curl.easy_setopt(h, CURLOPT_CUSTOMREQUEST, method_string.c_str());  // copied by libcurl
  curl.easy_setopt(h, CURLOPT_HTTPHEADER, headers);
  curl.easy_setopt(h, CURLOPT_USERAGENT, "vfio-gpu-agent");
  curl.easy_setopt(h, CURLOPT_NOSIGNAL, 1L);  // no SIGALRM for DNS timeouts: the agent is multi-threaded
  curl.easy_setopt(h, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout.count()));
  curl.easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(std::min(timeout, std::chrono::milliseconds(30000)).count()));
  if (!body.empty() || method != "GET") {
    curl.easy_setopt(h, CURLOPT_POSTFIELDS, body.data());
    curl.easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  }
  if (!config.ca_file.empty()) curl.easy_setopt(h, CURLOPT_CAINFO, config.ca_file.c_str());
  // libcurl copies a curl_blob struct; CURL_BLOB_NOCOPY leaves the PEM in config, which outlives the handle.
  curl_blob ca_blob{const_cast<char*>(config.ca_pem.data()), config.ca_pem.size(), CURL_BLOB_NOCOPY};
  if (!config.ca_pem.empty()) curl.easy_setopt(h, CURLOPT_CAINFO_BLOB, &ca_blob);
  if (config.insecure_skip_tls_verify) {
    curl.easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 0L);
    curl.easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 0L);
  }
  if (!config.client_cert_file.empty()) curl.easy_setopt(h, CURLOPT_SSLCERT, config.client_cert_file.c_str());
  if (!config.client_key_file.empty()) curl.easy_setopt(h, CURLOPT_SSLKEY, config.client_key_file.c_str());
  curl_blob cert_blob{const_cast<char*>(config.client_cert_pem.data()), config.client_cert_pem.size(), CURL_BLOB_NOCOPY};
  curl_blob key_blob{const_cast<char*>(config.client_key_pem.data()), config.client_key_pem.size(), CURL_BLOB_NOCOPY};
  if (!config.client_cert_pem.empty()) {
    curl.easy_setopt(h, CURLOPT_SSLCERT_BLOB, &cert_blob);
    curl.easy_setopt(h, CURLOPT_SSLCERTTYPE, "PEM");
  }
  if (!config.client_key_pem.empty()) {
    curl.easy_setopt(h, CURLOPT_SSLKEY_BLOB, &key_blob);
    curl.easy_setopt(h, CURLOPT_SSLKEYTYPE, "PEM");
  }
  return header_list;
}

// A Stream's transfer: a 2xx body split into lines for the caller, any other answer kept whole.
struct StreamTransfer {
  const CurlLibrary* curl = nullptr;
  CURL* handle = nullptr;
  const std::function<bool(absl::string_view)>* on_line = nullptr;
  long code = 0;
  std::string pending;  // a line not complete yet
  std::string body;     // a non-2xx answer
  bool stopped = false;  // on_line asked to stop
  bool too_big = false;
};

size_t OnStreamBody(char* data, size_t size, size_t count, void* user) {
  auto* transfer = static_cast<StreamTransfer*>(user);
  const size_t n = size * count;
  if (transfer->code == 0) transfer->curl->easy_getinfo(transfer->handle, CURLINFO_RESPONSE_CODE, &transfer->code);
  std::string& into = transfer->code >= 200 && transfer->code < 300 ? transfer->pending : transfer->body;
  if (into.size() + n > kMaxResponse) {
    transfer->too_big = true;
    return 0;
  }
  into.append(data, n);
  if (&into == &transfer->body) return n;
  size_t start = 0;
  for (size_t newline = into.find('\n'); newline != std::string::npos; newline = into.find('\n', start)) {
    const absl::string_view line(into.data() + start, newline - start);
    start = newline + 1;
    if (!line.empty() && !(*transfer->on_line)(line)) {
      transfer->stopped = true;
      return 0;
    }
  }
  into.erase(0, start);
  return n;
}

}  // namespace

void StreamCanceller::Cancel() {
  std::lock_guard lock(mu_);
  cancelled_ = true;
  const absl::StatusOr<CurlLibrary>& curl = Curl();
  if (multi_ != nullptr && curl.ok()) curl->multi_wakeup(static_cast<CURLM*>(multi_));
}

bool StreamCanceller::cancelled() const {
  std::lock_guard lock(mu_);
  return cancelled_;
}

ApiClient::ApiClient(ClusterConfig config)
    : config_(std::move(config)), tokens_(config_.token, config_.token.empty() ? config_.token_file : std::filesystem::path()) {}

absl::StatusOr<ApiResponse> ApiClient::Send(absl::string_view method, absl::string_view path,
                                            absl::string_view content_type, absl::string_view body,
                                            std::chrono::milliseconds timeout, const std::atomic<bool>* abort) {
  const std::string url = Url(path);
  absl::StatusOr<std::string> token = tokens_.Current();
  if (!token.ok()) return token.status();
  absl::StatusOr<ApiResponse> response = SendOnce(method, url, content_type, body, *token, timeout, abort);
  if (response.ok() && response->code == 401 && tokens_.Reload()) {
    token = tokens_.Current();
    if (!token.ok()) return token.status();
    response = SendOnce(method, url, content_type, body, *token, timeout, abort);
  }
  return response;
}

absl::StatusOr<ApiResponse> ApiClient::SendOnce(absl::string_view method, const std::string& url,
                                                absl::string_view content_type, absl::string_view body,
                                                const std::string& token, std::chrono::milliseconds timeout,
                                                const std::atomic<bool>* abort) {
  const absl::StatusOr<CurlLibrary>& opened = Curl();
  if (!opened.ok()) return opened.status();
  const CurlLibrary& curl = *opened;
  std::unique_ptr<CURL, decltype(curl.easy_cleanup)> handle(curl.easy_init(), curl.easy_cleanup);
  if (!handle) return absl::ResourceExhaustedError(absl::StrCat("curl_easy_init failed for ", url));
  CURL* h = handle.get();

  Transfer transfer;
  transfer.abort = abort;
  HeaderList header_list = Configure(curl, h, config_, method, url, content_type, body, token, timeout);
  curl.easy_setopt(h, CURLOPT_WRITEFUNCTION, &OnBody);
  curl.easy_setopt(h, CURLOPT_WRITEDATA, &transfer);
  curl.easy_setopt(h, CURLOPT_HEADERFUNCTION, &OnHeader);
  curl.easy_setopt(h, CURLOPT_HEADERDATA, &transfer);
  curl.easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
  curl.easy_setopt(h, CURLOPT_XFERINFOFUNCTION, &OnProgress);
  curl.easy_setopt(h, CURLOPT_XFERINFODATA, &transfer);

  requests_.fetch_add(1);
  const CURLcode code = curl.easy_perform(h);
  if (code != CURLE_OK) {
    const std::string where = absl::StrCat(method, " ", url, ": ", curl.easy_strerror(code));
    if (code == CURLE_ABORTED_BY_CALLBACK) return absl::CancelledError(where);
    if (code == CURLE_OPERATION_TIMEDOUT) return absl::DeadlineExceededError(where);
    if (transfer.too_big) return absl::ResourceExhaustedError(absl::StrCat(where, " (answer over 8 MiB)"));
    if (code == CURLE_PARTIAL_FILE || code == CURLE_RECV_ERROR || code == CURLE_GOT_NOTHING ||
        code == CURLE_SEND_ERROR) {
      return absl::AbortedError(absl::StrCat(where, " (connection cut mid-request)"));
    }
    return absl::UnavailableError(where);
  }
  ApiResponse response;
  curl.easy_getinfo(h, CURLINFO_RESPONSE_CODE, &response.code);
  response.body = std::move(transfer.body);
  response.retry_after = transfer.retry_after;
  return response;
}

std::string ServerMessage(const ApiResponse& response) {
  const nlohmann::json body = nlohmann::json::parse(response.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_object() && body.contains("message") && body["message"].is_string()) {
    return body["message"].get<std::string>();
  }
  return response.body.substr(0, 200);
}

absl::Status TransportError(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kUnauthenticated:
      return status;
    default:
      return absl::UnavailableError(status.message());
  }
}

absl::Status AnswerStatus(const absl::StatusOr<ApiResponse>& response, absl::string_view request) {
  if (!response.ok()) return TransportError(response.status());
  if (response->code / 100 == 2) return absl::OkStatus();
  const std::string what = absl::StrCat(request, ": ", response->code, " ", ServerMessage(*response));
  switch (response->code) {
    case 401: return absl::UnauthenticatedError(what);
    case 403: return absl::PermissionDeniedError(what);
    case 404: return absl::NotFoundError(what);
    case 409: return absl::AbortedError(what);
    case 400:
    case 422: return absl::InvalidArgumentError(what);
    default: return absl::UnavailableError(what);
  }
}

absl::StatusOr<ApiResponse> GetOk(ApiClient& client, absl::string_view path, std::chrono::milliseconds timeout) {
  absl::StatusOr<ApiResponse> response = client.Send("GET", path, "", "", timeout);
  if (!response.ok()) return TransportError(response.status());
  const std::string where = absl::StrCat("GET ", client.Url(path), ": ", response->code, " ");
  switch (response->code) {
    case 401: return absl::UnauthenticatedError(absl::StrCat(where, ServerMessage(*response)));
    case 403: return absl::PermissionDeniedError(absl::StrCat(where, ServerMessage(*response)));
    case 404: return absl::NotFoundError(absl::StrCat(where, ServerMessage(*response)));
    default: break;
  }
  if (response->code < 200 || response->code >= 300) {
    return absl::UnavailableError(absl::StrCat(where, ServerMessage(*response)));
  }
  return response;
}

absl::StatusOr<ApiResponse> ApiClient::Stream(absl::string_view path,
                                              const std::function<bool(absl::string_view)>& on_line,
                                              std::chrono::milliseconds timeout, StreamCanceller& cancel) {
  const std::string url = Url(path);
  absl::StatusOr<std::string> token = tokens_.Current();
  if (!token.ok()) return token.status();
  absl::StatusOr<ApiResponse> response = StreamOnce(url, *token, on_line, timeout, cancel);
  if (response.ok() && response->code == 401 && tokens_.Reload()) {
    token = tokens_.Current();
    if (!token.ok()) return token.status();
    response = StreamOnce(url, *token, on_line, timeout, cancel);
  }
  return response;
}

absl::StatusOr<ApiResponse> ApiClient::StreamOnce(const std::string& url, const std::string& token,
                                                  const std::function<bool(absl::string_view)>& on_line,
                                                  std::chrono::milliseconds timeout, StreamCanceller& cancel) {
  const absl::StatusOr<CurlLibrary>& opened = Curl();
  if (!opened.ok()) return opened.status();
  const CurlLibrary& curl = *opened;
  std::unique_ptr<CURL, decltype(curl.easy_cleanup)> handle(curl.easy_init(), curl.easy_cleanup);
  std::unique_ptr<CURLM, decltype(curl.multi_cleanup)> multi(curl.multi_init(), curl.multi_cleanup);
  if (!handle || !multi) return absl::ResourceExhaustedError(absl::StrCat("curl init failed for ", url));
  CURL* h = handle.get();
  HeaderList header_list = Configure(curl, h, config_, "GET", url, "", "", token, timeout);
  StreamTransfer transfer{.curl = &curl, .handle = h, .on_line = &on_line};
  curl.easy_setopt(h, CURLOPT_WRITEFUNCTION, &OnStreamBody);
  curl.easy_setopt(h, CURLOPT_WRITEDATA, &transfer);
  // A watch idles for minutes: the kernel's keepalive probes find a dead peer without waking this process.
  curl.easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
  curl.easy_setopt(h, CURLOPT_TCP_KEEPIDLE, 30L);
  curl.easy_setopt(h, CURLOPT_TCP_KEEPINTVL, 15L);
  {
    std::lock_guard lock(cancel.mu_);
    if (cancel.cancelled_) return absl::CancelledError(absl::StrCat("GET ", url, ": cancelled"));
    cancel.multi_ = multi.get();
  }
  // Cancel may wake the multi handle only while it is registered; it is unregistered before cleanup.
  struct Unregister {
    StreamCanceller& cancel;
    ~Unregister() {
      std::lock_guard lock(cancel.mu_);
      cancel.multi_ = nullptr;
    }
  } unregister{cancel};
  curl.multi_add_handle(multi.get(), h);
  requests_.fetch_add(1);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  CURLcode result = CURLE_OK;
  bool cancelled = false;
  while (true) {
    int running = 0;
    if (CURLMcode code = curl.multi_perform(multi.get(), &running); code != CURLM_OK) {
      curl.multi_remove_handle(multi.get(), h);
      return absl::InternalError(absl::StrCat("GET ", url, ": curl_multi_perform failed (", static_cast<int>(code), ")"));
    }
    if (running == 0) {
      int left = 0;
      while (CURLMsg* message = curl.multi_info_read(multi.get(), &left)) {
        if (message->msg == CURLMSG_DONE) result = message->data.result;
      }
      break;
    }
    if (cancel.cancelled()) {
      cancelled = true;
      break;
    }
    const auto remaining = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    // libcurl shortens the wait to its own next timer (the transfer's timeout), so this is the only wake-up.
    const int wait_ms = static_cast<int>(std::clamp<int64_t>(remaining.count(), 0, INT_MAX));
    curl.multi_poll(multi.get(), nullptr, 0, wait_ms, nullptr);
  }
  curl.multi_remove_handle(multi.get(), h);
  if (cancelled) return absl::CancelledError(absl::StrCat("GET ", url, ": cancelled"));
  ApiResponse response;
  curl.easy_getinfo(h, CURLINFO_RESPONSE_CODE, &response.code);
  if (transfer.stopped) return response;
  if (result != CURLE_OK) {
    const std::string where = absl::StrCat("GET ", url, ": ", curl.easy_strerror(result));
    if (result == CURLE_OPERATION_TIMEDOUT) return absl::DeadlineExceededError(where);
    if (transfer.too_big) return absl::ResourceExhaustedError(absl::StrCat(where, " (a line over 8 MiB)"));
    if (result == CURLE_PARTIAL_FILE || result == CURLE_RECV_ERROR || result == CURLE_GOT_NOTHING ||
        result == CURLE_SEND_ERROR) {
      return absl::AbortedError(absl::StrCat(where, " (connection cut mid-request)"));
    }
    return absl::UnavailableError(where);
  }
  response.body = std::move(transfer.body);
  return response;
}

}  // namespace vfio_agent::kube
