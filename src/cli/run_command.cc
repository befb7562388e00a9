#include <pthread.h>

#include <charconv>
#include <csignal>
#include <cstdlib>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/cli/commands.h"
#include "vfio_gpu_agent/cli/inspect.h"
#include "vfio_gpu_agent/common/workload.h"
#include "vfio_gpu_agent/daemon/daemon.h"
#include "vfio_gpu_agent/kube/node_reporter.h"

namespace vfio_agent::cli {
namespace {

std::vector<FlagSpec> RunFlags() {
  std::vector<FlagSpec> specs;
  // A daemon that only plans would retry its plan forever: --dry-run belongs to `bind`. --state-dir is serve's.
  for (auto& spec : BindFlags()) {
    if (spec.name != "dry-run" && spec.name != kStateDirFlag) specs.push_back(std::move(spec));
  }
  for (auto& spec : ServeFlags()) specs.push_back(std::move(spec));
  for (auto& spec : DraFlags()) specs.push_back(std::move(spec));
  std::vector<FlagSpec> own = {
      {"health-port", "PORT", "TCP port of the gRPC health service (readiness: service \"\", liveness: \"liveness\"); 0 = off",
       "8081"},
      {"metrics-port", "PORT", "TCP port of the Prometheus metrics (/metrics); 0 = off", "9400"},
      {"listen-address", "HOST", "address the health and metrics ports listen on", "0.0.0.0"},
      {"kubeconfig", "FILE", "kubeconfig for the node condition and events outside a cluster",
       "in-cluster service account"},
      {"node-name", "NAME", "this node's name in the cluster (also env NODE_NAME, from the downward API)", ""},
      {"status-dir", "DIR", "write the GPU Operator compatible validation status files here", "none"},
      {"resync-interval", "MS", "a full reconcile pass when nothing else happens, in milliseconds", "60000"},
      {"workload-label-interval", "MS",
       "until the watch of the agent's own Node has listed it (without list/watch RBAC on nodes: always), how often "
       "its labels are read (a GET of the node; a change of nvidia.com/gpu.workload.config switches the mode), in "
       "milliseconds", "30000"},
      {"vgpu-config-file", "FILE",
       "vm-vgpu: vGPU profiles to create, in NVIDIA vgpu-device-manager's format (a ConfigMap); applied on every "
       "pass (only the difference; a vGPU a VM holds is kept until freed), the outcome in the node label "
       "nvidia.com/vgpu.config.state (pending, success, failed)", "none"},
      {"vgpu-config", "NAME",
       "the config of --vgpu-config-file to apply when the node has no nvidia.com/vgpu.config label", "none"},
      {"kubevirt-interval", "MS",
       "--vfio-backend auto: how often the KubeVirt CR is read again (its status.observedKubeVirtVersion decides "
       "whether Allocate adds the cdevs), in milliseconds; one GET at the start and one per interval",
       "3600000"},
      {"registration-grace", "MS",
       "how long registration with the kubelet may take (after a start or a kubelet restart) before it is "
       "published as a failure (condition False, Warning event), in milliseconds", "30000"},
  };
  for (auto& spec : own) specs.push_back(std::move(spec));
  return specs;
}

absl::StatusOr<int> IntValue(const FlagValues& flags, std::string_view name, std::string_view fallback, int min,
                             int max) {
  const std::string text = flags.Get(name, fallback);
  int value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() || value < min || value > max) {
    return absl::InvalidArgumentError(absl::StrCat("--", std::string(name), " \"", text, "\" must be a whole number from ", min,
                                                   " to ", max));
  }
  return value;
}

absl::StatusOr<daemon::DaemonOptions> DaemonOptionsFromFlags(const ParsedCommand& cmd,
                                                             const names::PciIdsDatabase* db) {
  daemon::DaemonOptions options;
  auto bind = BinderOptionsFromFlags(cmd);
  if (!bind.ok()) return bind.status();
  options.bind = *std::move(bind);
  auto serve = ServeOptionsFromFlags(cmd, db);
  if (!serve.ok()) return serve.status();
  options.serve = *std::move(serve);
  auto health = IntValue(cmd.flags, "health-port", "8081", 0, 65535);
  if (!health.ok()) return health.status();
  options.health_port = *health;
  auto metrics = IntValue(cmd.flags, "metrics-port", "9400", 0, 65535);
  if (!metrics.ok()) return metrics.status();
  options.metrics_port = *metrics;
  auto resync = IntValue(cmd.flags, "resync-interval", "60000", 100, 3600000);
  if (!resync.ok()) return resync.status();
  options.resync_interval = std::chrono::milliseconds(*resync);
  auto label_interval = IntValue(cmd.flags, "workload-label-interval", "30000", 100, 3600000);
  if (!label_interval.ok()) return label_interval.status();
  options.workload_label_interval = std::chrono::milliseconds(*label_interval);
  auto grace = IntValue(cmd.flags, "registration-grace", "30000", 0, 600000);
  if (!grace.ok()) return grace.status();
  options.registration_grace = std::chrono::milliseconds(*grace);
  options.vgpu_config_file = cmd.flags.Get("vgpu-config-file");
  options.vgpu_config = cmd.flags.Get("vgpu-config");
  if (!options.vgpu_config.empty() && options.vgpu_config_file.empty()) {
    return absl::InvalidArgumentError("--vgpu-config names a config of --vgpu-config-file, which is not set");
  }
  options.listen_host = cmd.flags.Get("listen-address", "0.0.0.0");
  options.status_dir = cmd.flags.Get("status-dir");
  options.bind.paths.pod_resources_socket = options.serve.paths.pod_resources_socket;
  absl::StatusOr<bool> use_dra = DraSelected(cmd);
  if (!use_dra.ok()) return use_dra.status();
  if (*use_dra) {
    absl::StatusOr<dra::DriverOptions> dra = DraOptionsFromFlags(cmd, db);
    if (!dra.ok()) return dra.status();
    options.dra = *std::move(dra);
  }
  return options;
}

// NotFound (no cluster) and configuration errors outside an explicit --kubeconfig run without the API: it
// is never on the data path. An explicit --kubeconfig that does not work is a usage error.
absl::StatusOr<std::unique_ptr<kube::NodeReporter>> ConnectReporter(const ParsedCommand& cmd) {
  kube::ConnectOptions options;
  options.kubeconfig = cmd.flags.Get("kubeconfig");
  if (options.kubeconfig.empty() && std::getenv("KUBERNETES_SERVICE_HOST") == nullptr) {
    spdlog::info("run: not in a cluster and no --kubeconfig; no node condition or events");
    return std::unique_ptr<kube::NodeReporter>();
  }
  absl::StatusOr<std::string> node_name = NodeName(cmd.flags);
  if (!node_name.ok()) return absl::InvalidArgumentError(absl::StrCat("run: ", node_name.status().message()));
  options.node_name = *node_name;
  absl::StatusOr<int> kubevirt_interval = IntValue(cmd.flags, "kubevirt-interval", "3600000", 1000, 86400000);
  if (!kubevirt_interval.ok()) return kubevirt_interval.status();
  options.kubevirt_interval = std::chrono::milliseconds(*kubevirt_interval);
  absl::StatusOr<std::unique_ptr<kube::NodeReporter>> reporter = kube::ConnectNodeReporter(options);
  if (reporter.ok()) {
    spdlog::info("run: reporting node {} to the Kubernetes API", options.node_name);
    return reporter;
  }
  if (absl::IsNotFound(reporter.status())) {
    spdlog::info("run: no Kubernetes API ({}); no node condition or events", std::string(reporter.status().message()));
    return std::unique_ptr<kube::NodeReporter>();
  }
  if (!options.kubeconfig.empty()) return reporter.status();
  spdlog::error("run: Kubernetes API unusable ({}); running without node condition and events",
                std::string(reporter.status().message()));
  return std::unique_ptr<kube::NodeReporter>();
}

}  // namespace

int RunRun(const std::vector<std::string>& args, std::ostream& out) {
  ParsedCommand cmd;
  if (auto exit = ParseCommand(
          "run",
          "The DaemonSet's job. One loop owns the node: every selected GPU (with its group's companions) is\n"
          "bound to its vfio driver and kept there (failed binds retried with backoff, 1 s doubling to 5 min;\n"
          "unbound only when the node turns vm-vgpu), and every bound GPU is advertised to the kubelet. Readiness (gRPC health),\n"
          "Prometheus metrics, the validator's status files and the GPUPassthroughReady node condition and\n"
          "events report the node's state. Refuses a node the GPU Operator still manages. Runs until SIGTERM,\n"
          "SIGINT, SIGHUP or SIGQUIT, then deregisters and exits 0. In mode vm-vgpu nothing is bound and\n"
          "GPUs on vfio-pci go back to nvidia: every vGPU (mdev or SR-IOV) is advertised, one resource per vGPU type, and with\n"
          "--vgpu-config-file the profiles of the config the node label nvidia.com/vgpu.config names are created.\n"
          "The mode is the node label nvidia.com/gpu.workload.config (vm-passthrough or vm-vgpu), --workload\n"
          "while the node has none or there is no API. A label change is carried out without a restart: GPUs no\n"
          "VM holds move to the other driver (vfio-pci <-> nvidia), the advertised resources change; a GPU a VM\n"
          "holds moves once the VM ends. Any other label value: a Warning event, the mode stays.",
          RunFlags(), args, out, &cmd)) {
    return *exit;
  }
  auto db = LazyNameDatabase(cmd.common);
  auto options = DaemonOptionsFromFlags(cmd, db.get());
  if (!options.ok()) {
    std::cerr << "vfio-gpu-agent run: " << options.status().message() << "\n";
    return kExitUsage;
  }
  // Blocked before any thread starts (gRPC, binder workers, the API client), so every thread inherits the
  // mask and only sigwait below takes these signals.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  for (int signal : {SIGTERM, SIGINT, SIGHUP, SIGQUIT}) sigaddset(&stop_signals, signal);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto reporter = ConnectReporter(cmd);
  if (!reporter.ok()) {
    std::cerr << "vfio-gpu-agent run: " << reporter.status().message() << "\n";
    return kExitUsage;
  }
  daemon::Daemon daemon(*std::move(options), *std::move(reporter));
  if (absl::Status status = daemon.Start(); !status.ok()) {
    std::cerr << "vfio-gpu-agent run: " << status.message() << "\n";
    return kExitError;
  }
  int signal = 0;
  sigwait(&stop_signals, &signal);
  spdlog::info("run: signal {} ({}): deregistering and removing sockets", signal, strsignal(signal));
  daemon.Stop();
  return kExitOk;
}

}  // namespace vfio_agent::cli
