#include "api_client.h"

#include <algorithm>
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
  // A watch: 2xx data is cut into lines for on_line instead of collected.
  const std::function<void(absl::string_view)>* on_line = nullptr;
  const CurlLibrary* curl = nullptr;
  CURL* handle = nullptr;
  std::string partial_line;
};

size_t OnBody(char* data, size_t size, size_t count, void* user) {
  auto* transfer = static_cast<Transfer*>(user);
  if (transfer->on_line != nullptr) {
    long code = 0;
    transfer->curl->easy_getinfo(transfer->handle, CURLINFO_RESPONSE_CODE, &code);
    if (code >= 200 && code < 300) {
      transfer->partial_line.append(data, size * count);
      size_t start = 0;
      for (size_t end; (end = transfer->partial_line.find('\n', start)) != std::string::npos; start = end + 1) {
        if (end > start) (*transfer->on_line)(absl::string_view(transfer->partial_line).substr(start, end - start));
      }
      transfer->partial_line.erase(0, start);
      if (transfer->partial_line.size() > kMaxResponse) {  // one event over 8 MiB: a misbehaving server
        transfer->too_big = true;
        return 0;
      }
      return size * count;
    }
  }
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

}  // namespace

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

absl::StatusOr<ApiResponse> ApiClient::Watch(absl::string_view path, std::chrono::milliseconds timeout,
                                             const std::atomic<bool>* abort,
                                             const std::function<void(absl::string_view)>& on_line) {
  const std::string url = Url(path);
  absl::StatusOr<std::string> token = tokens_.Current();
  if (!token.ok()) return token.status();
  absl::StatusOr<ApiResponse> response = SendOnce("GET", url, "", "", *token, timeout, abort, &on_line);
  if (response.ok() && response->code == 401 && tokens_.Reload()) {
    token = tokens_.Current();
    if (!token.ok()) return token.status();
    response = SendOnce("GET", url, "", "", *token, timeout, abort, &on_line);
  }
  return response;
}

absl::StatusOr<ApiResponse> ApiClient::SendOnce(absl::string_view method, const std::string& url,
                                                absl::string_view content_type, absl::string_view body,
                                                const std::string& token, std::chrono::milliseconds timeout,
                                                const std::atomic<bool>* abort,
                                                const std::function<void(absl::string_view)>* on_line) {
  const absl::StatusOr<CurlLibrary>& opened = Curl();
  if (!opened.ok()) return opened.status();
  const CurlLibrary& curl = *opened;
  std::unique_ptr<CURL, decltype(curl.easy_cleanup)> handle(curl.easy_init(), curl.easy_cleanup);
  if (!handle) return absl::ResourceExhaustedError(absl::StrCat("curl_easy_init failed for ", url));
  CURL* h = handle.get();

  curl_slist* headers = nullptr;
  auto add_header = [&](const std::string& header) { headers = curl.slist_append(headers, header.c_str()); };
  add_header("Accept: application/json");
  add_header("Expect:");  // no 100-continue round trip before a body
  if (!token.empty()) add_header(absl::StrCat("Authorization: Bearer ", token));
  if (!content_type.empty()) add_header(absl::StrCat("Content-Type: ", content_type));
  std::unique_ptr<curl_slist, decltype(curl.slist_free_all)> header_list(headers, curl.slist_free_all);

  Transfer transfer;
  transfer.abort = abort;
  transfer.on_line = on_line;
  transfer.curl = &curl;
  transfer.handle = h;
  const std::string method_string(method);
  curl.easy_setopt(h, CURLOPT_URL, url.c_str());
  curl.easy_setopt(h, CURLOPT_CUSTOMREQUEST, method_string.c_str());
  curl.easy_setopt(h, CURLOPT_HTTPHEADER, headers);
  curl.easy_setopt(h, CURLOPT_USERAGENT, "vfio-gpu-agent");
  curl.easy_setopt(h, CURLOPT_NOSIGNAL, 1L);  // no SIGALRM for DNS timeouts: the agent is multi-threaded
  curl.easy_setopt(h, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout.count()));
  // A watch's connection is set up in the time of an ordinary request; only its stream lasts the whole timeout.
  const int64_t connect_ms = on_line != nullptr ? std::min<int64_t>(timeout.count(), 10000) : timeout.count();
  curl.easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(connect_ms));
  curl.easy_setopt(h, CURLOPT_WRITEFUNCTION, &OnBody);
  curl.easy_setopt(h, CURLOPT_WRITEDATA, &transfer);
  curl.easy_setopt(h, CURLOPT_HEADERFUNCTION, &OnHeader);
  curl.easy_setopt(h, CURLOPT_HEADERDATA, &transfer);
  curl.easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
  curl.easy_setopt(h, CURLOPT_XFERINFOFUNCTION, &OnProgress);
  curl.easy_setopt(h, CURLOPT_XFERINFODATA, &transfer);
  if (!body.empty() || method != "GET") {
    curl.easy_setopt(h, CURLOPT_POSTFIELDS, body.data());
    curl.easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  }
  if (!config_.ca_file.empty()) curl.easy_setopt(h, CURLOPT_CAINFO, config_.ca_file.c_str());
  curl_blob ca_blob{const_cast<char*>(config_.ca_pem.data()), config_.ca_pem.size(), CURL_BLOB_NOCOPY};
  if (!config_.ca_pem.empty()) curl.easy_setopt(h, CURLOPT_CAINFO_BLOB, &ca_blob);
  if (config_.insecure_skip_tls_verify) {
    curl.easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 0L);
    curl.easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 0L);
  }
  if (!config_.client_cert_file.empty()) curl.easy_setopt(h, CURLOPT_SSLCERT, config_.client_cert_file.c_str());
  if (!config_.client_key_file.empty()) curl.easy_setopt(h, CURLOPT_SSLKEY, config_.client_key_file.c_str());
  curl_blob cert_blob{const_cast<char*>(config_.client_cert_pem.data()), config_.client_cert_pem.size(), CURL_BLOB_NOCOPY};
  curl_blob key_blob{const_cast<char*>(config_.client_key_pem.data()), config_.client_key_pem.size(), CURL_BLOB_NOCOPY};
  if (!config_.client_cert_pem.empty()) {
    curl.easy_setopt(h, CURLOPT_SSLCERT_BLOB, &cert_blob);
    curl.easy_setopt(h, CURLOPT_SSLCERTTYPE, "PEM");
  }
  if (!config_.client_key_pem.empty()) {
    curl.easy_setopt(h, CURLOPT_SSLKEY_BLOB, &key_blob);
    curl.easy_setopt(h, CURLOPT_SSLKEYTYPE, "PEM");
  }

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

}  // namespace vfio_agent::kube
