#include "vfio_gpu_agent/node/snapshot.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "vfio_gpu_agent/common/fs.h"
#include "vfio_gpu_agent/pci/vfio_health.h"
#include "vfio_gpu_agent/vgpu/health.h"
#include "vfio_gpu_agent/vgpu/served.h"

namespace vfio_agent::node {
namespace {

bool IsOfferedRole(pci::Role role) { return role == pci::Role::kGpu || role == pci::Role::kNvSwitch; }

std::string NamePart(const std::string& resource_name) { return resource_name.substr(resource_name.find('/') + 1); }

Card CardOf(const pci::Function& fn) {
  return {.bdf = fn.bdf, .vendor_id = fn.vendor_id, .device_id = fn.device_id, .numa_node = fn.numa_node};
}

std::vector<std::string> Sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

void AddWholeDevices(const HostPaths& paths, const pci::Inventory& inventory, const pci::Selection& selection,
                     const names::NameResolver& names, const BuildOptions& options, Snapshot& snapshot) {
  // Over every selected GPU and switch, not only the bound ones: names must not depend on which are on vfio.
  const std::map<uint32_t, names::ResolvedName> resolved = names.Resolve(AdvertisableIds(inventory, selection));
  for (const std::string& bdf : selection.gpus) {
    const pci::Role role = selection.RoleOf(bdf);
    if (!IsOfferedRole(role)) continue;
    const pci::Function* fn = inventory.Find(bdf);
    if (fn == nullptr) continue;
    auto name = resolved.find(names::NameKey(fn->vendor_id, fn->device_id));
    if (name == resolved.end()) continue;  // the resolver answers every id it is given
    const pci::GroupAssessment* group = selection.GroupOf(*fn);
    Device device{.kind = role == pci::Role::kNvSwitch ? Kind::kNvSwitch : Kind::kGpu,
                  .id = fn->bdf,
                  .bdf = fn->bdf,
                  .driver = fn->driver,
                  .resource_name = name->second.resource_name,
                  .name = name->second.name};
    device.unhealthy_reason = options.bind_on_prepare && role == pci::Role::kGpu
                                  ? BindableUnhealthyReason(paths, *fn, group, snapshot.iommufd)
                                  : pci::VfioUnhealthyReason(paths, *fn, group, snapshot.iommufd);
    device.numa_node = fn->numa_node;
    device.card = CardOf(*fn);
    device.pcie_root = PcieRoot(paths, fn->bdf);
    device.iommu_group = fn->iommu_group;
    if (group != nullptr) {
      for (const pci::Member& member : group->members) {
        if (IsOfferedRole(member.role) || member.role == pci::Role::kCompanion) {
          device.group_functions.push_back(member.bdf);
        }
        if (device.kind == Kind::kNvSwitch && member.role == pci::Role::kNvSwitch && member.bdf != fn->bdf) {
          device.group_peers.push_back(member.bdf);
        }
      }
    }
    device.vfio_cdevs = Sorted(fn->vfio_cdevs);
    snapshot.devices.push_back(std::move(device));
  }
}

void AddVgpus(const HostPaths& paths, const pci::Inventory& inventory, const vgpu::Discovery& discovery,
              const names::NameResolver& names, Snapshot& snapshot) {
  vgpu::ServedVgpus served = vgpu::ServedVgpusOf(discovery, inventory, names.domain());
  snapshot.vgpu_problems = std::move(served.problems);
  snapshot.vgpu_framework = discovery.framework;
  for (const vgpu::ServedMdev& entry : served.mdevs) {
    const vgpu::Mdev& mdev = *entry.mdev;
    Device device{.kind = Kind::kMdev,
                  .id = mdev.uuid,
                  .bdf = mdev.parent_bdf,
                  .driver = entry.parent != nullptr ? entry.parent->driver : "",
                  .resource_name = entry.resource_name,
                  .name = NamePart(entry.resource_name),
                  .vgpu_type = mdev.type_name,
                  .unhealthy_reason = vgpu::MdevUnhealthyReason(paths, mdev, entry.parent)};
    device.numa_node = entry.parent != nullptr ? entry.parent->numa_node : std::nullopt;
    // An Ampere mdev lives on a VF: the card is its PF.
    const pci::Function* card = entry.parent;
    if (card != nullptr && card->physfn) {
      if (const pci::Function* pf = inventory.Find(*card->physfn)) card = pf;
    }
    if (card != nullptr) device.card = CardOf(*card);
    device.pcie_root = PcieRoot(paths, mdev.parent_bdf);
    device.iommu_group = mdev.iommu_group;
    device.group_functions = {mdev.uuid};
    snapshot.devices.push_back(std::move(device));
  }
  for (const vgpu::ServedVf& entry : served.vfs) {
    const pci::Function& fn = *entry.vf;
    Device device{.kind = Kind::kSriovVgpu,
                  .id = fn.bdf,
                  .bdf = fn.bdf,
                  .driver = fn.driver,
                  .resource_name = entry.resource_name,
                  .name = NamePart(entry.resource_name),
                  .vgpu_type = entry.vgpu->type_name,
                  .unhealthy_reason = vgpu::VfUnhealthyReason(paths, fn, snapshot.iommufd)};
    device.numa_node = entry.pf != nullptr ? entry.pf->numa_node : fn.numa_node;
    device.card = CardOf(entry.pf != nullptr ? *entry.pf : fn);
    device.pcie_root = PcieRoot(paths, fn.bdf);
    device.iommu_group = fn.iommu_group;
    device.group_functions = {fn.bdf};
    device.vfio_cdevs = Sorted(fn.vfio_cdevs);
    snapshot.devices.push_back(std::move(device));
  }
}

}  // namespace

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kGpu: return "gpu";
    case Kind::kNvSwitch: return "nvswitch";
    case Kind::kMdev: return "mdev";
    case Kind::kSriovVgpu: return "sriov-vgpu";
  }
  return "?";
}

const Device* Snapshot::Find(std::string_view id) const {
  for (const Device& device : devices) {
    if (device.id == id) return &device;
  }
  return nullptr;
}

std::vector<std::pair<uint16_t, uint16_t>> AdvertisableIds(const pci::Inventory& inventory,
                                                           const pci::Selection& selection) {
  std::vector<std::pair<uint16_t, uint16_t>> ids;
  for (const std::string& bdf : selection.gpus) {
    if (!IsOfferedRole(selection.RoleOf(bdf))) continue;
    if (const pci::Function* fn = inventory.Find(bdf)) ids.emplace_back(fn->vendor_id, fn->device_id);
  }
  return ids;
}

std::string PcieRoot(const HostPaths& paths, const std::string& bdf) {
  std::error_code ec;
  const std::filesystem::path real = std::filesystem::canonical(paths.PciDevice(bdf), ec);
  if (ec) return "";
  for (const std::filesystem::path& part : real) {
    if (part.string().starts_with("pci")) return part.string();
  }
  return "";
}

std::string BindableUnhealthyReason(const HostPaths& paths, const pci::Function& fn,
                                    const pci::GroupAssessment* group, bool iommufd) {
  if (pci::IsVfioDriver(fn.driver)) return pci::VfioUnhealthyReason(paths, fn, group, iommufd);
  if (!fn.iommu_group) return "no IOMMU group";
  if (group == nullptr || !group->usable) {
    std::string reason = absl::StrCat("IOMMU group ", *fn.iommu_group, " cannot be bound to vfio-pci");
    if (group != nullptr && !group->blockers.empty()) absl::StrAppend(&reason, ": ", group->blockers.front());
    return reason;
  }
  // A host driver's runtime PM may park it in D3cold; a config read would wake it on every rescan.
  absl::StatusOr<std::string> power = fs::ReadTrimmed(paths.PciDevice(fn.bdf) / "power_state");
  if (power.ok() && *power == "D3cold") return "";
  absl::StatusOr<uint16_t> vendor = pci::ReadConfigVendor(paths, fn.bdf);
  if (!vendor.ok()) return absl::StrCat("config space unreadable: ", vendor.status().message());
  if (*vendor == 0xffff) return "config space reads 0xffff (device off the bus)";
  return "";
}

Snapshot Build(const HostPaths& paths, const pci::Inventory& inventory, const pci::Selection& selection,
               const names::NameResolver& names, const vgpu::Discovery* vgpus, const BuildOptions& options) {
  Snapshot snapshot;
  snapshot.iommufd = fs::Exists(paths.dev_root / "iommu");
  AddWholeDevices(paths, inventory, selection, names, options, snapshot);
  if (vgpus != nullptr) AddVgpus(paths, inventory, *vgpus, names, snapshot);
  if (options.fabric != nullptr) {
    for (Device& device : snapshot.devices) {
      if (device.kind != Kind::kGpu) continue;
      device.partitions = options.fabric->Partitions(device.bdf);
      if (!device.healthy()) continue;
      device.unhealthy_reason = options.fabric->Unusable(device.bdf);
    }
  }
  std::sort(snapshot.devices.begin(), snapshot.devices.end(), [](const Device& a, const Device& b) {
    return std::tie(a.kind, a.id) < std::tie(b.kind, b.id);
  });
  return snapshot;
}

ServedDevices ServedOf(const Snapshot& snapshot, WholeDevices whole) {
  const bool vgpu_scan = snapshot.vgpu_framework.has_value();
  ServedDevices out;
  for (const Device& device : snapshot.devices) {
    if (IsVgpu(device.kind) != vgpu_scan) continue;
    if (!vgpu_scan && whole == WholeDevices::kOnVfio && !pci::IsVfioDriver(device.driver)) continue;
    out.push_back({.resource_name = device.resource_name, .id = device.id, .healthy = device.healthy(),
                   .unhealthy_reason = device.unhealthy_reason});
  }
  std::sort(out.begin(), out.end(), [](const ServedDevice& a, const ServedDevice& b) {
    return std::tie(a.resource_name, a.id) < std::tie(b.resource_name, b.id);
  });
  return out;
}

std::map<std::string, ServedDevices> ByResource(const ServedDevices& served) {
  std::map<std::string, ServedDevices> out;
  for (const ServedDevice& device : served) out[device.resource_name].push_back(device);
  return out;
}

}  // namespace vfio_agent::node
