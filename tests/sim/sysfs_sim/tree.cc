#include "tree.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "vgpu.h"

namespace vfio_agent::sim {
namespace {

std::string Parent(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == 0 ? "/" : path.substr(0, slash);
}

class Builder {
 public:
  Builder() { tree_["/"] = Entry{}; }

  void Dir(const std::string& path) {
    if (tree_.count(path)) return;
    Dir(Parent(path));
    Insert(path, Entry{});
  }
  void File(const std::string& path, std::string content, uint32_t mode, Attr attr = Attr::kNone,
            std::string key = "") {
    Entry e;
    e.type = Entry::Type::kFile;
    e.mode = mode;
    e.content = std::move(content);
    e.attr = attr;
    e.key = std::move(key);
    Add(path, std::move(e));
  }
  void Link(const std::string& path, const std::string& target) {
    Entry e;
    e.type = Entry::Type::kLink;
    e.mode = 0777;
    e.content = RelativeLink(Parent(path), target);
    Add(path, std::move(e));
  }
  void Add(const std::string& path, Entry e) {
    Dir(Parent(path));
    Insert(path, std::move(e));
  }
  std::shared_ptr<const Tree> Finish() {
    for (auto& [path, e] : tree_) std::sort(e.children.begin(), e.children.end());
    return std::make_shared<const Tree>(std::move(tree_));
  }

 private:
  void Insert(const std::string& path, Entry e) {
    auto [it, inserted] = tree_.insert_or_assign(path, std::move(e));
    if (inserted && path != "/") tree_[Parent(path)].children.push_back(path.substr(path.rfind('/') + 1));
  }
  Tree tree_;
};

std::string Hex16(uint16_t v) { return absl::StrFormat("0x%04x\n", v); }

std::string DevicePath(const KernelState& state, const DeviceState& dev) {
  std::vector<std::string> chain{dev.spec.bdf};
  for (const DeviceState* p = &dev; !p->spec.parent.empty();) {
    p = state.Find(p->spec.parent);
    chain.push_back(p->spec.bdf);
  }
  std::reverse(chain.begin(), chain.end());
  return absl::StrCat("/devices/pci", chain.front().substr(0, 7), "/", absl::StrJoin(chain, "/"));
}

std::string Modalias(const DeviceSpec& s) {
  return absl::StrFormat("pci:v%08Xd%08Xsv%08Xsd%08Xbc%02Xsc%02Xi%02X", s.vendor, s.device, s.subsystem_vendor,
                         s.subsystem_device, s.class_code >> 16, (s.class_code >> 8) & 0xff, s.class_code & 0xff);
}

std::string Uevent(const DeviceState& dev) {
  const DeviceSpec& s = dev.spec;
  std::string out = dev.driver.empty() ? "" : absl::StrCat("DRIVER=", dev.driver, "\n");
  absl::StrAppendFormat(&out, "PCI_CLASS=%X\nPCI_ID=%04X:%04X\nPCI_SUBSYS_ID=%04X:%04X\nPCI_SLOT_NAME=%s\nMODALIAS=%s\n",
                        s.class_code, s.vendor, s.device, s.subsystem_vendor, s.subsystem_device, s.bdf, Modalias(s));
  return out;
}

std::string ModuleName(absl::string_view driver) {
  std::string name(driver);
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

// Built into every distribution kernel: no /sys/module entry to show.
bool IsBuiltin(absl::string_view driver) { return driver == "pcieport"; }

// `resource`: "start end flags" for BARs 0-5, the ROM and the six SR-IOV BARs. Assigned BARs get addresses in
// BDF order (64-bit ones above 4 GiB); an unassigned one keeps its size with start 0, as the PCI core leaves it.
std::string ResourceFile(const KernelState& state, const DeviceState& dev) {
  constexpr uint64_t kMem = 0x200, kPrefetch = 0x2000, kSizeAlign = 0x40000, kMem64 = 0x100000;
  uint64_t next32 = 0xc0000000, next64 = 0x200000000000;
  struct Line {
    uint64_t start = 0, end = 0, flags = 0;
  };
  std::vector<Line> lines(13);
  for (const auto& d : state.devices) {
    if (!d.present) continue;
    for (const BarSpec& bar : d.spec.bars) {
      uint64_t& next = bar.is_64bit ? next64 : next32;
      Line line;
      line.flags = kMem | kSizeAlign | (bar.prefetchable ? kPrefetch | 0x8 : 0) | (bar.is_64bit ? kMem64 | 0x4 : 0);
      if (bar.unassigned) {
        line.end = bar.size - 1;
      } else {
        next = (next + bar.size - 1) & ~(bar.size - 1);
        line.start = next;
        line.end = next + bar.size - 1;
        next += bar.size;
      }
      if (&d == &dev) lines[bar.index] = line;
    }
  }
  std::string out;
  for (const Line& l : lines) absl::StrAppendFormat(&out, "0x%016x 0x%016x 0x%016x\n", l.start, l.end, l.flags);
  return out;
}

void AddMdev(Builder& b, const MdevState& mdev, const std::string& parent_dir) {
  const std::string dir = parent_dir + "/" + mdev.uuid;
  const std::string type_dir = parent_dir + "/mdev_supported_types/" + mdev.type_id;
  const std::string group = absl::StrCat("/kernel/iommu_groups/", mdev.iommu_group);
  b.Dir(dir);
  b.Link(dir + "/mdev_type", type_dir);
  b.Link(dir + "/iommu_group", group);
  b.Link(dir + "/driver", absl::StrCat("/bus/mdev/drivers/", kMdevDriver));
  b.Link(dir + "/subsystem", "/bus/mdev");
  b.File(dir + "/remove", "", 0200, Attr::kMdevRemove, mdev.uuid);
  b.File(dir + "/uevent", absl::StrCat("DRIVER=", kMdevDriver, "\nMDEV_TYPE=", mdev.type_id, "\n"), 0644);
  b.Link(type_dir + "/devices/" + mdev.uuid, dir);
  b.Link("/bus/mdev/devices/" + mdev.uuid, dir);
  b.Link(absl::StrCat("/bus/mdev/drivers/", kMdevDriver, "/", mdev.uuid), dir);
  b.File(group + "/type", "DMA\n", 0644);
  b.Link(group + "/devices/" + mdev.uuid, dir);
}

// The vGPU manager's files: mdev types and instances on an mdev parent, nvidia/ attributes on an SR-IOV card.
void AddVgpu(Builder& b, const KernelState& state, const DeviceState& dev, const std::string& dir) {
  if (IsMdevParent(state, dev)) {
    b.Link("/class/mdev_bus/" + dev.spec.bdf, dir);
    for (const VgpuTypeSpec& type : CardOf(state, dev)->spec.vgpu.types) {
      const std::string type_dir = dir + "/mdev_supported_types/" + type.id;
      b.Dir(type_dir + "/devices");
      b.File(type_dir + "/name", type.name + "\n", 0444);
      b.File(type_dir + "/available_instances", absl::StrCat(AvailableInstances(state, dev, type), "\n"), 0444);
      b.File(type_dir + "/device_api", "vfio-pci\n", 0444);
      b.File(type_dir + "/description", type.description + "\n", 0444);
      b.File(type_dir + "/create", "", 0200, Attr::kMdevCreate, absl::StrCat(dev.spec.bdf, "/", type.id));
    }
    for (const MdevState& mdev : state.mdevs) {
      if (mdev.parent == dev.spec.bdf) AddMdev(b, mdev, dir);
    }
  }
  if (HasSriovVgpuFiles(state, dev)) {
    b.File(dir + "/nvidia/creatable_vgpu_types", CreatableVgpuTypesText(CreatableTypes(state, dev)), 0444);
    if (!dev.spec.physfn.empty()) {
      b.File(dir + "/nvidia/current_vgpu_type", absl::StrCat(dev.vgpu_type, "\n"), 0644, Attr::kCurrentVgpuType,
             dev.spec.bdf);
    }
  }
}

void AddDevice(Builder& b, const KernelState& state, const DeviceState& dev) {
  const DeviceSpec& s = dev.spec;
  const std::string dir = DevicePath(state, dev);
  b.Dir(dir);
  b.File(dir + "/vendor", Hex16(s.vendor), 0444);
  b.File(dir + "/device", Hex16(s.device), 0444);
  b.File(dir + "/subsystem_vendor", Hex16(s.subsystem_vendor), 0444);
  b.File(dir + "/subsystem_device", Hex16(s.subsystem_device), 0444);
  b.File(dir + "/class", absl::StrFormat("0x%06x\n", s.class_code), 0444);
  b.File(dir + "/revision", absl::StrFormat("0x%02x\n", s.revision), 0444);
  b.File(dir + "/numa_node", absl::StrCat(s.numa_node, "\n"), 0644);
  b.File(dir + "/config", ConfigSpace(state, dev), 0644, Attr::kConfig, s.bdf);
  b.File(dir + "/modalias", Modalias(s) + "\n", 0444);
  b.File(dir + "/uevent", Uevent(dev), 0644);
  b.File(dir + "/driver_override", dev.driver_override.value_or("(null)") + "\n", 0644, Attr::kDriverOverride, s.bdf);
  b.File(dir + "/remove", "", 0200, Attr::kRemove, s.bdf);
  if (!s.reset_method.empty()) {  // the kernel hides both attributes from a device without a reset method
    b.File(dir + "/reset", "", 0200, Attr::kReset, s.bdf);
    b.File(dir + "/reset_method", s.reset_method + "\n", 0644);
  }
  b.File(dir + "/resource", ResourceFile(state, dev), 0444);
  b.File(dir + "/power_state", dev.power_state + "\n", 0444);
  b.File(dir + "/d3cold_allowed", s.d3cold_allowed ? "1\n" : "0\n", 0644);
  int vfs = 0;
  for (const auto& other : state.devices) vfs += other.present && other.spec.physfn == s.bdf;
  if (s.sriov_totalvfs > 0 || vfs > 0) {
    b.File(dir + "/sriov_totalvfs", absl::StrCat(std::max(s.sriov_totalvfs, vfs), "\n"), 0444);
    b.File(dir + "/sriov_numvfs", absl::StrCat(vfs, "\n"), 0644, Attr::kSriovNumvfs, s.bdf);
    b.File(dir + "/sriov_offset", absl::StrCat(s.sriov_vf_offset, "\n"), 0444);
    b.File(dir + "/sriov_stride", absl::StrCat(s.sriov_vf_stride, "\n"), 0444);
    b.File(dir + "/sriov_vf_device", absl::StrFormat("%04x\n", s.device), 0444);
  }
  if (s.mdev) {
    b.Dir(dir + "/mdev_supported_types");
    b.Link("/class/mdev_bus/" + s.bdf, dir);
  }
  AddVgpu(b, state, dev, dir);
  b.Link(dir + "/subsystem", "/bus/pci");
  if (!dev.driver.empty()) b.Link(dir + "/driver", "/bus/pci/drivers/" + dev.driver);
  if (state.iommu && s.iommu_group >= 0) {
    const std::string group = absl::StrCat("/kernel/iommu_groups/", s.iommu_group);
    b.Link(dir + "/iommu_group", group);
    b.Link(dir + "/iommu", "/devices/virtual/iommu/dmar0");
    b.File(group + "/type", "DMA\n", 0644);
    b.Link(group + "/devices/" + s.bdf, dir);
  }
  if (dev.vfio_index >= 0) {
    b.File(absl::StrCat(dir, "/vfio-dev/vfio", dev.vfio_index, "/dev"), absl::StrCat("511:", dev.vfio_index, "\n"), 0444);
  }
  if (!s.physfn.empty()) {
    if (const DeviceState* pf = state.Find(s.physfn); pf && pf->present) b.Link(dir + "/physfn", DevicePath(state, *pf));
  }
  int vf_number = 0;
  for (const auto& vf : state.devices) {
    if (vf.spec.physfn != s.bdf) continue;
    if (vf.present) b.Link(absl::StrCat(dir, "/virtfn", vf_number), DevicePath(state, vf));
    ++vf_number;
  }
  for (const auto& consumer_bdf : s.consumers) {
    const DeviceState* consumer = state.Find(consumer_bdf);
    if (!consumer || !consumer->present) continue;
    const std::string consumer_dir = DevicePath(state, *consumer);
    const std::string link = absl::StrCat("/devices/virtual/devlink/pci:", s.bdf, "--pci:", consumer_bdf);
    b.Link(absl::StrCat(link, "/supplier"), dir);
    b.Link(absl::StrCat(link, "/consumer"), consumer_dir);
    b.File(absl::StrCat(link, "/status"), "available\n", 0444);
    b.Link(absl::StrCat(dir, "/consumer:pci:", consumer_bdf), link);
    b.Link(absl::StrCat(consumer_dir, "/supplier:pci:", s.bdf), link);
  }
  b.Link("/bus/pci/devices/" + s.bdf, dir);
  if (!dev.driver.empty()) b.Link(absl::StrCat("/bus/pci/drivers/", dev.driver, "/", s.bdf), dir);
}

}  // namespace

std::string RelativeLink(const std::string& from_dir, const std::string& to) {
  std::vector<absl::string_view> from = absl::StrSplit(from_dir, '/', absl::SkipEmpty());
  std::vector<absl::string_view> target = absl::StrSplit(to, '/', absl::SkipEmpty());
  size_t common = 0;
  while (common < from.size() && common < target.size() && from[common] == target[common]) ++common;
  std::vector<absl::string_view> parts(from.size() - common, "..");
  parts.insert(parts.end(), target.begin() + static_cast<std::ptrdiff_t>(common), target.end());
  return absl::StrJoin(parts, "/");
}

std::string ConfigSpace(const KernelState& state, const DeviceState& dev) {
  if (dev.dead) return std::string(4096, '\xff');
  const DeviceSpec& s = dev.spec;
  std::string c(4096, '\0');
  auto put16 = [&c](size_t at, uint16_t v) {
    c[at] = static_cast<char>(v & 0xff);
    c[at + 1] = static_cast<char>(v >> 8);
  };
  put16(0x00, s.vendor);
  put16(0x02, s.device);
  c[0x08] = static_cast<char>(s.revision);
  c[0x09] = static_cast<char>(s.class_code & 0xff);
  c[0x0a] = static_cast<char>((s.class_code >> 8) & 0xff);
  c[0x0b] = static_cast<char>(s.class_code >> 16);
  c[0x0e] = static_cast<char>(s.header_type);
  if (s.IsBridge()) {
    auto bus_of = [](const std::string& bdf) { return std::stoi(bdf.substr(5, 2), nullptr, 16); };
    int own = bus_of(s.bdf), secondary = 0xff, subordinate = 0;
    for (const auto& d : state.devices) {
      for (const DeviceState* p = &d; !p->spec.parent.empty(); p = state.Find(p->spec.parent)) {
        if (p->spec.parent != s.bdf) continue;
        secondary = std::min(secondary, bus_of(d.spec.bdf));
        subordinate = std::max(subordinate, bus_of(d.spec.bdf));
      }
    }
    if (secondary == 0xff) secondary = subordinate = own + 1;
    c[0x18] = static_cast<char>(own);
    c[0x19] = static_cast<char>(secondary);
    c[0x1a] = static_cast<char>(subordinate);
  } else {
    put16(0x2c, s.subsystem_vendor);
    put16(0x2e, s.subsystem_device);
  }
  c[0x3d] = 1;  // INTA
  return c;
}

std::shared_ptr<const Tree> BuildTree(const KernelState& state) {
  Builder b;
  for (const char* dir : {"/devices", "/bus/pci/devices", "/bus/pci/drivers", "/kernel/iommu_groups", "/module",
                          "/class", "/.sim"}) {
    b.Dir(dir);
  }
  b.File("/bus/pci/drivers_probe", "", 0200, Attr::kDriversProbe);
  b.File("/bus/pci/drivers_autoprobe", "1\n", 0644);
  b.File("/bus/pci/rescan", "", 0200, Attr::kRescan);
  b.File("/.sim/control", "", 0200, Attr::kControl);
  Entry log;
  log.type = Entry::Type::kFile;
  log.mode = 0444;
  log.live_log = true;
  b.Add("/.sim/log", std::move(log));
  const PlatformSpec& platform = state.platform;
  const std::string iommu_unit = platform.amd ? "ivhd0" : "dmar0";
  b.Dir("/class/iommu");
  if (state.iommu) {
    const std::string unit_dir = "/devices/virtual/iommu/" + iommu_unit;
    b.Dir(unit_dir);
    if (!platform.amd) {
      // Extended capabilities as Intel VT-d reports them; bit 3 is interrupt remapping.
      b.File(unit_dir + "/intel-iommu/ecap", platform.interrupt_remapping ? "f020de\n" : "f020d6\n", 0444);
    }
    b.Link("/class/iommu/" + iommu_unit, unit_dir);
  }
  b.Dir("/firmware/acpi/tables");
  if (platform.acpi_table) {
    std::string table(48, '\0');
    table.replace(0, 4, platform.amd ? "IVRS" : "DMAR");
    if (!platform.amd && platform.interrupt_remapping) table[37] = 1;  // DMAR flags: INTR_REMAP
    b.File(platform.amd ? "/firmware/acpi/tables/IVRS" : "/firmware/acpi/tables/DMAR", table, 0400);
  }
  std::string lockdown;
  for (const char* mode : {"none", "integrity", "confidentiality"}) {
    absl::StrAppend(&lockdown, lockdown.empty() ? "" : " ", mode == platform.lockdown ? absl::StrCat("[", mode, "]") : mode);
  }
  b.File("/kernel/security/lockdown", lockdown + "\n", 0444);
  auto missing = [&](absl::string_view module) {
    return std::find(platform.missing_modules.begin(), platform.missing_modules.end(), module) !=
           platform.missing_modules.end();
  };
  auto add_module = [&](const std::string& module) {
    if (!missing(module)) b.File("/module/" + module + "/refcnt", "0\n", 0444);
  };
  if (VfioModuleLoaded(state)) {
    add_module("vfio");
    add_module("vfio_iommu_type1");
    if (!missing("vfio_iommu_type1")) {
      b.File("/module/vfio_iommu_type1/parameters/allow_unsafe_interrupts",
             platform.allow_unsafe_interrupts ? "Y\n" : "N\n", 0644);
    }
  }
  for (const auto& module : platform.modules) add_module(module);
  // An mdev-era vGPU manager loads the mdev core and its vendor module (an mdev_driver, not a PCI driver).
  const bool mdev_host = std::any_of(state.devices.begin(), state.devices.end(), [](const DeviceState& d) {
    return d.spec.vgpu.framework == VgpuFramework::kMdev || d.spec.vgpu.framework == VgpuFramework::kMdevVf;
  });
  if (mdev_host) {
    b.Dir("/class/mdev_bus");
    b.Dir("/bus/mdev/devices");
    b.Dir(absl::StrCat("/bus/mdev/drivers/", kMdevDriver));
    add_module("mdev");
    add_module(ModuleName(kMdevDriver));
  }
  for (const auto& driver : state.drivers) {
    const std::string dir = "/bus/pci/drivers/" + driver;
    b.File(dir + "/bind", "", 0200, Attr::kBind, driver);
    b.File(dir + "/unbind", "", 0200, Attr::kUnbind, driver);
    b.File(dir + "/new_id", "", 0200, Attr::kNewId, driver);
    b.File(dir + "/remove_id", "", 0200, Attr::kRemoveId, driver);
    if (!IsBuiltin(driver) && !missing(ModuleName(driver))) {
      const std::string module = "/module/" + ModuleName(driver);
      b.File(module + "/refcnt", "0\n", 0444);
      b.Link(dir + "/module", module);
      if (driver == "vfio-pci") {
        b.File(module + "/parameters/disable_idle_d3", platform.disable_idle_d3 ? "Y\n" : "N\n", 0644);
      }
    }
  }
  for (const auto& dev : state.devices) {
    if (dev.present) AddDevice(b, state, dev);
  }
  return b.Finish();
}

}  // namespace vfio_agent::sim
