#include "vgpu_claims.h"

#include "claims.h"

#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "vfio_gpu_agent/common/fs.h"
#include "vfio_gpu_agent/dra/device_names.h"
#include "vfio_gpu_agent/names/resource_names.h"

namespace vfio_agent::dra::internal {

absl::StatusOr<VgpuView> VgpuView::Discover(const HostPaths& paths, const pci::Inventory& inventory,
                                            vgpu::CatalogStore& catalog, std::string_view domain,
                                            std::string_view driver) {
  absl::StatusOr<vgpu::Discovery> discovery = vgpu::Discover(paths.sysfs_root, inventory, catalog);
  if (!discovery.ok()) return discovery.status();
  VgpuView view;
  view.vgpus_ = BuildVgpuDevices(paths, inventory, *discovery, nullptr, domain, driver, {}).vgpus;
  view.iommufd_ = fs::Exists(paths.dev_root / "iommu");
  return view;
}

const VgpuDevice* VgpuView::Find(const std::string& device_name) const {
  for (const VgpuDevice& vgpu : vgpus_) {
    if (vgpu.device.slice.name == device_name) return &vgpu;
  }
  return nullptr;
}

absl::StatusOr<const VgpuDevice*> VgpuView::Preparable(const std::string& device_name) const {
  absl::StatusOr<VgpuId> id = VgpuOfDevice(device_name);
  if (!id.ok()) return id.status();
  const std::string what = absl::StrCat("vGPU ", device_name, " (", id->mdev ? "mdev " : "VF ", id->id, ")");
  const VgpuDevice* vgpu = Find(device_name);
  if (vgpu == nullptr) return absl::NotFoundError(absl::StrCat(what, ": not on this node now"));
  if (!vgpu->device.healthy()) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": unhealthy: ", vgpu->device.unhealthy_reason));
  }
  return vgpu;
}

absl::Status VgpuView::AddDeviceNodes(const VgpuDevice& vgpu, pci::VfioBackend backend, std::string_view what,
                                      cdi::v1::ContainerEdits* edits) const {
  absl::StatusOr<std::vector<std::string>> nodes =
      pci::VfioBackendNodes(vgpu.mdev ? pci::VfioBackend::kLegacy : backend, vgpu.vfio_cdevs, vgpu.iommu_group,
                            iommufd_, what);
  if (!nodes.ok()) return nodes.status();
  AddCdiNodes(*nodes, edits);
  return absl::OkStatus();
}

void VgpuView::AddExtendedResourceEnv(const std::vector<std::string>& device_names,
                                      cdi::v1::ContainerEdits* edits) const {
  std::map<std::string, std::set<std::string>> ids_by_env;  // sorted, as Allocate sends them
  for (const std::string& name : device_names) {
    const VgpuDevice* vgpu = Find(name);
    if (vgpu == nullptr) continue;
    const std::string env = vgpu->mdev ? names::KubevirtMdevEnvName(vgpu->resource_name)
                                       : names::KubevirtEnvName(vgpu->resource_name);
    ids_by_env[env].insert(vgpu->id);
  }
  for (const auto& [env, ids] : ids_by_env) edits->add_env(absl::StrCat(env, "=", absl::StrJoin(ids, ",")));
}

absl::Status ClaimPreparer::AddVgpu(const kube::AllocationResult& result, const VgpuView& vgpus,
                                    pci::VfioBackend backend, const std::string& kind, cdi::v1::Spec& spec,
                                    PreparedClaim& prepared) const {
  absl::StatusOr<const VgpuDevice*> vgpu = vgpus.Preparable(result.device);
  if (!vgpu.ok()) return vgpu.status();
  for (const auto& [uid, other] : prepared_) {
    if (uid == prepared.uid) continue;
    for (const PreparedDevice& held : other.devices) {
      if (held.device == result.device) {
        return absl::FailedPreconditionError(absl::StrCat("vGPU ", result.device, " (", (*vgpu)->id,
                                                          ") is held by prepared claim ", other.namespace_name, "/",
                                                          other.name, " (", other.uid, ")"));
      }
    }
  }
  const std::string cdi_name = absl::StrCat(prepared.uid, "-", result.device);
  cdi::v1::Device* cdi_device = spec.add_devices();
  cdi_device->set_name(cdi_name);
  if (absl::Status nodes = vgpus.AddDeviceNodes(**vgpu, backend, absl::StrCat("vGPU ", result.device, " (", (*vgpu)->id, ")"),
                                               cdi_device->mutable_container_edits());
      !nodes.ok()) {
    return nodes;
  }
  prepared.devices.push_back({.request = result.request.substr(0, result.request.find('/')),
                              .pool = result.pool,
                              .device = result.device,
                              .bdf = (*vgpu)->mdev ? "" : (*vgpu)->id,
                              .mdev_uuid = (*vgpu)->mdev ? (*vgpu)->id : "",
                              .cdi_ids = {absl::StrCat(kind, "=", cdi_name)}});
  return absl::OkStatus();
}

}  // namespace vfio_agent::dra::internal
