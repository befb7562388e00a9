// `vfio-gpu-agent run` as a process on a simulated node: sysfs-sim, the kubelet simulator (with its
// pod-resources server) and, when asked, the fake Kubernetes API server. The test talks to the process as
// the cluster would: gRPC health probes, a Prometheus scrape, signals.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "plugin_harness.h"

namespace vfio_agent::daemon::testing {

inline constexpr std::chrono::seconds kPatience{30};

// Polls `done` every 10 ms until it holds or `timeout` passes.
bool WaitUntil(const std::function<bool()>& done, std::chrono::milliseconds timeout = kPatience);

class RunProcess {
 public:
  // Starts the agent binary with `run` on `node` (whose kubelet must run with pod_resources_socket set to
  // PodResourcesSocket(node)), with --no-udev and --rescan-interval 200 unless `extra_args` sets its own.
  // stderr goes to <dir>/run.log.
  static absl::StatusOr<std::unique_ptr<RunProcess>> Start(plugin::testing::Node& node,
                                                           const std::vector<std::string>& extra_args = {},
                                                           const std::vector<std::string>& extra_env = {});
  ~RunProcess();  // SIGKILL if still running

  // grpc.health.v1 Check: nullopt when the call failed, else whether it answered SERVING.
  std::optional<bool> Check(const std::string& service = "") const;
  bool WaitReady(bool ready = true, std::chrono::milliseconds timeout = kPatience) const;
  // GET /metrics ("" when the scrape failed).
  std::string Metrics() const;
  bool WaitMetric(const std::string& line, std::chrono::milliseconds timeout = kPatience) const;

  // Sends `signal` and waits for the exit; the wait status.
  int SignalAndWait(int signal);
  // The wait status if the process has ended on its own; nullopt while it runs.
  std::optional<int> ExitedOnItsOwn();
  std::string Log() const;
  pid_t pid() const { return pid_; }
  int health_port() const { return health_port_; }

 private:
  RunProcess() = default;
  pid_t pid_ = -1;
  int health_port_ = 0, metrics_port_ = 0;
  std::filesystem::path log_;
};

std::filesystem::path PodResourcesSocket(const plugin::testing::Node& node);
// The driver a simulated function is bound to now ("" = none).
std::string DriverOf(const plugin::testing::Node& node, const std::string& bdf);

}  // namespace vfio_agent::daemon::testing
