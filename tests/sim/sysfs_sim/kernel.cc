#include "kernel.h"

#include <algorithm>
#include <cerrno>
#include <chrono>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "dev_tree.h"
#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/binding/holders.h"
#include "vgpu.h"

namespace vfio_agent::sim {
namespace {

// sysfs_streq(): the kernel compares names ignoring a trailing newline; shells add one.
std::string Arg(absl::string_view data) { return std::string(absl::StripTrailingAsciiWhitespace(data)); }

bool ParseFlag(absl::string_view data, unsigned long& value) {  // kstrtoul()
  return absl::SimpleAtoi(absl::StripAsciiWhitespace(data), &value);
}

}  // namespace

Kernel::Kernel(NodeSpec node, std::filesystem::path dev_root, std::filesystem::path proc_root)
    : dev_root_(std::move(dev_root)), proc_root_(std::move(proc_root)) {
  state_.iommu = node.iommu;
  state_.platform = node.platform;
  state_.drivers = node.drivers;
  for (auto& spec : node.devices) {
    DeviceState dev;
    dev.spec = spec;
    dev.present = !spec.removed;
    dev.dead = spec.dead;
    dev.power_state = spec.power_state;
    dev.unbind_delay_ms = spec.unbind_delay_ms;
    dev.bind_errno = spec.bind_errno;
    state_.first_dynamic_group = std::max(state_.first_dynamic_group, spec.iommu_group + 1);
    state_.devices.push_back(std::move(dev));
  }
  // Boot-time probe runs in bus order, which fixes the /dev/nvidiaN and vfioN numbering.
  std::vector<DeviceState*> by_bdf;
  for (auto& dev : state_.devices) by_bdf.push_back(&dev);
  std::sort(by_bdf.begin(), by_bdf.end(), [](auto* a, auto* b) { return a->spec.bdf < b->spec.bdf; });
  for (DeviceState* dev : by_bdf) {
    if (dev->present && !dev->spec.driver.empty()) Attach(dev->spec.driver, *dev);
  }
}

absl::Status Kernel::Start() {
  std::error_code ec;
  std::filesystem::create_directories(dev_root_, ec);
  if (ec) return absl::InternalError(absl::StrCat("create ", dev_root_.string(), ": ", ec.message()));
  if (!proc_root_.empty()) {
    if (auto st = WriteProcFiles(state_.platform, proc_root_); !st.ok()) return st;
  }
  std::lock_guard lock(mu_);
  snapshot_ = BuildTree(state_);
  return SyncDevTree(state_, dev_root_);
}

std::shared_ptr<const Tree> Kernel::Snapshot() const {
  std::lock_guard lock(mu_);
  return snapshot_;
}

std::string Kernel::LogText() const {
  std::lock_guard lock(mu_);
  return log_.empty() ? "" : absl::StrCat(absl::StrJoin(log_, "\n"), "\n");
}

void Kernel::Shutdown() {
  std::lock_guard lock(mu_);
  shutdown_ = true;
  wake_.notify_all();
}

int Kernel::Write(Attr attr, const std::string& key, absl::string_view data) {
  std::unique_lock lock(mu_);
  int err = EINVAL;
  switch (attr) {
    case Attr::kBind: err = Bind(key, data); break;
    case Attr::kUnbind: err = Unbind(lock, key, data); break;
    case Attr::kNewId: err = NewId(key, data, true); break;
    case Attr::kRemoveId: err = NewId(key, data, false); break;
    case Attr::kDriversProbe: err = DriversProbe(data); break;
    case Attr::kRescan: err = Rescan(data); break;
    case Attr::kDriverOverride: err = DriverOverride(key, data); break;
    case Attr::kRemove: err = Remove(key, data); break;
    case Attr::kReset:
      err = state_.FindPresent(key) ? 0 : ENODEV;
      Log(WithErrno("reset " + key, err));
      break;
    case Attr::kControl: err = Control(lock, data); break;
    case Attr::kSriovNumvfs: err = SriovNumvfs(key, data); break;
    case Attr::kMdevCreate: err = MdevCreate(key, data); break;
    case Attr::kMdevRemove: err = MdevRemove(key, data); break;
    case Attr::kCurrentVgpuType: err = CurrentVgpuType(key, data); break;
    case Attr::kConfig: err = EPERM; break;  // config writes are not modelled
    case Attr::kNone: err = EACCES; break;
  }
  Publish();
  return err;
}

// drivers/<drv>/bind: bind_store() -> driver_match_device() (ENODEV), __driver_probe_device() (EBUSY), probe.
int Kernel::Bind(const std::string& driver, absl::string_view data) {
  const std::string bdf = Arg(data);
  DeviceState* dev = state_.FindPresent(bdf);
  int err = 0;
  if (!dev || !Matches(driver, *dev)) {
    err = ENODEV;
  } else if (!dev->driver.empty()) {
    err = EBUSY;
  } else {
    err = Probe(driver, *dev);
  }
  Log(WithErrno(absl::StrCat("bind ", bdf, " ", driver), err));
  return err;
}

// drivers/<drv>/unbind: ENODEV unless the device is bound to exactly this driver. The injected delay stands
// for a driver whose remove() callback waits (nvidia with open clients); only this writer waits.
int Kernel::Unbind(std::unique_lock<std::mutex>& lock, const std::string& driver, absl::string_view data) {
  const std::string bdf = Arg(data);
  DeviceState* dev = state_.FindPresent(bdf);
  if (!dev || dev->driver != driver) {
    Log(WithErrno(absl::StrCat("unbind ", bdf, " ", driver), ENODEV));
    return ENODEV;
  }
  if (dev->unbind_delay_ms != 0 && !shutdown_) {
    Log(absl::StrCat("unbind-wait ", bdf, " ", driver));
    const uint64_t releases = dev->releases;
    auto done = [&] { return shutdown_ || !dev->present || dev->releases != releases; };
    if (dev->unbind_delay_ms < 0) {
      wake_.wait(lock, done);
    } else {
      wake_.wait_for(lock, std::chrono::milliseconds(dev->unbind_delay_ms), done);
    }
    if (shutdown_) {
      Log(WithErrno(absl::StrCat("unbind ", bdf, " ", driver), EINTR));
      return EINTR;
    }
    // Removed or rebound by someone else while we waited: the unbind has nothing left to do.
    if (!dev->present || dev->driver != driver) return 0;
  }
  Detach(*dev);
  Log(absl::StrCat("unbind ", bdf, " ", driver));
  return 0;
}

// drivers_probe: ENODEV for an unknown device, otherwise success whatever the probe did (as
// bus_rescan_devices_helper() swallows probe errors). With driver_override only that driver may take it.
int Kernel::DriversProbe(absl::string_view data) {
  const std::string bdf = Arg(data);
  DeviceState* dev = state_.FindPresent(bdf);
  if (!dev) {
    Log(WithErrno("probe " + bdf, ENODEV));
    return ENODEV;
  }
  if (dev->driver.empty()) {
    std::vector<std::string> candidates;
    if (dev->driver_override) {
      candidates.push_back(*dev->driver_override);
    } else {
      candidates.push_back(dev->spec.default_driver);
      for (const auto& d : state_.drivers) candidates.push_back(d);
    }
    for (const auto& driver : candidates) {
      if (state_.HasDriver(driver) && Matches(driver, *dev) && Probe(driver, *dev) == 0) break;
    }
  }
  Log(absl::StrCat("probe ", bdf, " ", dev->driver.empty() ? "none" : dev->driver));
  return 0;
}

// driver_set_override(): the value ends at the first newline; empty clears; a page or more is EINVAL.
int Kernel::DriverOverride(const std::string& bdf, absl::string_view data) {
  DeviceState* dev = state_.FindPresent(bdf);
  if (!dev) return ENODEV;
  if (data.size() >= 4095) return EINVAL;
  absl::string_view value = data.substr(0, data.find('\n'));
  if (value.empty()) {
    dev->driver_override.reset();
  } else {
    dev->driver_override = std::string(value);
  }
  Log(absl::StrCat("override ", bdf, " ", dev->driver_override.value_or("(null)")));
  return 0;
}

int Kernel::Remove(const std::string& bdf, absl::string_view data) {
  unsigned long flag = 0;
  if (!ParseFlag(data, flag)) return EINVAL;
  if (flag == 0) return 0;
  DeviceState* dev = state_.FindPresent(bdf);
  if (!dev) return ENODEV;
  RemoveDevice(*dev);
  Log("remove " + bdf);
  return 0;
}

int Kernel::Rescan(absl::string_view data) {
  unsigned long flag = 0;
  if (!ParseFlag(data, flag)) return EINVAL;
  if (flag == 0) return 0;
  RescanAll();
  Log("rescan");
  return 0;
}

// new_id "VVVV DDDD ...": adds a dynamic id and binds every unbound device it now matches;
// remove_id drops one (ENODEV if absent).
int Kernel::NewId(const std::string& driver, absl::string_view data, bool add) {
  std::vector<absl::string_view> fields = absl::StrSplit(data, ' ', absl::SkipWhitespace());
  uint32_t vendor = 0, device = 0;
  auto strip = [](absl::string_view f) { return absl::StripAsciiWhitespace(f); };
  if (fields.size() < 2 || !absl::SimpleHexAtoi(strip(fields[0]), &vendor) ||
      !absl::SimpleHexAtoi(strip(fields[1]), &device) || vendor > 0xffff || device > 0xffff) {
    return EINVAL;
  }
  const auto id = std::make_pair(static_cast<uint16_t>(vendor), static_cast<uint16_t>(device));
  auto& ids = state_.dynamic_ids[driver];
  const std::string line = absl::StrFormat("%s %s %04x %04x", add ? "new_id" : "remove_id", driver, vendor, device);
  if (!add) {
    int err = ids.erase(id) ? 0 : ENODEV;
    Log(WithErrno(line, err));
    return err;
  }
  if (!ids.insert(id).second) {
    Log(WithErrno(line, EEXIST));
    return EEXIST;
  }
  Log(line);
  for (auto& dev : state_.devices) {
    if (!dev.present || !dev.driver.empty() || std::make_pair(dev.spec.vendor, dev.spec.device) != id) continue;
    if (Matches(driver, dev) && Probe(driver, dev) == 0) Log(absl::StrCat("bind ", dev.spec.bdf, " ", driver));
  }
  return 0;
}

// pci_match_device(): driver_override, when set, is the only driver that matches. Otherwise the driver the
// kernel would pick for the device (its id table) or a dynamic id added through new_id. vfio-pci's id table
// only matches through driver_override (override_only ids, kernel >= 5.16), so it is never a default here.
bool Kernel::Matches(const std::string& driver, const DeviceState& dev) const {
  if (dev.driver_override) return *dev.driver_override == driver;
  if (driver == dev.spec.default_driver) return true;
  auto it = state_.dynamic_ids.find(driver);
  return it != state_.dynamic_ids.end() && it->second.count({dev.spec.vendor, dev.spec.device});
}

// The driver's probe(): the injected errno, or vfio-pci's refusals (no IOMMU group -> EINVAL from
// vfio_iommu_group_get(); not a normal header type -> EINVAL).
int Kernel::Probe(const std::string& driver, DeviceState& dev) {
  if (dev.bind_errno) return dev.bind_errno;
  if (IsVfioDriver(driver) && (!state_.iommu || dev.spec.iommu_group < 0 || dev.spec.IsBridge())) return EINVAL;
  Attach(driver, dev);
  return 0;
}

namespace {

template <typename Used>
int LowestFree(const KernelState& state, const DeviceState& dev, Used used) {
  for (int n = 0;; ++n) {
    bool taken = false;
    for (const auto& other : state.devices) taken |= (&other != &dev && used(other, n));
    if (!taken) return n;
  }
}

}  // namespace

int Kernel::LowestFreeVfioIndex(const DeviceState& dev) const {
  return LowestFree(state_, dev, [](const DeviceState& o, int n) { return o.vfio_index == n; });
}

// nvidia gives /dev/nvidiaN to GPUs and NVSwitches, not to the VFs a vGPU manager drives.
void Kernel::Attach(const std::string& driver, DeviceState& dev) {
  dev.driver = driver;
  if (IsVfioDriver(driver)) {
    dev.vfio_index = LowestFreeVfioIndex(dev);
  } else if (driver == "nvidia" && dev.spec.physfn.empty() &&
             ((dev.spec.class_code >> 16) == 0x03 || IsNvSwitch(dev.spec))) {
    const bool nvswitch = IsNvSwitch(dev.spec);
    dev.nvidia_index = LowestFree(state_, dev, [&](const DeviceState& o, int n) {
      return o.nvidia_index == n && IsNvSwitch(o.spec) == nvswitch;
    });
  }
}

// A driver leaving a device takes what it created: the mdevs of a parent (mdev_unregister_parent()) and the
// vGPU type of a VF.
void Kernel::Detach(DeviceState& dev) {
  dev.driver.clear();
  dev.vfio_index = -1;
  dev.nvidia_index = -1;
  dev.vgpu_type = 0;
  state_.mdevs.erase(std::remove_if(state_.mdevs.begin(), state_.mdevs.end(),
                                    [&](const MdevState& m) { return m.parent == dev.spec.bdf; }),
                     state_.mdevs.end());
}

// Surprise or requested removal: the subtree below a bridge and the VFs of a PF go with it.
void Kernel::RemoveDevice(DeviceState& dev) {
  for (auto& other : state_.devices) {
    if (other.present && (other.spec.parent == dev.spec.bdf || other.spec.physfn == dev.spec.bdf)) {
      RemoveDevice(other);
    }
  }
  Detach(dev);
  dev.present = false;
  dev.driver_override.reset();
  wake_.notify_all();
}

// Removed devices come back as new pci_dev structs: no driver_override, probed by their default driver.
// VFs made through sriov_numvfs stay away: a rescanned PF starts with SR-IOV disabled.
void Kernel::RescanAll() {
  for (auto& dev : state_.devices) {
    if (dev.present || dev.created_vf) continue;
    dev.present = true;
    if (state_.HasDriver(dev.spec.default_driver)) Probe(dev.spec.default_driver, dev);
  }
}

// pci_read_config() resumes the device (pci_config_pm_runtime_get) before it reads: from D3cold that is a
// power-up of the GPU, which is why the agent must not read config space of a sleeping device.
void Kernel::WakeForConfigRead(const std::string& bdf) {
  std::lock_guard lock(mu_);
  DeviceState* dev = state_.FindPresent(bdf);
  if (!dev || dev->power_state != "D3cold") return;
  dev->power_state = "D0";
  Log("wake " + bdf);
  Publish();
}

bool Kernel::GroupOpen(int group) const {
  HostPaths paths;
  paths.dev_root = dev_root_;
  return !binding::VfioGroupOpeners(paths, group).empty();
}

void Kernel::Log(std::string line) { log_.push_back(std::move(line)); }

void Kernel::Publish() {
  snapshot_ = BuildTree(state_);
  if (auto st = SyncDevTree(state_, dev_root_); !st.ok()) spdlog::error("sysfs-sim: {}", st.ToString());
}

}  // namespace vfio_agent::sim
