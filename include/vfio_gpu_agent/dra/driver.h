// The `serve --kubelet-api dra` engine: the agent as a kubelet DRA driver (issue 22). It serves
// pluginregistration.Registration on <registry_dir>/<driver>-reg.sock, which the kubelet's plugin watcher finds,
// and the DRAPlugin service (v1 and v1beta1, one set of handlers) on <plugins_dir>/<driver>/dra.sock, the endpoint
// GetInfo names. It takes its devices from the layers below (pci, names, binding), never from src/plugin: a node
// serves one kubelet API at a time.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "vfio_gpu_agent/common/host_paths.h"
#include "vfio_gpu_agent/common/workload.h"
#include "vfio_gpu_agent/dra/devices.h"
#include "vfio_gpu_agent/dra/taints.h"
#include "vfio_gpu_agent/fabric/partition_manager.h"
#include "vfio_gpu_agent/kube/resource_claim_reader.h"
#include "vfio_gpu_agent/kube/resource_claims.h"
#include "vfio_gpu_agent/kube/resource_slices.h"
#include "vfio_gpu_agent/names/resource_names.h"
#include "vfio_gpu_agent/node/source.h"
#include "vfio_gpu_agent/pci/selection.h"

namespace vfio_agent::dra {

// A DNS subdomain under a domain the project controls (Cozystack's), so it can never collide with another vendor's
// driver (gpu.nvidia.com is NVIDIA's dra-driver-nvidia-gpu), and it names what the driver hands out: GPUs for
// passthrough, bound to vfio-pci by this agent. ResourceSlices, DeviceClass selectors and the KEP-5304 metadata
// file name (<driver>-metadata.json) all carry it.
inline constexpr std::string_view kDefaultDriverName = "gpu.vfio-agent.cozystack.io";

// The kubelet's PluginInfo.type for a DRA driver, and the gRPC services offered, in the order the kubelet should
// consider them (it takes the first one it supports).
inline constexpr std::string_view kPluginType = "DRAPlugin";
inline constexpr std::string_view kServiceV1 = "v1.DRAPlugin";
inline constexpr std::string_view kServiceV1beta1 = "v1beta1.DRAPlugin";
// Health: the 1.37 kubelet picks v1 when listed (before v1alpha1 in the list, as the Go helper orders them); the
// 1.36 kubelet knows v1alpha1 only and opens it whatever the list says. Both are served from one stream source.
inline constexpr std::string_view kServiceHealthV1 = "v1.DRAResourceHealth";
inline constexpr std::string_view kServiceHealthV1alpha1 = "v1alpha1.DRAResourceHealth";

// Binding conditions (KEP-5007, --binding-conditions): a device that needs work before a VM can use it (bound to
// vfio-pci under --bind-on-prepare, a Fabric Manager partition) is published with the condition types
// "<driver>/vfio-bound" (binding) and "<driver>/bind-failed" (failure). The scheduler copies them into the claim's
// allocation and waits in PreBind until the agent sets the first True in the claim's status.devices[] entry, or
// gives the allocation up (and schedules the pod again) when the agent sets the second.
inline constexpr std::string_view kBindingConditionName = "vfio-bound";
inline constexpr std::string_view kBindingFailureConditionName = "bind-failed";
std::string BindingConditionType(std::string_view driver);         // <driver>/vfio-bound
std::string BindingFailureConditionType(std::string_view driver);  // <driver>/bind-failed

// One claim's binding, as `run` reports it (a metric and an Event).
struct BindingOutcome {
  std::string namespace_name;
  std::string name;
  std::string uid;
  bool ok = false;
  std::chrono::nanoseconds waited{0};  // from the allocation seen to the condition written
  std::string message;                 // what was done, or why it failed (the holder named)
};

// Starts the watch of the node's claims (kube::ResourceClaimClient::Watch); its handlers run on its thread.
using ClaimWatcher =
    std::function<std::unique_ptr<kube::ResourceClaimWatch>(kube::ResourceClaimWatch::Handlers handlers)>;
// Applies the driver's status.devices[] entries of a claim (kube::ResourceClaimClient::ApplyDeviceStatus).
using ClaimStatusWriter =
    std::function<absl::Status(const kube::ResourceClaim& claim, const std::vector<kube::DeviceStatus>& devices)>;

// The ResourceClaim the kubelet names in a Prepare, read from the API server (kube::ResourceClaimReader::Get).
using ClaimGetter =
    std::function<absl::StatusOr<kube::ResourceClaim>(const std::string& namespace_name, const std::string& name)>;

// Makes the node's ResourceSlices hold these devices (kube::ResourceSlicePublisher::Publish). Called from one
// thread at a time.
using SlicePublisher = std::function<absl::StatusOr<kube::PublishResult>(std::vector<kube::SliceDevice> devices)>;

// Starts watching the node's slices (kube::ResourceSlicePublisher::Watch); `changed` is called from the watch's
// thread. The watch stops when the returned object is destroyed.
using SliceWatcher = std::function<std::unique_ptr<kube::ResourceSliceWatch>(std::function<void()> changed)>;

// What the driver tells its host about Fabric Manager (`run`: the device plugin's events and metrics). It hears what
// the device plugin's fabric::FabricObserver hears (FM's state, a failed activation, an overlapping partition taken
// back), except that a claim's partition is announced with the claim it is active for, and its release says which
// claim let it go. Called without the driver's locks held.
class FabricObserver : public fabric::FabricObserver {
 public:
  // `claim` is "claim <namespace>/<name> (<uid>)".
  virtual void OnClaimPartitionActivated(const fabric::Partition& partition, const std::vector<std::string>& for_gpus,
                                         const std::string& claim) = 0;
};

// The shortest resync of a driver that watches its slices (DriverOptions::watch_slices). The watch reports every
// change by someone else, and lists again (reporting what it missed) after a 410 Gone, so the periodic list is only a
// safety net: for a change the watch cannot report (a watch the server keeps refusing) or an event wrongly taken
// for our own write. A 30 s one was 21 of the agent's 27 API requests in 10 minutes at rest on kube-apiserver 1.36.
inline constexpr std::chrono::minutes kWatchedSliceResync{10};

struct DriverOptions {
  std::string driver_name{kDefaultDriverName};
  std::filesystem::path registry_dir = "/var/lib/kubelet/plugins_registry";
  // <plugins_dir>/<driver>/ holds dra.sock, the checkpoint (claims/<uid>.json) and the KEP-5304 metadata files.
  std::filesystem::path plugins_dir = "/var/lib/kubelet/plugins";
  std::filesystem::path cdi_dir = "/var/run/cdi";
  HostPaths paths;  // sysfs_root, dev_root and proc_root (boot ID) are used
  pci::SelectionPolicy policy;
  // Without it every claim is answered with an error saying the API is not configured.
  ClaimGetter get_claim;
  // The pool every device is in (the health stream's pool_name, the ResourceSlices' pool): the node's name.
  std::string node_name;
  // Names (resourceName and productName attributes), as the device plugin resolves them. pci_ids is not owned,
  // may be null, and must outlive the driver.
  const names::PciIdsDatabase* pci_ids = nullptr;
  std::string domain = "nvidia.com";
  std::vector<names::NameOverride> overrides;
  // inotify on <dev_root> and <dev_root>/vfio drives every change a VM would notice (a GPU lost, unbound or
  // back takes or brings its group node); this safety-net rescan catches the rest (config space going dead).
  std::chrono::milliseconds rescan_interval{60000};
  // vm-vgpu: the devices are the node's vGPUs (vgpu_devices.h), never bound or unbound; the SR-IOV cards' type
  // catalogs are kept in vgpu_catalog_file (shared with the device plugin's and the profile applier's stores).
  Workload workload = Workload::kVmPassthrough;
  std::filesystem::path vgpu_catalog_file;
  // Without it no ResourceSlice is written (`serve` without an API).
  SlicePublisher publish_slices;
  // With it, a slice deleted or changed by anyone else is put back as soon as the watch reports it (at most one
  // publication a second from watch events); without it only the resync below notices.
  SliceWatcher watch_slices;
  // The slices are listed (and rewritten when they differ) this often, every second for 5 s after each accepted
  // registration (a kubelet's start deletes the node's slices around the time it registers us), and after every
  // device change. With watch_slices, no more often than kWatchedSliceResync: see there.
  std::chrono::milliseconds slice_resync_interval{30000};
  // --bind-on-prepare: GPUs stay on their host driver until a claim needs them. Prepare binds the claim's whole
  // IOMMU groups to vfio-pci (and fails the claim, everything moved returned, when that cannot finish in time);
  // Unprepare returns each function it moved to the driver recorded before the bind. Off (the default): `run`
  // binds every GPU at start and they stay on vfio-pci.
  bool bind_on_prepare = false;
  // How health becomes slice taints (taints.h): NoSchedule per failure kind, None for warnings; NoExecute for a gone
  // device only when the operator asks (--dra-taint-no-execute).
  TaintPolicy taints;
  // HGX shared-NVSwitch mode (`--fabric-manager`, as the device plugin's): off while fabric.address is empty. Each
  // GPU gets its partition<N> attributes, Prepare activates the claim's partition and Unprepare releases it.
  // activation_grace is not used: a claim's checkpoint names its GPUs before Prepare answers.
  fabric::FabricOptions fabric;
  std::filesystem::path fabric_library = "libnvfm.so.1";
  // How often Fabric Manager is read (its restarts followed, the attributes republished when its partitions change).
  std::chrono::milliseconds fabric_interval{5000};
  FabricObserver* fabric_observer = nullptr;  // not owned; must outlive the driver
  // --binding-conditions: devices that need work before use carry binding conditions, and the claim watch's worker
  // does that work for each allocated claim of this pool before its pod is bound (see BindingConditionType). Needs
  // watch_claims and write_claim_status; off (or with a server that drops the fields, Kubernetes < 1.36) Prepare
  // binds as before. Has work only with bind_on_prepare or fabric.
  bool binding_conditions = false;
  ClaimWatcher watch_claims;
  ClaimStatusWriter write_claim_status;
  // Told each claim's binding outcome, on the binding worker's thread, without the driver's locks.
  std::function<void(const BindingOutcome&)> on_binding;
  // Told how long each NodePrepareResources call took, from the kubelet's call to the answer, and whether every
  // claim in it was prepared (`run`'s metrics). Called on the gRPC thread serving the call, under the driver's
  // call lock: it must not block.
  std::function<void(bool ok, std::chrono::nanoseconds duration)> on_prepare;
  // `run`: the process's one node::Source (not owned; it must outlive the driver, and be built with
  // bind_on_prepare as above), rescanned by `run`'s reconcile loop, which follows the device events: the driver takes
  // each state it scans and never scans on its own. Null (`serve`): the driver makes its own and rescans it on
  // inotify under <dev_root>.
  node::Source* source = nullptr;
};

// What the kubelet last said about our registration (NotifyRegistrationStatus).
struct RegistrationStatus {
  int get_info_calls = 0;
  int notifications = 0;
  bool registered = false;  // the last notification accepted us
  std::string error;        // the kubelet's error from the last notification, "" when accepted
};

// The combinations the driver refuses, with the reason for an operator: --bind-on-prepare moves whole GPUs, and a
// vm-vgpu node's GPUs belong to the vGPU manager (binding one would destroy every vGPU on it).
absl::Status ValidateModes(const DriverOptions& options);

// --binding-conditions with something to do: watch_claims and write_claim_status set, a vm-passthrough node, and
// --bind-on-prepare or --fabric-manager (a GPU that stays on vfio-pci without a partition needs no work first).
bool BindingConditionsWanted(const DriverOptions& options);

// DNS subdomain rules for a driver name (Kubernetes validates ResourceSlice.spec.driver the same way): at most
// 63 characters, lower-case alphanumerics, '-' and '.', each label starting and ending alphanumeric.
absl::Status ValidateDriverName(std::string_view name);

// <registry_dir>/<driver>-reg.sock
std::filesystem::path RegistrationSocket(const DriverOptions& options);
// <plugins_dir>/<driver>/dra.sock, absolute (the kubelet dials exactly the path GetInfo returns).
std::filesystem::path DraSocket(const DriverOptions& options);

class Driver {
 public:
  explicit Driver(DriverOptions options);
  ~Driver();  // Stop()
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;

  // Serves dra.sock, then the registration socket (so the endpoint exists before the kubelet can learn it). A
  // socket left by an earlier run is replaced; one a live server answers on is an AlreadyExists error.
  absl::Status Start();
  // Removes the registration socket first (the kubelet deregisters us), then stops serving. Idempotent.
  void Stop();

  RegistrationStatus Registration() const;
  // The devices as last scanned (the health stream's and the slices' content).
  std::vector<GpuDevice> Devices() const;
  int HealthStreams() const;
  // Slice publications that wrote something, and the last publication's error ("" when it succeeded).
  int SliceWrites() const;
  std::string SliceError() const;
  // nullopt without --fabric-manager.
  std::optional<fabric::FabricStatus> Fabric() const;
  // Why Fabric Manager keeps the GPU from being published healthy now ("" when it does not): the device plugin's rule
  // (fabric::PartitionManager::Unusable).
  std::string FabricUnusable(const std::string& bdf) const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// Blocks SIGTERM and SIGINT in the calling thread (call it before starting other threads), runs a Driver until
// one arrives, then stops it.
absl::Status Serve(const DriverOptions& options);

}  // namespace vfio_agent::dra
