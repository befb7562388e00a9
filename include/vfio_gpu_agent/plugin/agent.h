// The `serve` subcommand's engine: one gRPC device-plugin server and socket per resource name in the
// kubelet directory, registration with the kubelet (retried forever, immediately when kubelet.sock
// appears), re-registration after kubelet restarts, and a live device set.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "vfio_gpu_agent/common/host_paths.h"
#include "vfio_gpu_agent/common/workload.h"
#include "vfio_gpu_agent/fabric/partition_manager.h"
#include "vfio_gpu_agent/names/resource_names.h"
#include "vfio_gpu_agent/node/source.h"
#include "vfio_gpu_agent/pci/selection.h"
#include "vfio_gpu_agent/plugin/devices.h"
#include "vfio_gpu_agent/plugin/vfio_backend.h"

namespace vfio_agent::plugin {

// What the agent tells its host process about the kubelet side (metrics of `run`). Called on gRPC and loop
// threads; implementations must be thread-safe and must not block.
class AgentObserver {
 public:
  virtual ~AgentObserver() = default;
  virtual void OnAllocate(const std::string& resource_name, bool ok, std::chrono::nanoseconds latency) = 0;
  // kubelet.sock was re-created or our socket removed: the kubelet restarted and we re-register.
  virtual void OnKubeletRestart() = 0;
  // vm-vgpu: a reason a vGPU is not advertised appeared (a type whose name is unknown, an unreadable device, both
  // frameworks on the node); once per problem while it lasts. Called on the scan thread.
  virtual void OnVgpuProblem(const std::string& problem) {}
};

struct ServeOptions {
  HostPaths paths;  // sysfs_root, dev_root and kubelet_dir are used
  pci::SelectionPolicy policy;
  // Names: domain ("nvidia.com"), overrides, and the pci.ids database (not owned; may be null, then
  // pinned names and raw device ids are used). It must outlive the agent.
  std::string domain = "nvidia.com";
  std::vector<names::NameOverride> overrides;
  const names::PciIdsDatabase* pci_ids = nullptr;
  // The kubelet's registration socket; empty = <kubelet_dir>/kubelet.sock.
  std::filesystem::path kubelet_socket;
  // Safety-net rescan of sysfs (vendor-scoped). udev and inotify on <dev_root>/vfio drive every change at once,
  // so it is rare: an idle 8-GPU node then costs well under 2 ms of CPU per 20 s. Only a change that raises no
  // event (config space going dead without a uevent) waits for it.
  std::chrono::milliseconds rescan_interval{60000};
  // A kubelet that is exiting (a restart) ends our ListAndWatch stream a moment before it stops accepting on
  // kubelet.sock; the next kubelet then deletes our socket. A stream end is therefore acted on only when the
  // kubelet still accepts this long after it (looked at every 50 ms): a kubelet restart restarts the server
  // once, when our socket is deleted, and a stream the kubelet cut while staying up re-registers after this.
  std::chrono::milliseconds stream_end_settle{1000};
  bool udev = true;  // libudev monitor of the pci and mdev subsystems; tests on a simulated sysfs turn it off
  // vm-vgpu: the vGPUs are advertised (vgpu_devices.h) instead of the vfio-bound GPUs.
  Workload workload = Workload::kVmPassthrough;
  // vm-vgpu: where the SR-IOV cards' vGPU type catalogs are kept across restarts (vgpu/catalog.h); empty = in
  // memory only, and a card full before the agent starts then has vGPUs whose names are unknown.
  std::filesystem::path vgpu_catalog_file;
  bool cdi = false;  // cdi_devices in Allocate plus generated CDI specs in cdi_dir
  std::filesystem::path cdi_dir = "/var/run/cdi";
  AgentObserver* observer = nullptr;  // not owned; must outlive the agent
  // Shared-NVSwitch mode (--fabric-manager): on when fabric.address is set. A GPU is advertised only while
  // Fabric Manager vouches for it, GetPreferredAllocation hands out partitions, Allocate activates one, and
  // partitions no pod holds (pod-resources) are released every fabric_interval.
  fabric::FabricOptions fabric;
  std::filesystem::path fabric_library = "libnvfm.so.1";
  std::chrono::milliseconds fabric_interval{5000};
  fabric::FabricObserver* fabric_observer = nullptr;  // not owned; must outlive the agent
  // `run`: the process's one node::Source (not owned; it must outlive the agent), rescanned by `run`'s reconcile
  // loop, which also follows the device events: the agent takes each state it scans and never scans on its own
  // (udev, the safety rescan and the device half of its inotify are the loop's). Null (`serve`): the agent makes
  // its own from the fields above and rescans it on its device events.
  node::Source* source = nullptr;
  // Which VFIO nodes Allocate and the CDI specs hand out (vfio_backend.h). auto follows the KubeVirt release told
  // through Agent::SetKubevirtRelease (unknown until then); iommufd refuses to start on a host without
  // <dev_root>/iommu.
  VfioBackendChoice vfio_backend = VfioBackendChoice::kAuto;
};

struct ResourceStatus {
  std::string resource_name;
  std::filesystem::path socket;  // <kubelet_dir>/kubevirt-<NAME>.sock
  bool registered = false;       // the last Register succeeded and nothing has invalidated it since
  int registrations = 0;         // successful Register calls
  int live_streams = 0;          // ListAndWatch streams open now
  int serves = 0;                // times its server was started (the first serve and every restart)
  bool stream_end_pending = false;  // the stream ended while kubelet.sock accepted (ServeOptions::stream_end_settle)
};

class Agent {
 public:
  explicit Agent(ServeOptions options);
  ~Agent();  // Stop()
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // First scan, then serve and register in the background. Fails only on errors that retrying cannot fix
  // (sysfs not listable, kubelet dir not creatable, inotify unavailable).
  absl::Status Start();
  // Graceful shutdown (SIGTERM): an empty device list on every stream, streams closed, servers stopped,
  // own sockets and CDI specs removed. Idempotent; blocks until done.
  void Stop();
  // Rescans sysfs now instead of at the next tick (a device was just bound); returns at once. With a shared
  // ServeOptions::source the device list is rebuilt from its last state instead (Fabric Manager's news): the
  // source's owner rescans.
  void RescanNow();
  // The KubeVirt release the cluster runs (nullopt: unknown), for --vfio-backend auto. Any thread (`run` calls it on
  // the API worker, va-kube-api); returns at once. A change of the resolved node set rescans, and the next
  // snapshot re-publishes every resource (ListAndWatch when health changes, the CDI specs, Allocate's answer).
  void SetKubevirtRelease(const std::optional<kube::KubevirtRelease>& release);
  // The node set Allocate hands out now (ResolveNodeSet of the choice and the last release told).
  pci::VfioNodeSet NodeSet() const;

  DeviceSnapshot Snapshot() const;
  std::vector<ResourceStatus> Resources() const;
  // nullopt without --fabric-manager.
  std::optional<fabric::FabricStatus> Fabric() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// Blocks SIGTERM and SIGINT in the calling thread (call it before starting other threads), runs an Agent
// until one arrives, then stops it gracefully.
absl::Status Serve(const ServeOptions& options);

// "nvidia.com/GH100_H200_SXM_141GB" -> "kubevirt-GH100_H200_SXM_141GB.sock", as the peer plugin names it.
std::string SocketName(std::string_view resource_name);

}  // namespace vfio_agent::plugin
