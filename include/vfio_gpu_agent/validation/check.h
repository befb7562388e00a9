// The validator's unit of output: one check of one link in the passthrough chain (firmware -> kernel ->
// agent -> kubelet -> KubeVirt), with the evidence it read and, when it did not pass, the fix.
// Check ids are stable API (`inspect --json` consumers, metrics labels, node condition reasons): never
// rename one, only add.
#pragma once

#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "vfio_gpu_agent/common/host_paths.h"
#include "vfio_gpu_agent/common/workload.h"
#include "vfio_gpu_agent/dra/checkpoint.h"
#include "vfio_gpu_agent/fabric/partitions.h"
#include "vfio_gpu_agent/names/resource_names.h"
#include "vfio_gpu_agent/pci/inventory.h"
#include "vfio_gpu_agent/pci/selection.h"
#include "vfio_gpu_agent/node/snapshot.h"
#include "vfio_gpu_agent/plugin/vfio_backend.h"
#include "vfio_gpu_agent/vgpu/config.h"
#include "vfio_gpu_agent/vgpu/discovery.h"

namespace vfio_agent::validation {

// In chain order; the human report groups by layer in this order. kApi comes last: it is not a link of the
// chain but what bounds the agent's own account at the API server (issue 24).
// kVgpu (issue 19) stands in for kDevices on a vm-vgpu node, where the GPUs stay on nvidia (the vGPU manager).
enum class Layer { kPlatform, kDevices, kPlugin, kKubelet, kKubevirt, kApi, kFabric, kVgpu };
// "platform", "devices", "plugin", "kubelet", "kubevirt", "api", "fabric", "vgpu"
const char* LayerName(Layer layer);

enum class Result { kPass, kWarn, kFail, kSkip };
const char* ResultName(Result result);  // "pass", "warn", "fail", "skip"

// One thing read: a file, an RPC or a CR field, and the value seen there.
struct Evidence {
  std::string source;  // "/sys/class/iommu", "ListAndWatch kubevirt-GA102GL_A10.sock", "kubevirt.spec..."
  std::string value;   // "(empty)", "vfio-pci", "2 devices: 0000:3b:00.0,0000:86:00.0"
};

struct Check {
  std::string id;       // "iommu.enabled", "group.viable", "kubelet.allocatable", ...
  Layer layer = Layer::kPlatform;
  std::string subject;  // "node", a BDF, "group 73", a resource name
  Result result = Result::kPass;
  std::string message;  // one line: what is true (pass) or what is wrong; for skip, why it was skipped
  std::vector<Evidence> evidence;
  std::string fix;      // one or two concrete lines (kernel parameter, BIOS setting, command); "" on pass
};

// The node as the serving agent sees it: `model` is node::Build over the current scan (with the vGPU discovery on a
// vm-vgpu node) and the same name rules the agent uses, and `served` what the node serves of it under each resource
// name (node::ServedOf over `model`: `validate` counts the GPUs on vfio now, `run`'s pass every selected one), which
// the plugin, kubelet and KubeVirt layers judge the node by. The daemon's vm-vgpu readiness has no model: `served` is
// then what its frontend serves. Never the device plugin's own model (plugin::DeviceSnapshot): validation judges the
// node by the node's model, whichever frontend serves it.
struct VgpuView;
struct NodeView {
  HostPaths paths;
  const pci::Inventory* inventory = nullptr;
  const pci::Selection* selection = nullptr;
  const node::Snapshot* model = nullptr;
  const node::ServedDevices* served = nullptr;
  Workload workload = Workload::kVmPassthrough;  // vm-vgpu: `served` holds vGPUs, and the messages say so
  const VgpuView* vgpu = nullptr;  // vm-vgpu only
  // --kubelet-api dra --bind-on-prepare: GPUs stay on their host drivers until a claim's Prepare binds them, so
  // layer 2 wants on a vfio driver only the IOMMU groups the driver's checkpoint says a prepared claim holds (or
  // why the checkpoint could not be read). Null: every selected GPU belongs on a vfio driver.
  const absl::StatusOr<dra::CheckpointRead>* bind_on_prepare = nullptr;
  // The device plugin's --vfio-backend (kubevirt.vfio_backend says what Allocate hands out under it); nullopt on a
  // DRA node, where each claim's DeviceClass picks.
  std::optional<plugin::VfioBackendChoice> vfio_backend;
};

// vm-vgpu: what the vGPU layer reads besides sysfs.
struct VgpuView {
  const vgpu::Discovery* discovery = nullptr;
  // The profiles config (--vgpu-config-file, --vgpu-config): the types it asks of each GPU by PF BDF
  // (vgpu::DesiredTypes), or why it could not be read; nullopt: no config given.
  std::optional<absl::StatusOr<std::map<std::string, std::map<std::string, int>>>> desired;
  std::string config_source;  // "<file> config <name>", for evidence
  std::string domain = "nvidia.com";  // of the vGPU resource names
};

// vgpu::Discover with the catalogs the agent remembered in `catalog_file` (<state-dir>/vgpu-catalog.txt), which
// is read and never written (empty: none). A catalog that cannot be read, or a mdev bus that cannot be listed, is
// an error of the result (Discovery::errors), so a reader still reports what it could see.
vgpu::Discovery DiscoverVgpusReadOnly(const std::filesystem::path& sysfs_root, const pci::Inventory& inventory,
                                      const std::filesystem::path& catalog_file);

// The GPUs a vgpu-device-manager config's `devices` indices count (vgpu/config.h): NVIDIA display and 3D
// controllers that are physical functions, in PCI address order.
std::vector<vgpu::ConfigGpu> ConfigGpus(const pci::Inventory& inventory);

// Layers 1-2 (read-only sysfs, dev and proc under node.paths; never reads config space of a device in D3cold).
std::vector<Check> PlatformChecks(const NodeView& node);
std::vector<Check> DeviceChecks(const NodeView& node);

// GPU Operator compatible status files in `dir` (/run/nvidia/validations in the DaemonSet): `workload-type`
// ("vm-passthrough\n") always, and an empty `vfio-pci-ready` while `host_ready` (layers 1-2 have no failure),
// removed otherwise. Atomic (temp file + rename); no other file in `dir` is touched.
absl::Status WriteStatusFiles(const std::filesystem::path& dir, bool host_ready);

// vm-vgpu status files (as the GPU Operator's validator writes them, cmd/nvidia-validator): `workload-type`
// ("vm-vgpu\n"); an empty `vgpu-manager-ready` while `manager_ready` (the vGPU manager is loaded and, on SR-IOV
// cards, every VF is enabled), an empty `vgpu-devices-ready` while `devices_ready` (vGPUs exist as configured);
// each removed otherwise. `vfio-pci-ready` is removed: no GPU of a vm-vgpu node is on vfio-pci. Atomic, as above.
absl::Status WriteVgpuStatusFiles(const std::filesystem::path& dir, bool manager_ready, bool devices_ready);

// The vGPU layer (vm-vgpu; on vm-passthrough one skip saying so): every GPU on nvidia, the vGPU manager present
// (mdev parents, or GPUs with nvidia/creatable_vgpu_types), one framework, VFs enabled on SR-IOV cards, every
// vGPU readable and named, at least one vGPU, and the profiles of the config when one is given. Read-only.
std::vector<Check> VgpuChecks(const NodeView& node);
// What `vgpu-manager-ready` and `vgpu-devices-ready` stand for: no failure in the platform layer and the vGPU
// layer's manager checks (vgpu.gpu_driver, vgpu.manager, vgpu.framework, vgpu.vfs_enabled); devices: no failure in
// the platform and vGPU layers at all.
bool VgpuManagerReady(const std::vector<Check>& checks);
bool VgpuDevicesReady(const std::vector<Check>& checks);

// Layers 3-5. Each returns its checks in a stable order; a layer that cannot run (socket absent, no CR
// given) returns kSkip checks that say why, never an empty list.
//
// Plugin: acts as the kubelet does on every kubevirt-<name>.sock in paths.kubelet_dir: GetDevicePluginOptions,
// then the first ListAndWatch response (bounded by `wait`), compared with `served`. Another socket serving
// one of our resource names, or our devices (their IOMMU groups' functions from `model`), fails.
std::vector<Check> PluginChecks(const NodeView& node, std::chrono::milliseconds wait);
// Kubelet: pod-resources GetAllocatableResources + List on `socket` against the healthy set of `served`.
std::vector<Check> KubeletChecks(const NodeView& node, const std::filesystem::path& socket,
                                 std::chrono::milliseconds wait);
// KubeVirt: `kubevirt_cr` is the text of a KubeVirt CR (YAML or JSON, one object, a List, or
// `kubectl get kubevirt -A -o yaml` output); nullopt = none given (skip with why).
std::vector<Check> KubevirtChecks(const NodeView& node, const std::optional<std::string>& kubevirt_cr,
                                  const names::NameResolver& names);

// KubeVirt, when `validate` asked the API server for the CR and got none: what it got instead. Reading the
// cluster is the CLI's part (src/kube); this only turns the outcome into the layer's checks.
struct KubevirtCrUnavailable {
  enum class Reason {
    kNotInstalled,  // 404: kubevirt.io/v1 is not served
    kNoCr,          // the list is empty: the CRD is there, no KubeVirt CR
    kUnauthorized,  // 401: the credentials were not accepted
    kForbidden,     // 403: RBAC denies get/list kubevirts.kubevirt.io
    kUnavailable,   // unreachable, timed out, 5xx, any other answer
  };
  Reason reason = Reason::kUnavailable;
  std::string request;  // "GET https://10.96.0.1:443/apis/kubevirt.io/v1/kubevirts"
  std::string detail;   // what the server (or the transport) said, and where the credentials came from
};
std::vector<Check> KubevirtUnavailableChecks(const KubevirtCrUnavailable& why);
// KubeVirt on a vm-vgpu node: each vGPU resource of node.served permitted with externalResourceProvider: true,
// mdev types as mediatedDevices (mdevNameSelector = the type name), SR-IOV profiles as pciHostDevices; the
// feature gates as KubevirtChecks.
std::vector<Check> VgpuKubevirtChecks(const NodeView& node, const std::optional<std::string>& kubevirt_cr);

// Api layer: whether the ValidatingAdmissionPolicy that holds each agent to its own Node
// (daemonset/base/agent/admission-policy.yaml) is installed and bound with Deny, as `validate` read the policy
// and its binding by name from the API server. Reading is the CLI's part (src/kube), as for the KubeVirt CR.
struct ApiObjectRead {
  enum class Outcome {
    kFound,         // body is the object's JSON
    kAbsent,        // 404 naming the object: not installed
    kNotServed,     // 404 naming nothing: admissionregistration.k8s.io/v1 policies not served (Kubernetes < 1.30)
    kUnauthorized,  // 401
    kForbidden,     // 403: RBAC denies get on it
    kUnavailable,   // unreachable, timed out, 5xx, any other answer
  };
  Outcome outcome = Outcome::kUnavailable;
  std::string request;  // "GET https://10.96.0.1:443/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/N"
  std::string body;     // kFound: the object; otherwise what the server (or the transport) said
};
struct AdmissionPolicyRead {
  std::string name;         // of the policy and of its binding
  ApiObjectRead policy;
  ApiObjectRead binding;
  std::string credentials;  // where they came from: "kubeconfig /path", "in-cluster /var/run/..."
};
// nullopt: no cluster to ask (skipped, saying so). Never fails: without the policy (or on a cluster that cannot
// have one) the agent still works, with less holding it; that is a warning naming what is lost.
std::vector<Check> ApiChecks(const std::optional<AdmissionPolicyRead>& read);

// Layer 7, shared-NVSwitch mode: what `validate --fabric-manager` read from Fabric Manager.
struct FabricRead {
  std::string address;
  absl::StatusOr<fabric::PartitionTable> table = absl::UnknownError("not read");
};
// nullopt: no --fabric-manager, skipped (saying which mode the node is then in).
std::vector<Check> FabricChecks(const NodeView& node, const std::optional<FabricRead>& read);

}  // namespace vfio_agent::validation
