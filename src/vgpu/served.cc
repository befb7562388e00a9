#include "vfio_gpu_agent/vgpu/served.h"

#include "absl/strings/str_cat.h"
#include "vfio_gpu_agent/names/resource_names.h"

namespace vfio_agent::vgpu {

ServedVgpus ServedVgpusOf(const Discovery& discovery, const pci::Inventory& inventory, std::string_view domain) {
  ServedVgpus served;
  for (const DeviceError& error : discovery.errors) {
    served.problems.push_back(
        absl::StrCat(error.device.empty() ? "vGPU catalog" : error.device, ": ", error.status.message()));
  }
  for (const UnresolvedVgpu& vgpu : discovery.unresolved) {
    served.problems.push_back(absl::StrCat(vgpu.bdf, ": not advertised: ", vgpu.reason));
  }
  if (!discovery.framework.ok()) {
    served.problems.push_back(absl::StrCat("vGPUs not served: ", discovery.framework.status().message()));
    return served;
  }
  for (const Mdev& mdev : discovery.mdevs) {
    absl::StatusOr<std::string> name = names::VgpuResourceName(domain, mdev.type_name);
    if (!name.ok()) {
      served.problems.push_back(absl::StrCat(mdev.uuid, ": not advertised: ", name.status().message()));
      continue;
    }
    served.mdevs.push_back({.mdev = &mdev, .resource_name = *std::move(name), .parent = inventory.Find(mdev.parent_bdf)});
  }
  for (const SriovVgpu& vgpu : discovery.vgpus) {
    absl::StatusOr<std::string> name = names::VgpuResourceName(domain, vgpu.type_name);
    const pci::Function* fn = inventory.Find(vgpu.bdf);
    if (!name.ok() || fn == nullptr) {
      served.problems.push_back(absl::StrCat(vgpu.bdf, ": not advertised: ",
                                             name.ok() ? "not in the PCI inventory" : name.status().message()));
      continue;
    }
    served.vfs.push_back(
        {.vgpu = &vgpu, .resource_name = *std::move(name), .vf = fn, .pf = inventory.Find(vgpu.pf_bdf)});
  }
  return served;
}

}  // namespace vfio_agent::vgpu
