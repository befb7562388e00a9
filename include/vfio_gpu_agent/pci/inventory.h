// Read-only PCI inventory over a sysfs root, laid out as the kernel does
// (bus/pci/devices/<BDF> are symlinks into devices/, kernel/iommu_groups/<n>/devices/<BDF>).
// A missing or malformed attribute of one device is recorded as a ScanError for that device and never
// aborts the scan of the others.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace vfio_agent::pci {

// PCI class codes (24-bit: base class, sub class, programming interface).
inline constexpr uint32_t kClassVgaController = 0x030000;
inline constexpr uint32_t kClass3dController = 0x030200;
inline constexpr uint32_t kClassHdAudio = 0x040300;
inline constexpr uint32_t kClassUsb = 0x0c0300;
inline constexpr uint32_t kClassUcsi = 0x0c8000;
inline constexpr uint32_t kClassBridgeOther = 0x068000;  // NVSwitch
inline constexpr uint16_t kVendorNvidia = 0x10de;

struct Function {
  std::string bdf{};  // canonical lower-case "dddd:bb:dd.f"
  uint16_t vendor_id = 0;
  uint16_t device_id = 0;
  uint16_t subsystem_vendor_id = 0;
  uint16_t subsystem_device_id = 0;
  uint32_t class_code = 0;  // 24-bit
  // Config space byte 0x0e without the multi-function bit; 1 and 2 are bridges. Read only for base class
  // 0x06 (reading config wakes a runtime-suspended device); 0 otherwise, when config is unreadable, or for
  // another vendor's function outside the detail vendor's groups (ScanOptions).
  uint8_t header_type = 0;
  std::string driver{};              // "" when unbound
  std::optional<int> iommu_group{};  // nullopt without an iommu_group link (IOMMU off or device not isolated)
  // Details, read only for functions of ScanOptions::detail_vendor (empty for the others):
  std::optional<int> numa_node{};    // nullopt when sysfs says -1 (no affinity) or has no numa_node
  std::string driver_override{};     // "" when "(null)" or absent (or not read: ScanOptions::driver_override)
  std::optional<std::string> physfn{};   // PF BDF when this is an SR-IOV virtual function
  std::vector<std::string> consumers{};  // BDFs from consumer:pci:<BDF> device links (GPU -> HDA/USB/UCSI)
  std::vector<std::string> vfio_cdevs{}; // names under vfio-dev/ (e.g. "vfio3") when bound to a vfio driver

  bool IsBridge() const;               // header type 1/2, or class 0x0604xx
  bool IsVirtualFunction() const { return physfn.has_value(); }
  std::string VendorDevice() const;    // "10de:2335"
  std::string ClassHex() const;        // "030200"
};

struct ScanError {
  std::string bdf;  // "" for errors not tied to one device
  std::filesystem::path path;
  absl::Status status;
};

struct IommuGroup {
  int id = 0;
  // BDFs, sorted. Built from each device's iommu_group link, which Scan reads before any other attribute,
  // so a member whose attributes could not be read is still listed (and Inventory::Find returns null).
  std::vector<std::string> members;
};

struct ScanOptions {
  // Functions of other vendors are read only as far as selection and IOMMU-group viability need them: ids,
  // class, driver, group, and the header type of bridge-class functions that share a group with one of the
  // vendor's. Their other attributes are never opened, which nearly halves the cost of a scan and keeps the
  // agent off the device locks and config space of hardware it does not manage. nullopt reads every function
  // in full.
  std::optional<uint16_t> detail_vendor{};
  // driver_override is the one attribute whose read takes the device lock, so it waits out a probe or unbind in
  // progress on that device (seconds, for a GPU). Callers that never look at it (the plugin's rescans) skip it.
  bool driver_override = true;
};

class Inventory {
 public:
  // Functions sorted by BDF.
  const std::vector<Function>& functions() const { return functions_; }
  const std::vector<ScanError>& errors() const { return errors_; }
  const std::map<int, IommuGroup>& groups() const { return groups_; }
  // True when kernel/iommu_groups has at least one group (the kernel creates them only with an IOMMU on).
  bool iommu_enabled() const { return iommu_enabled_; }

  const Function* Find(std::string_view bdf) const;
  const IommuGroup* Group(int id) const;

 private:
  friend absl::StatusOr<Inventory> Scan(const std::filesystem::path& sysfs_root, const ScanOptions& options);
  friend Inventory MakeInventory(std::vector<Function>, std::vector<ScanError>, bool);
  std::vector<Function> functions_;
  std::vector<ScanError> errors_;
  std::map<int, IommuGroup> groups_;
  bool iommu_enabled_ = false;
};

// Scans <sysfs_root>/bus/pci/devices (on a few threads). Fails only when that directory itself cannot be
// listed.
absl::StatusOr<Inventory> Scan(const std::filesystem::path& sysfs_root, const ScanOptions& options = {});

// How many Scans this process has started, over every thread: what tests and benchmarks count a pass's sysfs
// scans by (one per `run` pass is the target: node::Source).
uint64_t ScansStarted();

// Reads one device in full; used by code that re-checks a single device (binding, health).
absl::StatusOr<Function> ReadFunction(const std::filesystem::path& sysfs_root, const std::string& bdf);

// Builds an inventory from already-read functions (groups derived from Function::iommu_group). For tests
// and for callers that re-read a subset.
Inventory MakeInventory(std::vector<Function> functions, std::vector<ScanError> errors, bool iommu_enabled);

// Validates and canonicalises a BDF ("0000:3B:00.0" -> "0000:3b:00.0"); accepts "3b:00.0" with domain 0.
absl::StatusOr<std::string> CanonicalBdf(std::string_view text);

}  // namespace vfio_agent::pci
