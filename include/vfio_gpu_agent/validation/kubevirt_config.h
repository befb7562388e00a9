// What KubeVirt must permit for a node's GPUs: the permittedHostDevices.pciHostDevices entries, as Cozystack
// platform values or as a merge patch for a plain KubeVirt CR (`vfio-gpu-agent kubevirt-config`).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "vfio_gpu_agent/names/resource_names.h"

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

}  // namespace vfio_agent::validation
