// The node's device model, below both kubelet frontends: every device the node offers (whole GPUs, NVSwitches,
// vGPUs of either framework) with its name, health, topology, IOMMU group and device nodes, built by one function
// from one scan. The device plugin (plugin::BuildSnapshot) and the DRA driver (dra::BuildDevices) derive what they
// serve from it, and `validate` and `run`'s readiness judge the node from it (ServedOf), so a GPU is named and judged
// the same way whoever looks.
//
// What a frontend remembers between scans (the device plugin keeps a GPU once seen on vfio; the DRA driver keeps a
// device gone from sysfs as unhealthy) is the frontend's policy and stays in its adapter.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "vfio_gpu_agent/common/host_paths.h"
#include "vfio_gpu_agent/names/resource_names.h"
#include "vfio_gpu_agent/pci/inventory.h"
#include "vfio_gpu_agent/pci/selection.h"
#include "vfio_gpu_agent/vgpu/discovery.h"

namespace vfio_agent::node {

enum class Kind {
  kGpu,        // a selected GPU, whatever its driver
  kNvSwitch,   // a selected NVSwitch (--nvswitches)
  kMdev,       // an mdev vGPU (id = its UUID, bdf = its parent)
  kSriovVgpu,  // an SR-IOV vGPU (id = bdf = its VF)
};
const char* KindName(Kind kind);  // "gpu", "nvswitch", "mdev", "sriov-vgpu"
inline bool IsVgpu(Kind kind) { return kind == Kind::kMdev || kind == Kind::kSriovVgpu; }

// The physical GPU a device is on (itself for a GPU; the PF of an SR-IOV vGPU or of an Ampere mdev's VF).
struct Card {
  std::string bdf;
  uint16_t vendor_id = 0;
  uint16_t device_id = 0;
  std::optional<int> numa_node;
  bool operator==(const Card&) const = default;
};

struct Device {
  Kind kind = Kind::kGpu;
  std::string id;             // BDF (GPU, NVSwitch, SR-IOV vGPU) or mdev UUID: stable across restarts
  std::string bdf;            // the PCI function: itself, or an mdev's parent
  std::string driver;         // of `bdf` now ("" unbound)
  std::string resource_name;  // "nvidia.com/GH100_H200_SXM_141GB", "nvidia.com/GRID_T4-1Q"
  std::string name;           // the name part of resource_name
  std::string vgpu_type;      // vGPUs: "GRID T4-1Q"; "" otherwise
  // "" when a VM could be given the device now (the vfio rule of pci/vfio_health.h, the vGPU rule of vgpu/health.h,
  // or with bind_on_prepare the rule of a GPU a claim would bind; Fabric Manager's Unusable over all of them).
  std::string unhealthy_reason;
  std::optional<int> numa_node;  // the function's own (an mdev's parent's); nullopt = no topology, never node 0
  std::optional<Card> card;      // nullopt when the card is gone from the scan
  std::string pcie_root;         // "pci0000:00"; "" when it cannot be resolved
  std::optional<int> iommu_group;
  // GPUs and NVSwitches: the vendor functions of the group (GPUs, NVSwitches, companions), sorted; vGPUs: the id.
  std::vector<std::string> group_functions;
  std::vector<std::string> group_peers;  // an NVSwitch's fellow switches in its group, sorted
  std::vector<std::string> vfio_cdevs;   // the function's iommufd cdevs ("vfio3"), sorted; none for an mdev
  std::vector<std::string> partitions;   // Fabric Manager partitions holding the GPU (Fabric::Partitions)

  bool healthy() const { return unhealthy_reason.empty(); }
  bool operator==(const Device&) const = default;
};

struct Snapshot {
  std::vector<Device> devices;  // sorted by (kind, id)
  bool iommufd = false;         // <dev_root>/iommu exists
  // vm-vgpu scans: why a vGPU is not offered, one line each naming the device (vgpu::ServedVgpus::problems), and the
  // node's framework (an error when it has both).
  std::vector<std::string> vgpu_problems;
  std::optional<absl::StatusOr<vgpu::Framework>> vgpu_framework;

  const Device* Find(std::string_view id) const;
  bool operator==(const Snapshot&) const = default;
};

// A device as a frontend serves it (or as the daemon's own scan says it should be served), under the resource name
// the device plugin would advertise it.
struct ServedDevice {
  std::string resource_name;     // "nvidia.com/GH100_H200_SXM_141GB"
  std::string id;                // BDF, or an mdev vGPU's UUID
  bool healthy = false;
  std::string unhealthy_reason;  // "" when healthy
  bool operator==(const ServedDevice&) const = default;
};
// Sorted by (resource_name, id).
using ServedDevices = std::vector<ServedDevice>;

// Which whole GPUs and NVSwitches of a scan are served (ServedOf).
enum class WholeDevices {
  // Only those on a vfio driver now: what `validate`, which remembers no earlier scan, expects the device plugin to
  // list (it advertises a device once seen on vfio).
  kOnVfio,
  // Every one, whatever its driver: the serving agent binds every selected device, and its device plugin keeps one
  // it has seen on vfio, Unhealthy when it leaves (the daemon's pass).
  kEverySelected,
};

// What the node serves from `snapshot`, device by device under its resource name, with the model's health: a vm-vgpu
// scan's (one built with a discovery) vGPUs, any other scan's GPUs and NVSwitches as `whole` says. The kubelet's,
// the device plugin's and KubeVirt's checks judge the node by this, as the daemon does, so that `validate` and the
// serving agent expect the same devices, names and health of one scan.
ServedDevices ServedOf(const Snapshot& snapshot, WholeDevices whole);

// `served` by resource name, each resource's devices in the order `served` holds them.
std::map<std::string, ServedDevices> ByResource(const ServedDevices& served);

// What Fabric Manager says of a GPU (shared-NVSwitch mode), asked without knowing how FM is driven.
class Fabric {
 public:
  virtual ~Fabric() = default;
  virtual std::string Unusable(const std::string& bdf) const = 0;  // "" when FM vouches for it
  virtual std::vector<std::string> Partitions(const std::string& bdf) const = 0;
};

struct BuildOptions {
  // GPUs off vfio are healthy when a claim could bind them (DRA's --bind-on-prepare).
  bool bind_on_prepare = false;
  const Fabric* fabric = nullptr;
};

// Every selected GPU and NVSwitch of one scan, and with `vgpus` (a discovery over the same inventory) every vGPU the
// node serves. Names are resolved over every selected GPU and NVSwitch, whatever its driver, so that no name
// depends on which are bound.
Snapshot Build(const HostPaths& paths, const pci::Inventory& inventory, const pci::Selection& selection,
               const names::NameResolver& names, const vgpu::Discovery* vgpus, const BuildOptions& options = {});

// The (vendor, device) ids of every selected GPU and NVSwitch: what the node could ever offer whole.
std::vector<std::pair<uint16_t, uint16_t>> AdvertisableIds(const pci::Inventory& inventory,
                                                           const pci::Selection& selection);

// "pci0000:00" for a device whose sysfs path is .../devices/pci0000:00/.../<bdf>; "" when it cannot be resolved.
std::string PcieRoot(const HostPaths& paths, const std::string& bdf);

// The health of a GPU a claim would bind (--bind-on-prepare): on vfio, the vfio rule; on a host driver, its group
// must be bindable and its config space readable (not read in D3cold, which a read would wake).
std::string BindableUnhealthyReason(const HostPaths& paths, const pci::Function& fn,
                                    const pci::GroupAssessment* group, bool iommufd);

}  // namespace vfio_agent::node
