// The engine of `run`, the DaemonSet's process: one reconcile loop owns the node (every selected GPU and its
// group's companions on their vfio driver, bound with per-device backoff, never unbound; in mode vm-vgpu the
// vGPUs, GPUs on vfio going back to nvidia), one kubelet frontend (node::Frontend: the device plugin or the DRA
// driver) serves what is bound (or the vGPUs) from the loop's scans, and the node's state is published: gRPC
// health (liveness, readiness), Prometheus metrics, the validator's status files, and the GPUPassthroughReady
// node condition and events through the Kubernetes API when there is one.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "vfio_gpu_agent/binding/binder.h"
#include "vfio_gpu_agent/dra/driver.h"
#include "vfio_gpu_agent/kube/node_reporter.h"
#include "vfio_gpu_agent/node/frontend.h"
#include "vfio_gpu_agent/plugin/agent.h"

namespace vfio_agent::daemon {

// Labels with which the GPU Operator deploys its own sandbox components on a node; `run` refuses the node
// while either is "true".
inline constexpr const char* kOperatorLabels[] = {"nvidia.com/gpu.deploy.sandbox-device-plugin",
                                                  "nvidia.com/gpu.deploy.vfio-manager"};
inline constexpr char kOperatorReason[] = "OperatorStillManagesNode";

// vm-vgpu: the node label that chooses the vGPU profile config (as for NVIDIA's vgpu-device-manager), and the one
// the agent writes with how applying it went: "pending" (a VM still holds a vGPU the config changes), "success"
// or "failed" (with a VgpuConfigFailed event naming the device and the reason).
inline constexpr char kVgpuConfigLabel[] = "nvidia.com/vgpu.config";
inline constexpr char kVgpuConfigStateLabel[] = "nvidia.com/vgpu.config.state";

// The node label that chooses the workload mode, as the GPU Operator names it: "vm-passthrough" or "vm-vgpu". It
// wins over `serve.workload` (--workload), which is the mode while the node has no such label or there is no API.
// A change is carried out by the running agent: GPUs no VM holds move to the other mode's driver and the
// advertised resources change; a GPU a VM holds moves once the VM lets go. Any other value: a Warning event and
// the mode stays as it is.
inline constexpr char kWorkloadLabel[] = "nvidia.com/gpu.workload.config";

struct DaemonOptions {
  // targets: the GPUs this agent manages (EverySelected, or --device's); each pass binds the due ones of them.
  binding::BinderOptions bind;
  plugin::ServeOptions serve;   // `observer` is set by the daemon
  // `run --kubelet-api dra`: this DRA driver serves the bound GPUs and the device plugin is never started (one
  // kubelet API a node). Readiness then asks the driver: registered, every GPU healthy, slices written.
  std::optional<dra::DriverOptions> dra;
  // Tests: makes the frontend the daemon drives (node::Frontend) instead of the device plugin or the DRA driver, for
  // the workload given; called again for the new mode on a mode switch. Null: `dra`'s driver, else `serve`'s plugin.
  std::function<std::unique_ptr<node::Frontend>(Workload workload)> make_frontend;
  std::string listen_host = "0.0.0.0";  // health and metrics listen here (the pod IP, with hostNetwork)
  int health_port = 8081;                // grpc.health.v1.Health; 0 = off
  int metrics_port = 9400;               // Prometheus text format on /metrics; 0 = off
  std::filesystem::path status_dir;      // validator status files; "" = none
  std::chrono::milliseconds resync_interval{60000};      // a safety pass with nothing else happening (events drive it)
  std::chrono::milliseconds not_ready_interval{1000};    // a pass while not ready (kubelet lag, ...)
  std::chrono::milliseconds coexistence_recheck{30000};  // while refusing the node
  std::chrono::milliseconds first_backoff{1000};
  std::chrono::milliseconds max_backoff{std::chrono::minutes(5)};
  std::chrono::milliseconds live_limit{std::chrono::minutes(2)};  // a loop silent this long is not live
  std::chrono::milliseconds kubelet_wait{2000};                   // pod-resources call deadline
  // Registration in progress (after a start or a kubelet restart) is published as a failure only when it
  // lasts this long; until then the probe says not ready and the API hears nothing.
  std::chrono::milliseconds registration_grace{30000};
  // vm-vgpu: the profile config file (vgpu-device-manager's format, mounted from a ConfigMap; read on every pass);
  // "" = profiles are not applied. The config is the node's kVgpuConfigLabel, else `vgpu_config`.
  std::filesystem::path vgpu_config_file;
  std::string vgpu_config;
  // While a change waits for a VM to free its vGPU, or failed, how soon it is tried again.
  std::chrono::milliseconds vgpu_retry{5000};
  // With an API, until the reporter's watch of the Node has listed it (or when it cannot watch): how often the labels
  // are read (a change of kWorkloadLabel starts a pass). Once the watch runs, a relabel starts a pass at once and
  // nothing is polled.
  std::chrono::milliseconds workload_label_interval{30000};
  // While a GPU waits for a VM to free it before moving to the current mode's driver, how soon it is looked at again.
  std::chrono::milliseconds mode_retry{5000};
  // On Stop, how long the AgentStopped condition may take to reach the API before the plugin deregisters
  // (well inside the pod's termination grace period, 30 s by default).
  std::chrono::milliseconds stop_report_timeout{5000};
};

// What the health service answers and the node condition says.
struct Readiness {
  bool ready = false;
  std::string check_id;  // failing check ("devices.bound", ...); "" when ready
  std::string reason;    // node condition reason: "AllDevicesReady", "DeviceNotBound", ...
  std::string message;   // names the check and the devices
  // Not ready, in a state that clears by itself (the kubelet dialling back, ListAndWatch reaching its
  // allocatable set) and younger than the registration grace: neither a False condition nor a Warning.
  bool settling = false;
  bool operator==(const Readiness&) const = default;
};

// Another device plugin in the kubelet directory that answers for one of our resources, or for NVIDIA's
// GPUs at all. Our own sockets (left from a previous run) do not answer until we serve them, so a socket
// that accepts a connection before we start is someone else's: kubevirt-<our name>.sock (the GPU Operator's
// sandbox device plugin) or nvidia-*.sock (NVIDIA's device plugin). Empty when none.
std::vector<std::string> ForeignPluginSockets(const std::filesystem::path& kubelet_dir,
                                              const std::vector<std::string>& resource_names);

// Kernel uevents about PCI devices, as one file descriptor for the loop's poll(2). A uevent is news about
// that device (a holder let go, a reset finished), so it resets the device's backoff. In production this is
// the libudev monitor; tests feed their own, since a simulated sysfs raises no uevents.
class UeventSource {
 public:
  virtual ~UeventSource() = default;
  virtual int fd() const = 0;  // readable while events wait
  // True when at least one event arrived; the BDFs of the devices concerned are appended to `bdfs`.
  virtual bool Drain(std::vector<std::string>* bdfs) = 0;
};

class Daemon {
 public:
  // `reporter` may be null (no cluster API). `uevents` null: the libudev monitor when options.serve.udev.
  Daemon(DaemonOptions options, std::unique_ptr<kube::NodeReporter> reporter,
         std::unique_ptr<UeventSource> uevents = nullptr);
  ~Daemon();  // Stop()
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Health and metrics listeners, the coexistence check, the first bind pass, the device plugin, then the
  // loop in the background. Fails only when a listener cannot bind or sysfs cannot be read.
  absl::Status Start();
  // Sets the node condition to Unknown (AgentStopped: the GPUs stay bound) and waits for the API to store it,
  // at most stop_report_timeout; then deregisters (empty device lists), removes the plugin sockets, stops the
  // listeners. Nothing is unbound.
  void Stop();

  Readiness State() const;
  // Runs a full pass on the loop now and returns once one that started after this call has finished.
  void ReconcileNow();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace vfio_agent::daemon
