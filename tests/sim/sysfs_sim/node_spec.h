// The node description (proto/sim/v1/node.proto) parsed, checked and normalised into plain values.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace vfio_agent::sim {

struct BarSpec {
  int index = 0;
  uint64_t size = 0;
  bool is_64bit = false;
  bool prefetchable = false;
  bool unassigned = false;
};

struct VgpuTypeSpec {
  std::string id;  // mdev type dir ("nvidia-222") or SR-IOV type id ("1414")
  std::string name;
  int max_instances = 1;
  std::string description;
};

enum class VgpuFramework { kNone, kMdev, kMdevVf, kSriov };

struct VgpuSpec {
  VgpuFramework framework = VgpuFramework::kNone;
  std::vector<VgpuTypeSpec> types;
  bool one_type_at_a_time = true;
};

struct DeviceSpec {
  std::string bdf;
  uint16_t vendor = 0;
  uint16_t device = 0;
  uint16_t subsystem_vendor = 0;
  uint16_t subsystem_device = 0;
  uint32_t class_code = 0;
  uint8_t header_type = 0;
  uint8_t revision = 0xa1;
  int numa_node = -1;
  int iommu_group = -1;
  std::string driver;
  std::string default_driver;
  std::string parent;
  std::string physfn;
  std::vector<std::string> consumers;
  int unbind_delay_ms = 0;
  int bind_errno = 0;
  bool dead = false;
  bool removed = false;
  std::vector<BarSpec> bars;
  std::string power_state = "D0";
  bool d3cold_allowed = true;
  std::string reset_method = "flr bus";  // "" = no reset method
  int sriov_totalvfs = 0;
  bool mdev = false;
  VgpuSpec vgpu;
  int sriov_vf_offset = 4;
  int sriov_vf_stride = 1;

  bool IsBridge() const { return (header_type & 0x7f) == 1; }
};

struct PlatformSpec {
  bool amd = false;  // AMD-Vi (ivhd0, IVRS) instead of Intel VT-d (dmar0, DMAR)
  bool acpi_table = true;
  bool interrupt_remapping = true;
  bool allow_unsafe_interrupts = false;
  bool disable_idle_d3 = false;
  std::string cmdline;  // filled with a default by ParseNode when the file gives none
  int phys_bits = 46;
  bool iommufd = false;
  std::string lockdown = "none";
  std::vector<std::string> modules;
  std::vector<std::string> missing_modules;
};

struct NodeSpec {
  std::string description;
  bool iommu = false;
  PlatformSpec platform;
  std::vector<std::string> drivers;
  std::vector<DeviceSpec> devices;  // parents before children
};

absl::StatusOr<NodeSpec> ParseNode(absl::string_view json, absl::string_view origin);
absl::StatusOr<NodeSpec> LoadNode(const std::filesystem::path& file);

// "EBUSY" <-> 16; "0" is 0. Only the errnos a driver probe plausibly returns.
std::optional<int> ErrnoFromName(absl::string_view name);
std::string ErrnoName(int err);
// A log line with the errno name appended when err != 0: "bind 0000:3b:00.0 vfio-pci EINVAL".
std::string WithErrno(std::string line, int err);

// "0000:3b:00.0" shape check (hex digits, separators).
bool IsValidBdf(absl::string_view bdf);

}  // namespace vfio_agent::sim
