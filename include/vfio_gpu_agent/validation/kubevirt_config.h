// What KubeVirt must permit for a node's GPUs: the permittedHostDevices.pciHostDevices entries, as Cozystack
// platform values or as a merge patch for a plain KubeVirt CR (`vfio-gpu-agent kubevirt-config`).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "vfio_gpu_agent/names/resource_names.h"
#include "vfio_gpu_agent/pci/inventory.h"
#include "vfio_gpu_agent/vgpu/discovery.h"

namespace vfio_agent::validation {

struct PermittedEntry {
  uint16_t vendor_id = 0;
  uint16_t device_id = 0;
  std::string resource_name;         // what the node advertises: "nvidia.com/GH100_H200_SXM_141GB"
  bool in_cozystack_defaults = false;  // Cozystack's default table has this selector with this name
  std::string cozystack_default_name;  // the table's name for this selector when it differs; "" otherwise
};

// "10DE:2335": upper case, as Cozystack's table writes selectors (KubeVirt compares them case-insensitively).
std::string PciVendorSelector(uint16_t vendor_id, uint16_t device_id);

// One entry per distinct id, in selector order, named by `names` exactly as the plugin names them.
std::vector<PermittedEntry> PermittedEntries(const std::vector<std::pair<uint16_t, uint16_t>>& ids,
                                             const names::NameResolver& names);

// Cozystack platform values: `gpu.permittedHostDevices.pciHostDevices` with only the entries missing from the
// default table (with gpu.replaceDefaults false Cozystack appends them to it); the others are named in comments.
std::string CozystackValuesYaml(const std::vector<PermittedEntry>& entries);

// A merge patch (`kubectl patch kubevirt ... --type merge --patch-file`) setting pciHostDevices to every entry.
std::string KubevirtMergePatchYaml(const std::vector<PermittedEntry>& entries);

// vm-vgpu (issue 19): one entry per vGPU resource a node advertises, in the form KubeVirt's code accepts for it
// (src/validation/vgpu_kubevirt_checks.cc names the functions read): an mdev type as a mediatedDevices entry
// {mdevNameSelector: the type's mdev_type/name, resourceName, externalResourceProvider: true}; an SR-IOV profile as
// a pciHostDevices entry {pciVendorSelector: its VFs' id, resourceName, externalResourceProvider: true} (profiles of
// one card share the selector, which KubeVirt does not match for external entries).
struct VgpuPermittedEntry {
  std::string resource_name;   // "nvidia.com/GRID_T4-1Q"
  std::string mdev_type_name;  // mdev: "GRID T4-1Q"; "" for an SR-IOV profile
  uint16_t vendor_id = 0;      // SR-IOV: the VFs' PCI id
  uint16_t device_id = 0;
};

// Sorted by resource name; a type whose name gives no valid resource name is left out (it is not advertised).
std::vector<VgpuPermittedEntry> VgpuPermittedEntries(const vgpu::Discovery& discovery, const pci::Inventory& inventory,
                                                     std::string_view domain);

// A merge patch with the mediatedDevices and pciHostDevices lists of `entries` (a list with no entry is left out,
// so the patch does not empty it).
std::string VgpuKubevirtMergePatchYaml(const std::vector<VgpuPermittedEntry>& entries);

}  // namespace vfio_agent::validation
