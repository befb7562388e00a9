// The sysfs tree as the FUSE layer serves it: an immutable snapshot built from KernelState after every
// change, so lookups never race with mutations.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "state.h"

namespace vfio_agent::sim {

// What a write to a file does.
enum class Attr {
  kNone,
  kBind,            // bus/pci/drivers/<key>/bind
  kUnbind,          // bus/pci/drivers/<key>/unbind
  kNewId,           // bus/pci/drivers/<key>/new_id
  kRemoveId,        // bus/pci/drivers/<key>/remove_id
  kDriversProbe,    // bus/pci/drivers_probe
  kRescan,          // bus/pci/rescan
  kDriverOverride,  // <dev>/driver_override, key = BDF
  kRemove,          // <dev>/remove
  kReset,           // <dev>/reset
  kConfig,          // <dev>/config: opening it for reading wakes a device in D3cold (key = BDF)
  kControl,         // .sim/control
  kSriovNumvfs,     // <dev>/sriov_numvfs, key = PF BDF
  kMdevCreate,      // <parent>/mdev_supported_types/<type>/create, key = "<parent BDF>/<type id>"
  kMdevRemove,      // <parent>/<uuid>/remove, key = uuid
  kCurrentVgpuType, // <VF>/nvidia/current_vgpu_type, key = VF BDF
};

struct Entry {
  enum class Type { kDir, kFile, kLink };
  Type type = Type::kDir;
  uint32_t mode = 0755;
  std::string content;  // file bytes, or the link target
  Attr attr = Attr::kNone;
  std::string key;
  bool live_log = false;              // content is the sim log, read at open
  std::vector<std::string> children;  // sorted
};

// Paths are absolute inside the mount: "/", "/bus/pci/devices/0000:3b:00.0".
using Tree = std::map<std::string, Entry, std::less<>>;

std::shared_ptr<const Tree> BuildTree(const KernelState& state);

// The kernel's relative symlink target from directory `from_dir` to `to` (both absolute in the tree).
std::string RelativeLink(const std::string& from_dir, const std::string& to);

// 4096 bytes of config space for a device (all 0xff when dead).
std::string ConfigSpace(const KernelState& state, const DeviceState& dev);

}  // namespace vfio_agent::sim
