// The DRA driver's device model: one device per GPU the selection manages, named from its PCI address
// (device_names.h), with the attributes a DeviceClass selects on and the health both kubelet-facing outputs carry
// (the DRAResourceHealth stream and a NoSchedule taint in the ResourceSlice). Built from the layers below only.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "vfio_gpu_agent/common/host_paths.h"
#include "vfio_gpu_agent/dra/attributes.h"
#include "vfio_gpu_agent/kube/resource_slices.h"
#include "vfio_gpu_agent/names/resource_names.h"
#include "vfio_gpu_agent/node/snapshot.h"
#include "vfio_gpu_agent/pci/inventory.h"
#include "vfio_gpu_agent/pci/selection.h"

namespace vfio_agent::dra {

// The taint an unhealthy GPU carries ("<driver>/unhealthy", effect NoSchedule: a running VM is never evicted).
inline constexpr std::string_view kUnhealthyTaint = "unhealthy";

struct GpuDevice {
  std::string bdf;
  std::string unhealthy_reason;  // "" when healthy; "driver nvidia", "no /dev/vfio/73", "gone from sysfs", ...
  kube::SliceDevice slice;       // name, attributes, and the taint while unhealthy
  bool healthy() const { return unhealthy_reason.empty(); }
  bool operator==(const GpuDevice&) const = default;
};

// One device per selected GPU (role kGpu) in `inventory`, by name. resourceName is the name part `names` gives the
// model (pinned, overridden or from pci.ids, as the device plugin registers it); productName is pci.ids' own text
// (`pci_ids` may be null: then there is none). A device of `previous` that is gone from sysfs
// stays, unhealthy ("gone from sysfs"), with its last attributes, until it is back: a pod holding it then sees
// Unhealthy, not Unknown, and the scheduler does not pick it. With `bind_on_prepare` a GPU on its host driver is
// healthy when a Prepare could bind it (DriverOptions::bind_on_prepare).
// The GPUs of `node` (a model of the scan `inventory`), with the devices of `previous` gone from it kept as above.
std::vector<GpuDevice> GpusOf(const node::Snapshot& node, const pci::Inventory& inventory,
                              const names::PciIdsDatabase* pci_ids, std::string_view driver,
                              const std::vector<GpuDevice>& previous);
// node::Build (with `bind_on_prepare`), then GpusOf.
std::vector<GpuDevice> BuildDevices(const HostPaths& paths, const pci::Inventory& inventory,
                                    const pci::Selection& selection, const names::NameResolver& names,
                                    const names::PciIdsDatabase* pci_ids, std::string_view driver,
                                    const std::vector<GpuDevice>& previous, bool bind_on_prepare = false);

// "<driver>/<attribute>": this driver's own attribute names as the slice carries them.
std::string Qualified(std::string_view driver, std::string_view attribute);
// The NoSchedule taint of an unhealthy device.
kube::DeviceTaint UnhealthyTaint(std::string_view driver);
// pci.ids' product name cut to the longest attribute string the API takes; nullopt without one.
std::optional<std::string> ProductName(const names::PciIdsDatabase* pci_ids, uint16_t vendor_id, uint16_t device_id);

using node::PcieRoot;

}  // namespace vfio_agent::dra
