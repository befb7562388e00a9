// Which functions the agent manages, and whether each IOMMU group can be handed to VFIO.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "vfio_gpu_agent/pci/inventory.h"

namespace vfio_agent::pci {

// A class prefix matches when the top `bits` bits of the 24-bit class equal those of `value`
// ("03" -> 8 bits, "0302" -> 16 bits, "030200" -> 24 bits).
struct ClassPrefix {
  uint32_t value = 0;
  int bits = 24;
  bool Matches(uint32_t class_code) const;
};

// Parses a comma-separated list of 2/4/6-digit hex class prefixes ("0300,0302").
absl::StatusOr<std::vector<ClassPrefix>> ParseClassPrefixes(std::string_view text);

struct SelectionPolicy {
  uint16_t vendor_id = kVendorNvidia;
  std::vector<ClassPrefix> classes = {{0x030000, 16}, {0x030200, 16}};
  bool include_nvswitches = false;  // vendor functions of class 0x0680
};

enum class Role { kGpu, kCompanion, kNvSwitch, kBridge, kForeign };
const char* RoleName(Role role);

// Drivers that leave a group viable for VFIO.
bool IsVfioDriver(std::string_view driver);          // vfio-pci and vfio variant drivers (*vfio_pci / *vfio-pci)
bool IsViableDriver(std::string_view driver);        // a vfio driver, "" (unbound) or pci-stub

struct Member {
  std::string bdf;
  Role role = Role::kForeign;
};

struct GroupAssessment {
  int id = 0;
  std::vector<Member> members;         // every function of the group, BDF order
  bool viable = false;                 // VFIO can open it now: every non-bridge member is on a viable driver
  bool usable = false;                 // binding our members would make it viable (no foreign endpoint on another driver)
  std::vector<std::string> blockers;   // "0000:3b:00.2 8086:1572 bound to i40e"
};

struct Selection {
  std::vector<std::string> gpus;        // selected GPU (and NVSwitch, when asked) functions, BDF order
  std::vector<std::string> companions;  // vendor functions sharing a selected function's group
  std::vector<std::string> unisolated;  // selected functions without an IOMMU group
  std::vector<GroupAssessment> groups;  // groups holding a selected function, by id
  std::map<std::string, Role, std::less<>> roles;  // every function in `gpus` and every member of `groups`
  const GroupAssessment* GroupOf(const Function& fn) const;
  Role RoleOf(std::string_view bdf) const;  // kForeign for functions not in the selection
};

Selection Select(const Inventory& inventory, const SelectionPolicy& policy);

}  // namespace vfio_agent::pci
