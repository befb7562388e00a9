// Which of the discovered vGPUs a kubelet frontend (the device plugin's vGPU resources, the DRA driver's vGPU
// devices) serves, under which resource name, and why the others are not: one rule for both.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "vfio_gpu_agent/pci/inventory.h"
#include "vfio_gpu_agent/vgpu/discovery.h"

namespace vfio_agent::vgpu {

struct ServedMdev {
  const Mdev* mdev = nullptr;
  std::string resource_name;               // "nvidia.com/GRID_T4-1Q"
  const pci::Function* parent = nullptr;   // null when gone from the inventory
};

struct ServedVf {
  const SriovVgpu* vgpu = nullptr;
  std::string resource_name;               // "nvidia.com/NVIDIA_H200X-1-18C"
  const pci::Function* vf = nullptr;       // never null
  const pci::Function* pf = nullptr;       // null when gone from the inventory
};

struct ServedVgpus {
  std::vector<ServedMdev> mdevs;  // in discovery order
  std::vector<ServedVf> vfs;
  // Why a vGPU is not served (or the node serves none), one line each naming the device: unreadable devices,
  // SR-IOV types whose name is unknown, type names that give no valid resource name, a VF missing from the
  // inventory, both frameworks on one node. The frontends log them (and report them as events).
  std::vector<std::string> problems;
};

// `discovery` and `inventory` must outlive the result. `domain`: the resource names' ("nvidia.com").
ServedVgpus ServedVgpusOf(const Discovery& discovery, const pci::Inventory& inventory, std::string_view domain);

}  // namespace vfio_agent::vgpu
