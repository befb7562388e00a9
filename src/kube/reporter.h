// The NodeReporter behind ConnectNodeReporter, with its clock and limits exposed for tests.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "api_client.h"
#include "vfio_gpu_agent/kube/node_reporter.h"

namespace vfio_agent::kube {

// Time for the reporter's worker: rate limit, backoff and Retry-After all wait through it, so a test can
// run them on a fake clock without waiting real seconds.
class Clock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  virtual ~Clock() = default;
  virtual TimePoint Now() = 0;
  virtual std::chrono::system_clock::time_point WallNow() = 0;  // timestamps written into the API objects
  // Blocks until `deadline` on this clock (TimePoint::max(): no deadline) or until `cv` is notified;
  // spurious returns are fine, the worker re-checks everything after each.
  virtual void WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, TimePoint deadline) = 0;
};

Clock& RealClock();

struct ReporterOptions {
  std::string node_name;
  Clock* clock = &RealClock();
  double writes_per_second = 1.0;
  int write_burst = 10;
  size_t queue_limit = 64;  // distinct pending events; more are dropped (counted)
  std::chrono::milliseconds request_timeout = std::chrono::seconds(10);
  std::chrono::milliseconds backoff_initial = std::chrono::seconds(1);
  std::chrono::milliseconds backoff_max = std::chrono::seconds(60);
  std::chrono::seconds heartbeat_interval = std::chrono::minutes(5);  // 12 requests an hour at most
  // How often WatchKubevirtRelease reads the KubeVirt CR again: KubeVirt may be upgraded across v1.9 while the agent
  // runs, and the device plugin's --vfio-backend auto must follow what the new release's plugin hands out. Nothing
  // announces an upgrade to a node agent short of a watch of the CR, and an hour-late switch only changes what a VM
  // started in that hour is handed beyond what it opens (the cdevs): one request an hour is cheaper.
  std::chrono::milliseconds kubevirt_interval = std::chrono::hours(1);
};

// Starts the worker; it sends nothing until there is something to write.
std::unique_ptr<NodeReporter> StartNodeReporter(std::unique_ptr<ApiClient> client, ReporterOptions options);

// "2026-12-01T21:00:00Z" (metav1.Time) and "2026-12-01T21:00:00.123456Z" (metav1.MicroTime).
std::string Rfc3339(std::chrono::system_clock::time_point time);
std::string Rfc3339Micro(std::chrono::system_clock::time_point time);
// Either form back; nullopt for anything else.
std::optional<std::chrono::system_clock::time_point> ParseRfc3339(const std::string& text);

}  // namespace vfio_agent::kube
