// What the device plugin serves: each extended resource's devices (ListAndWatch) and what Allocate hands out,
// derived from the node's model (node::Snapshot), which the DRA driver, `validate` and the daemon read too. Only the
// device plugin's own policy lives here: which devices it advertises (a GPU once seen on vfio), and how they group
// into resources. DeviceSnapshot is the plugin's own model, not the node's: nothing outside the plugin judges the node
// by it (node::ServedOf says what the node serves).
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "vfio_gpu_agent/common/host_paths.h"
#include "vfio_gpu_agent/names/resource_names.h"
#include "vfio_gpu_agent/node/snapshot.h"
#include "vfio_gpu_agent/pci/inventory.h"
#include "vfio_gpu_agent/pci/selection.h"
#include "vfio_gpu_agent/pci/vfio_backend.h"
#include "vfio_gpu_agent/pci/vfio_health.h"

namespace vfio_agent::plugin {

inline constexpr char kHealthy[] = "Healthy";
inline constexpr char kUnhealthy[] = "Unhealthy";
// gRPC metadata key a ListAndWatch client sends to say it only probes (`validate`'s plugin layer). A probe's stream
// is not the kubelet's: it neither counts as the stream that follows a Register nor, when it ends or outlives the
// kubelet's, decides whether the agent re-registers.
inline constexpr char kProbeMetadata[] = "x-vfio-gpu-agent-probe";

struct PluginDevice {
  std::string id;  // the GPU's BDF (an mdev vGPU's UUID); stable across restarts and reboots (R9)
  bool healthy = false;
  std::string unhealthy_reason;  // "" when healthy; "driver nvidia", "no /dev/vfio/73", ...
  std::optional<int> numa_node;  // nullopt = no topology (sysfs -1), never reported as node 0 (R10)
  std::optional<int> iommu_group;
  std::vector<std::string> group_functions;  // vendor functions of the group (GPUs, NVSwitches, companions), sorted
  // An NVSwitch's fellow switches in its IOMMU group, sorted: a guest's Fabric Manager needs every switch of the
  // board, so Allocate hands them out together or not at all. Empty for a GPU.
  std::vector<std::string> group_peers;
  std::vector<std::string> vfio_cdevs;       // this function's iommufd cdevs ("vfio3"), sorted

  bool operator==(const PluginDevice&) const = default;
};

// What a resource's device ids are: PCI addresses (GPUs, NVSwitches, SR-IOV vGPUs) or mdev UUIDs (mdev vGPUs,
// whose Allocate hands out the legacy nodes only, as KubeVirt's mdev plugin does: an mdev has no iommufd cdev).
enum class DeviceIdKind { kPciAddress, kMdevUuid };

struct ResourceDevices {
  std::string resource_name;  // "nvidia.com/GH100_H200_SXM_141GB"
  std::string env_name;       // "PCI_RESOURCE_NVIDIA_COM_GH100_H200_SXM_141GB"
  std::vector<PluginDevice> devices;  // sorted by id
  DeviceIdKind id_kind = DeviceIdKind::kPciAddress;

  const PluginDevice* Find(std::string_view id) const;
  // The nodes a VM given these devices gets under the node's resolved set: an mdev's are always the legacy ones.
  pci::VfioNodeSet NodeSetFor(pci::VfioNodeSet resolved) const {
    return id_kind == DeviceIdKind::kMdevUuid ? pci::VfioNodeSet::kLegacy : resolved;
  }
  bool operator==(const ResourceDevices&) const = default;
};

struct DeviceSnapshot {
  std::map<std::string, ResourceDevices> resources;  // by resource name
  bool iommufd = false;  // <dev_root>/iommu exists
  // What Allocate and the CDI specs hand out (--vfio-backend resolved, vfio_backend.h): set by the agent, not the
  // scan, so a change of it is a new snapshot and re-publishes like a device change.
  pci::VfioNodeSet node_set = pci::VfioNodeSet::kLegacy;

  bool operator==(const DeviceSnapshot&) const = default;
};

// The (vendor, device) ids of every selected GPU and NVSwitch in `inventory`, whatever its driver: what the node's
// selection could advertise. The first name resolution of a process is made over these (NameResolver), so
// `inspect` and `serve` give the same names and binding a GPU later renames nothing.
using node::AdvertisableIds;

// The whole GPUs and NVSwitches of `node` the device plugin advertises (see BuildSnapshot).
DeviceSnapshot WholeDevicesOf(const node::Snapshot& node, const std::set<std::string>& remembered);

// Builds the snapshot from one scan (node::Build, then WholeDevicesOf). Only selected GPUs and NVSwitches are resources (a switch model under its
// own name, as a GPU model is); companions are never advertised on their own. A device is advertised once it
// has been seen on a vfio driver (now, or in `remembered`, the ids advertised by the previous snapshot) and for
// as long as it stays in sysfs, so an unbound one turns Unhealthy instead of vanishing. Healthy = vfio driver, group node present under <dev_root>/vfio (or, on
// an iommufd host, all its cdevs under <dev_root>/vfio/devices), config space readable with a vendor other
// than 0xffff, and the group viable.
DeviceSnapshot BuildSnapshot(const HostPaths& paths, const pci::Inventory& inventory,
                             const pci::Selection& selection, const names::NameResolver& names,
                             const std::set<std::string>& remembered);

// Ids of every device of every resource (the `remembered` input of the next build).
std::set<std::string> AdvertisedIds(const DeviceSnapshot& snapshot);

// Shared-NVSwitch mode: a healthy device `unusable` gives a reason for (Fabric Manager does not vouch for it:
// fabric::PartitionManager::Unusable) becomes Unhealthy with that reason; in the VM its CUDA would fail (error 802).
void MarkUnusable(DeviceSnapshot& snapshot, const std::function<std::string(const std::string& id)>& unusable);

// Sets `snapshot.node_set` and turns Unhealthy each healthy device that set gives no nodes for (iommufd: no cdev, or
// no /dev/iommu; legacy: no IOMMU group, or on an iommufd host no <dev_root>/vfio/<group>, which the node's health
// rule lets a cdev stand in for), with the reason: the kubelet must not schedule a VM on a device whose Allocate
// would fail or whose VM could not open what it is handed.
void ApplyNodeSet(DeviceSnapshot& snapshot, pci::VfioNodeSet set, const std::filesystem::path& dev_root);

// The config-space probe used for health (the rule itself lives in pci/vfio_health.h, shared with src/dra).
using pci::ReadConfigVendor;

}  // namespace vfio_agent::plugin
