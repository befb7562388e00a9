// Requests to the API server through libcurl (TLS, client certificates and the CA bundle are libcurl's).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
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

  // A watch (GET `path` with watch=1): the 2xx answer is a stream of JSON lines, each handed to `on_line` on the
  // calling thread as it arrives, never collected in the response's body (which holds a non-2xx answer). Returns
  // when the server ends the stream, `timeout` passes (DeadlineExceeded) or `abort` becomes true (Cancelled, at
  // libcurl's next progress callback, within a second). Errors as Send's.
  absl::StatusOr<ApiResponse> Watch(absl::string_view path, std::chrono::milliseconds timeout,
                                    const std::atomic<bool>* abort,
                                    const std::function<void(absl::string_view)>& on_line);

  uint64_t requests() const { return requests_.load(); }

 private:
  absl::StatusOr<ApiResponse> SendOnce(absl::string_view method, const std::string& url, absl::string_view content_type,
                                       absl::string_view body, const std::string& token,
                                       std::chrono::milliseconds timeout, const std::atomic<bool>* abort,
                                       const std::function<void(absl::string_view)>* on_line = nullptr);

  const ClusterConfig config_;
  TokenSource tokens_;
  std::atomic<uint64_t> requests_{0};
};

// The server's own words (a Status object's message) when it sent one, else the start of the body.
std::string ServerMessage(const ApiResponse& response);

// A Send's own failure as a reader reports it: DeadlineExceeded and Unauthenticated kept, the rest Unavailable.
absl::Status TransportError(const absl::Status& status);

// A GET of one object or list, whose answer must be 2xx. Errors name the URL and what the server said: NotFound
// (404), PermissionDenied (403), Unauthenticated (401 or an unreadable token file), DeadlineExceeded, Unavailable
// for everything else (unreachable, TLS, 429, 5xx, other codes, a cut connection).
absl::StatusOr<ApiResponse> GetOk(ApiClient& client, absl::string_view path, std::chrono::milliseconds timeout);

}  // namespace vfio_agent::kube
