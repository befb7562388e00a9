// Requests to the API server through libcurl (TLS, client certificates and the CA bundle are libcurl's).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "config.h"

namespace vfio_agent::kube {

// resource.k8s.io/v1 collections, read by validate and written by the DRA driver.
inline constexpr char kResourceSlicesPath[] = "/apis/resource.k8s.io/v1/resourceslices";

struct ApiResponse {
  long code = 0;  // HTTP status
  std::string body;
  std::optional<std::chrono::seconds> retry_after;  // from a Retry-After header in seconds
};

// Ends a Stream from another thread (the stream's owner stopping).
class StreamCanceller {
 public:
  // The Stream in progress returns Cancelled at once, and every later one with this canceller before it starts.
  void Cancel();
  bool cancelled() const;

 private:
  friend class ApiClient;
  mutable std::mutex mu_;
  bool cancelled_ = false;
  void* multi_ = nullptr;  // the curl multi handle of the Stream in progress, woken by Cancel
};

// Thread-safe; each request uses its own curl handle.
class ApiClient {
 public:
  explicit ApiClient(ClusterConfig config);

  const ClusterConfig& config() const { return config_; }
  std::string Url(absl::string_view path) const { return config_.server + std::string(path); }

  // Any HTTP answer is a response, whatever its code. A 401 makes the token file be read again and, when the
  // token changed, the request be sent once more with the new one. Errors are transport failures naming the
  // URL: Unavailable (refused, unreachable, TLS), Aborted (connection cut mid-request), DeadlineExceeded (timeout), Cancelled
  // (abort became true), FailedPrecondition (libcurl missing), Unauthenticated (token file unreadable).
  absl::StatusOr<ApiResponse> Send(absl::string_view method, absl::string_view path, absl::string_view content_type,
                                   absl::string_view body, std::chrono::milliseconds timeout,
                                   const std::atomic<bool>* abort = nullptr);

  // A long GET (a watch): a 2xx answer's body goes to `on_line` as it arrives, one complete line at a time, and
  // is not kept; any other answer is returned whole (a 401 makes the token be read again and the request sent once
  // more, as Send does). Returns when the server ends the answer, `timeout` passes (DeadlineExceeded), `on_line`
  // returns false (the answer so far) or `cancel` is cancelled (Cancelled). While nothing arrives the calling
  // thread sleeps in poll(2) until data or the timeout: no periodic wake-up.
  absl::StatusOr<ApiResponse> Stream(absl::string_view path, const std::function<bool(absl::string_view)>& on_line,
                                     std::chrono::milliseconds timeout, StreamCanceller& cancel);

  uint64_t requests() const { return requests_.load(); }

 private:
  absl::StatusOr<ApiResponse> StreamOnce(const std::string& url, const std::string& token,
                                         const std::function<bool(absl::string_view)>& on_line,
                                         std::chrono::milliseconds timeout, StreamCanceller& cancel);

  absl::StatusOr<ApiResponse> SendOnce(absl::string_view method, const std::string& url, absl::string_view content_type,
                                       absl::string_view body, const std::string& token,
                                       std::chrono::milliseconds timeout, const std::atomic<bool>* abort);

  const ClusterConfig config_;
  TokenSource tokens_;
  std::atomic<uint64_t> requests_{0};
};

// The server's own words (a Status object's message) when it sent one, else the start of the body.
std::string ServerMessage(const ApiResponse& response);

// A Send's own failure as a reader reports it: DeadlineExceeded and Unauthenticated kept, the rest Unavailable.
absl::Status TransportError(const absl::Status& status);

// What the answer to `request` ("METHOD URL") means to its caller: OK for any 2xx; else the request, the code and
// the server's words as Unauthenticated (401), PermissionDenied (403), NotFound (404), Aborted (409: someone else
// wrote meanwhile, ask again), InvalidArgument (400, 422) or Unavailable (any other code). A Send's own failure is
// TransportError's: a connection cut mid-request is Unavailable, so Aborted always means the server's 409.
absl::Status AnswerStatus(const absl::StatusOr<ApiResponse>& response, absl::string_view request);

// A GET of one object or list, whose answer must be 2xx. Errors name the URL and what the server said: NotFound
// (404), PermissionDenied (403), Unauthenticated (401 or an unreadable token file), DeadlineExceeded, Unavailable
// for everything else (unreachable, TLS, 429, 5xx, other codes, a cut connection).
absl::StatusOr<ApiResponse> GetOk(ApiClient& client, absl::string_view path, std::chrono::milliseconds timeout);

}  // namespace vfio_agent::kube
