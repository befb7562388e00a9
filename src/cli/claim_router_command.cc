// `claim-router`: the cluster-level controller that labels allocated ResourceClaims with their node (see
// include/vfio_gpu_agent/router/claim_router.h). A Deployment of two replicas; one acts.
#include <pthread.h>

#include <charconv>
#include <csignal>
#include <cstring>
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/cli/commands.h"
#include "vfio_gpu_agent/dra/driver.h"
#include "vfio_gpu_agent/router/claim_router.h"

namespace vfio_agent::cli {
namespace {

std::vector<FlagSpec> ClaimRouterFlags() {
  return {
      {"kubeconfig", "FILE", "kubeconfig outside a cluster", "in-cluster service account"},
      {"dra-driver-name", "NAME", "the DRA driver whose allocated claims are labeled", std::string(dra::kDefaultDriverName)},
      {"lease-namespace", "NS", "namespace of the leader election Lease (env POD_NAMESPACE from the downward API)", ""},
      {"lease-name", "NAME", "name of the leader election Lease", router::kDefaultLeaseName},
      {"identity", "NAME", "this replica's name in the Lease, unique per replica (env POD_NAME)", ""},
      {"lease-duration", "MS", "how long a standby waits after the leader's last renewal before taking over", "15000"},
      {"renew-deadline", "MS", "how long the leader keeps acting without a successful renewal", "10000"},
      {"retry-period", "MS", "how often the leader renews and a standby looks at the Lease", "2000"},
  };
}

absl::StatusOr<std::chrono::milliseconds> Millis(const FlagValues& flags, std::string_view name, std::string_view fallback) {
  const std::string text = flags.Get(name, fallback);
  int value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() || value < 1 || value > 3600000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", std::string(name), " \"", text, "\" must be a whole number of milliseconds from 1 to 3600000"));
  }
  return std::chrono::milliseconds(value);
}

std::string EnvOr(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

}  // namespace

int RunClaimRouter(const std::vector<std::string>& args, std::ostream& out) {
  ParsedCommand cmd;
  if (auto exit = ParseCommand(
          "claim-router",
          "The cluster side of DRA binding conditions: labels every allocated ResourceClaim of the driver with\n"
          "gpu.vfio-agent.cozystack.io/node=<node of its pool> (moved when the claim is allocated elsewhere, removed\n"
          "when it is deallocated), so that each node's agent watches only its own node's claims. One replica acts,\n"
          "the holder of a coordination.k8s.io/v1 Lease; the others stand by and take over when its lease expires.\n"
          "Runs until SIGTERM, SIGINT, SIGHUP or SIGQUIT, then releases the lease and exits 0.",
          ClaimRouterFlags(), args, out, &cmd)) {
    return *exit;
  }
  router::RouterOptions options;
  options.kubeconfig = cmd.flags.Get("kubeconfig");
  options.driver = cmd.flags.Get("dra-driver-name", dra::kDefaultDriverName);
  options.lease_namespace = cmd.flags.Get("lease-namespace", EnvOr("POD_NAMESPACE"));
  options.lease_name = cmd.flags.Get("lease-name", router::kDefaultLeaseName);
  options.identity = cmd.flags.Get("identity", EnvOr("POD_NAME"));
  for (auto [name, fallback, field] : {std::tuple{"lease-duration", "15000", &options.lease_duration},
                                      std::tuple{"renew-deadline", "10000", &options.renew_deadline},
                                      std::tuple{"retry-period", "2000", &options.retry_period}}) {
    absl::StatusOr<std::chrono::milliseconds> value = Millis(cmd.flags, name, fallback);
    if (!value.ok()) {
      std::cerr << "vfio-gpu-agent claim-router: " << value.status().message() << "\n";
      return kExitUsage;
    }
    *field = *value;
  }
  // Blocked before any thread starts, so only sigwait below takes them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  for (int signal : {SIGTERM, SIGINT, SIGHUP, SIGQUIT}) sigaddset(&stop_signals, signal);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  absl::StatusOr<std::unique_ptr<router::ClaimRouter>> connected = router::ClaimRouter::Connect(std::move(options));
  if (!connected.ok()) {
    std::cerr << "vfio-gpu-agent claim-router: " << connected.status().message() << "\n";
    return kExitUsage;
  }
  router::ClaimRouter& claim_router = **connected;
  std::thread signals([&] {
    int signal = 0;
    sigwait(&stop_signals, &signal);
    spdlog::info("claim-router: signal {} ({}): releasing the lease", signal, strsignal(signal));
    claim_router.Stop();
  });
  const absl::Status status = claim_router.Run();
  // Run returns only after Stop: the signal thread has ended or is about to.
  signals.join();
  if (!status.ok()) {
    spdlog::warn("claim-router: {}", std::string(status.message()));
    return kExitError;
  }
  return kExitOk;
}

}  // namespace vfio_agent::cli
