// A kubelet frontend as `run` drives it: the device plugin (plugin::MakeFrontend) or the DRA driver
// (dra::MakeFrontend) behind one small interface, so that the daemon holds one frontend and asks it, never which one
// it is. The frontend takes the node from the process's node::Source (the daemon rescans it); what is the frontend's
// own business (how it serves, what it must show before the node is ready, whether it can change mode while serving,
// what its claims hold) is answered here, in the frontend's words (check ids, messages).
//
// Every call but Fabric() and SetKubevirtRelease() is the daemon's reconcile thread's (va-reconcile, and Start's
// before it exists).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "vfio_gpu_agent/common/workload.h"
#include "vfio_gpu_agent/fabric/partition_manager.h"
#include "vfio_gpu_agent/kube/kubevirt_release.h"
#include "vfio_gpu_agent/node/snapshot.h"  // ServedDevices

namespace vfio_agent::node {

// A failing check of the frontend's side of readiness, as the node condition says it.
struct FrontendCheck {
  std::string id;       // "plugin.advertised", "dra.registered", ...
  std::string reason;   // the condition reason: "DeviceNotAdvertised", "NotRegistered", ...
  std::string message;  // names the check and the devices
  bool operator==(const FrontendCheck&) const = default;
};

// What the daemon asks of the frontend after a pass.
struct ReadinessQuery {
  // vm-passthrough: the GPUs (BDFs) that must be served healthy. vm-vgpu: empty; the frontend's vGPUs are judged.
  std::vector<std::string> required;
  // The devices the daemon's own scan expects served (vm-passthrough; empty in vm-vgpu). A GPU healthy here that the
  // frontend still serves unhealthy can be one rescan behind.
  ServedDevices expected;
  bool vgpus = false;  // vm-vgpu
};

// The frontend's side of readiness. The daemon publishes `failing` as it is; past it, a frontend whose devices the
// kubelet lists as allocatable (the device plugin) has that compared too (validation's kubelet checks, the daemon's).
struct FrontendReadiness {
  std::optional<FrontendCheck> failing;  // the first failing check of the frontend's own; nullopt when they pass
  // vm-vgpu: the frontend serves no vGPU (none created yet): the node is ready with nothing to serve; `summary` says so.
  bool nothing_served = false;
  // vm-vgpu: what the ready condition says of the frontend's vGPUs ("3 vGPUs healthy and published as DRA devices").
  std::string summary;
  // Set when the kubelet holds an allocatable set of what the frontend serves, which must equal its healthy devices:
  // a key that changes whenever what the frontend hands the kubelet does (its registrations, devices and health), so
  // that the kubelet is asked again then. nullopt: the kubelet has no such set for this frontend (DRA).
  std::optional<std::string> allocatable_key;
  // What the frontend serves now (the devices its answer was judged on), for the kubelet's comparison in vm-vgpu.
  ServedDevices served;
  // Successful registrations per resource name, for the metrics; set once the devices were found advertised and
  // healthy (the device plugin's registration check).
  std::map<std::string, int> registrations;
};

class Frontend {
 public:
  virtual ~Frontend() = default;

  // Serves and registers with the kubelet in the background; the first device list is the source's current state.
  // Fails only on errors that retrying cannot fix.
  virtual absl::Status Start() = 0;
  // Deregisters (the kubelet's count drops to 0) and stops serving. Idempotent; blocks until done.
  virtual void Stop() = 0;

  // The frontend's side of readiness, against the daemon's expectation.
  virtual FrontendReadiness Readiness(const ReadinessQuery& query) = 0;
  // What the frontend serves, as the daemon's device metrics and DeviceLost/DeviceRecovered events count it, given
  // what the daemon's scan expects (sorted as ServedDevices). A frontend that applies the same rules to the same scan
  // (the DRA driver) answers `expected` with its own differences (Fabric Manager's, a claim's binds).
  virtual ServedDevices Served(const ServedDevices& expected) const = 0;

  // Whether the frontend moves the GPUs it hands out onto vfio itself (DRA's --bind-on-prepare): then the daemon
  // binds nothing and leaves every GPU on its host driver.
  virtual bool BindsOnDemand() const = 0;
  // Whether the frontend can serve `workload` at all; the error says why not, for an operator.
  virtual absl::Status Supports(Workload workload) const = 0;
  // nullopt when a serving frontend can be replaced by one of another mode (the device plugin: the old deregisters,
  // the new registers); else why the mode stays `current` while it serves, for an operator.
  virtual std::optional<std::string> LiveSwitchRefusal(Workload current) const = 0;
  // vm-vgpu: the vGPUs (mdev UUID or VF BDF) the frontend's clients hold without an open group yet, each with who
  // holds it ("DRA claim ns/name"), so that a profile change leaves them. An error when that cannot be known now (no
  // vGPU may then be changed).
  virtual absl::StatusOr<std::map<std::string, std::string>> HeldVgpus() const = 0;

  // Whether SetKubevirtRelease matters (--vfio-backend auto): the daemon then follows the cluster's KubeVirt.
  virtual bool FollowsKubevirtRelease() const = 0;
  // Any thread; returns at once.
  virtual void SetKubevirtRelease(const std::optional<kube::KubevirtRelease>& release) = 0;
  // With --fabric-manager: Fabric Manager as the frontend sees it; nullopt without. Any thread.
  virtual std::optional<fabric::FabricStatus> Fabric() const = 0;
};

}  // namespace vfio_agent::node
