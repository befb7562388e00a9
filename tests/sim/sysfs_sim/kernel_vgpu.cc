// The simulated kernel's SR-IOV and vGPU attributes: sriov_numvfs (PCI core), mdev create/remove (mdev core
// and NVIDIA's vendor module) and nvidia/current_vgpu_type (NVIDIA's vendor-specific VFIO framework).
#include <algorithm>
#include <cerrno>
#include <cstdio>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernel.h"
#include "vgpu.h"

namespace vfio_agent::sim {
namespace {

// The BDF of VF `index`: the PF's routing id (bus << 8 | devfn) + offset + index * stride.
std::string VfBdf(const DeviceSpec& pf, int index) {
  unsigned domain = 0, bus = 0, slot = 0, function = 0;
  std::sscanf(pf.bdf.c_str(), "%x:%x:%x.%x", &domain, &bus, &slot, &function);
  const unsigned rid = (bus << 8 | slot << 3 | function) + static_cast<unsigned>(pf.sriov_vf_offset + index * pf.sriov_vf_stride);
  return absl::StrFormat("%04x:%02x:%02x.%x", domain, rid >> 8 & 0xff, rid >> 3 & 0x1f, rid & 0x7);
}

}  // namespace

// sriov_numvfs_store(): kstrtou16 (EINVAL), above sriov_totalvfs (ERANGE), the current count (no-op), no
// driver or one without sriov_configure (ENOENT; vfio-pci's needs enable_sriov, off by default), 0 disables,
// enabling while enabled is EBUSY. Disabling while a VF's vfio group is open fails with EBUSY here; the real
// kernel blocks in vfio_unregister_group_dev() until the VM lets go.
int Kernel::SriovNumvfs(const std::string& bdf, absl::string_view data) {
  DeviceState* pf = state_.FindPresent(bdf);
  unsigned long count = 0;
  int err = 0;
  if (!pf) {
    err = ENODEV;
  } else if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(data), &count) || count > 0xffff) {
    err = EINVAL;
  } else if (count > static_cast<unsigned long>(pf->spec.sriov_totalvfs)) {
    err = ERANGE;
  } else {
    std::vector<DeviceState*> vfs;
    for (auto& dev : state_.devices) {
      if (dev.present && dev.spec.physfn == bdf) vfs.push_back(&dev);
    }
    if (count == vfs.size()) {
      err = 0;
    } else if (pf->driver.empty() || IsVfioDriver(pf->driver)) {
      err = ENOENT;
    } else if (count == 0) {
      const bool held = std::any_of(vfs.begin(), vfs.end(), [&](const DeviceState* vf) {
        return (vf->vfio_index >= 0 && GroupOpen(vf->spec.iommu_group)) ||
               std::any_of(state_.mdevs.begin(), state_.mdevs.end(), [&](const MdevState& m) {
                 return m.parent == vf->spec.bdf && GroupOpen(m.iommu_group);
               });
      });
      if (held) {
        err = EBUSY;
      } else {
        for (DeviceState* vf : vfs) RemoveDevice(*vf);
      }
    } else if (!vfs.empty()) {
      err = EBUSY;
    } else {
      err = EnableVfs(*pf, static_cast<int>(count));
    }
  }
  Log(WithErrno(absl::StrCat("sriov_numvfs ", bdf, " ", absl::StripAsciiWhitespace(data)), err));
  return err;
}

// pci_iov_add_virtfn() per VF: same ids, class and NUMA node as the PF, on the PF's bus, a new IOMMU group
// each; then probed by its driver (sriov_drivers_autoprobe is 1).
int Kernel::EnableVfs(DeviceState& pf, int count) {
  for (int i = 0; i < count; ++i) {
    const std::string bdf = VfBdf(pf.spec, i);
    DeviceState* vf = state_.Find(bdf);
    if (vf && (vf->present || vf->spec.physfn != pf.spec.bdf)) return EBUSY;  // the routing id is taken
    if (!vf) vf = &state_.devices.emplace_back();
    *vf = DeviceState{};
    DeviceSpec& s = vf->spec;
    s.bdf = bdf;
    s.vendor = pf.spec.vendor;
    s.device = pf.spec.device;
    s.subsystem_vendor = pf.spec.subsystem_vendor;
    s.subsystem_device = pf.spec.subsystem_device;
    s.class_code = pf.spec.class_code;
    s.revision = pf.spec.revision;
    s.numa_node = pf.spec.numa_node;
    s.parent = pf.spec.parent;
    s.physfn = pf.spec.bdf;
    s.default_driver = pf.spec.default_driver;
    s.reset_method = "flr";
    s.iommu_group = state_.iommu ? AllocateIommuGroup(state_) : -1;
    vf->power_state = "D0";
    vf->created_vf = true;
    if (state_.HasDriver(s.default_driver)) Probe(s.default_driver, *vf);
  }
  return 0;
}

// create_store(): 36 or 37 bytes (a trailing newline) holding a UUID (EINVAL), then mdev_device_create():
// a UUID already in use on any parent is EEXIST, no instance left is EUSERS (what the mdev core returns when
// the type's count is exhausted; NVIDIA's module does not document its own errno for this case).
int Kernel::MdevCreate(const std::string& key, absl::string_view data) {
  const std::string parent_bdf = key.substr(0, key.find('/'));
  const std::string type_id = key.substr(key.find('/') + 1);
  const std::string uuid = data.size() == 36 || data.size() == 37 ? ParseUuid(std::string(data.substr(0, 36))) : "";
  DeviceState* parent = state_.FindPresent(parent_bdf);
  const DeviceState* card = parent ? CardOf(state_, *parent) : nullptr;
  const VgpuTypeSpec* type = nullptr;
  if (card) {
    for (const VgpuTypeSpec& t : card->spec.vgpu.types) type = t.id == type_id ? &t : type;
  }
  int err = 0;
  if (!parent || !type || !IsMdevParent(state_, *parent)) {
    err = ENODEV;
  } else if (uuid.empty()) {
    err = EINVAL;
  } else if (std::any_of(state_.mdevs.begin(), state_.mdevs.end(), [&](const MdevState& m) { return m.uuid == uuid; })) {
    err = EEXIST;
  } else if (AvailableInstances(state_, *parent, *type) == 0) {
    err = EUSERS;
  } else {
    state_.mdevs.push_back({uuid, parent_bdf, type_id, AllocateIommuGroup(state_)});
  }
  Log(WithErrno(absl::StrCat("mdev-create ", parent_bdf, " ", type_id, " ",
                             uuid.empty() ? absl::StripTrailingAsciiWhitespace(data) : uuid),
                err));
  return err;
}

// remove_store(): kstrtoul (EINVAL), 0 does nothing. While the mdev's group is open NVIDIA's module refuses
// with EBUSY (current kernels instead block in vfio_unregister_group_dev() until the VM closes it).
int Kernel::MdevRemove(const std::string& uuid, absl::string_view data) {
  unsigned long flag = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(data), &flag)) return EINVAL;
  if (flag == 0) return 0;
  auto it = std::find_if(state_.mdevs.begin(), state_.mdevs.end(), [&](const MdevState& m) { return m.uuid == uuid; });
  if (it == state_.mdevs.end()) return ENODEV;
  const int err = GroupOpen(it->iommu_group) ? EBUSY : 0;
  if (!err) state_.mdevs.erase(it);
  Log(WithErrno("mdev-remove " + uuid, err));
  return err;
}

// nvidia/current_vgpu_type: any write while the VF's vfio group is open is EBUSY; 0 deletes the vGPU; another
// id needs a VF without a type (EBUSY) and must be in the VF's creatable list now (EINVAL).
int Kernel::CurrentVgpuType(const std::string& bdf, absl::string_view data) {
  DeviceState* vf = state_.FindPresent(bdf);
  int type = 0;
  int err = 0;
  if (!vf || !HasSriovVgpuFiles(state_, *vf)) {
    err = ENODEV;
  } else if (!absl::SimpleAtoi(absl::StripTrailingAsciiWhitespace(data), &type) || type < 0) {
    err = EINVAL;
  } else if (vf->vgpu_type != 0 && (type != 0 || GroupOpen(vf->spec.iommu_group))) {
    err = EBUSY;  // a VF keeps its type until 0 is written, and while a VM holds it even then
  } else if (type == 0) {
    vf->vgpu_type = 0;
    vf->vfio_index = -1;
  } else {
    const auto creatable = CreatableTypes(state_, *vf);
    const bool listed = std::any_of(creatable.begin(), creatable.end(),
                                    [&](const VgpuTypeSpec* t) { return t->id == std::to_string(type); });
    if (listed) {
      vf->vgpu_type = type;
      vf->vfio_index = LowestFreeVfioIndex(*vf);
    } else {
      err = EINVAL;
    }
  }
  Log(WithErrno(absl::StrCat("vgpu-type ", bdf, " ", absl::StripTrailingAsciiWhitespace(data)), err));
  return err;
}

}  // namespace vfio_agent::sim
