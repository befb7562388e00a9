// Kubernetes extended-resource names for GPUs, derived from pci.ids exactly as NVIDIA's
// kubevirt-gpu-device-plugin does ("GH100 [H200 SXM 141GB]" -> "GH100_H200_SXM_141GB"), pinned so that
// Cozystack's default permittedHostDevices table never drifts with the host's pci.ids snapshot.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace vfio_agent::names {

// pci.ids device names, looked up under the vendor line only (never another vendor's block or a
// subsystem line).
class PciIdsDatabase {
 public:
  virtual ~PciIdsDatabase() = default;
  virtual std::optional<std::string> DeviceName(uint16_t vendor_id, uint16_t device_id) const = 0;
  // Path the database was loaded from ("" for in-memory databases).
  virtual std::string source() const = 0;
};

// Loads pci.ids through libpci. An empty path picks the first existing of the usual locations
// (/usr/share/misc/pci.ids, /usr/share/hwdata/pci.ids, /usr/share/pci.ids, /usr/pci.ids).
// Only the file is consulted (no udev hwdb, no DNS cache). Errors: NotFound with the path for a missing
// file, InvalidArgument with the path and line for a malformed one (libpci would otherwise exit).
absl::StatusOr<std::unique_ptr<PciIdsDatabase>> LoadPciIds(const std::filesystem::path& path);

// LoadPciIds, or null after a warning: a missing database only costs names (pinned names and hex ids still work).
std::unique_ptr<PciIdsDatabase> LoadPciIdsOrWarn(const std::filesystem::path& path);

// A database that loads `path` (as LoadPciIdsOrWarn) at its first lookup, for long-running commands: nodes
// whose GPUs all have pinned or overridden names then never pay for parsing pci.ids (about 7-10 ms and 2 MB
// at start). A load error is logged once; every lookup then finds nothing. Thread-safe.
std::unique_ptr<PciIdsDatabase> LazyPciIds(std::filesystem::path path);

// The search order used when no --pci-ids is given.
std::vector<std::filesystem::path> DefaultPciIdsLocations();

// The slug rule: upper-case; '/', '.' and whitespace runs -> '_'; every other character outside
// [A-Za-z0-9_] dropped. "GA102GL [A10]" -> "GA102GL_A10".
std::string Slug(std::string_view pci_ids_name);

// R2 of the kubelet reference: `domain/name` where name is 1-63 chars, alphanumeric at both ends,
// [-A-Za-z0-9_.] inside, and the domain a lower-case DNS-1123 subdomain (<= 244 chars).
absl::Status ValidateExtendedResourceName(std::string_view resource_name);

// The part after the '/' alone: 1-63 characters, alphanumeric at both ends, [-A-Za-z0-9_.] inside.
inline constexpr size_t kMaxResourceNamePart = 63;
absl::Status ValidateResourceNamePart(std::string_view name);

// The domain part alone (`--resource-domain`): a lower-case DNS-1123 subdomain of at most 244 characters
// that does not make the name a native (kubernetes.io) or quota (requests.) resource.
absl::Status ValidateResourceDomain(std::string_view domain);

// "PCI_RESOURCE_" + resource name upper-cased with '/' and '.' -> '_' (KubeVirt's rule).
std::string KubevirtEnvName(std::string_view resource_name);

// vGPU resource names, as NVIDIA's plugin names mdev types and PR #192 names SR-IOV profiles: `domain/` + the
// type name with its ends trimmed and each whitespace run turned into '_', case and '-' kept
// ("GRID T4-1Q" -> "nvidia.com/GRID_T4-1Q", "NVIDIA H200X-1-18C" -> "nvidia.com/NVIDIA_H200X-1-18C").
// InvalidArgument naming the type when the result is not a valid extended-resource name: such a type is not
// advertised rather than renamed, since KubeVirt's mdevNameSelector must match it.
absl::StatusOr<std::string> VgpuResourceName(std::string_view domain, std::string_view type_name);

// "MDEV_PCI_RESOURCE_" + the resource name as in KubevirtEnvName: the variable virt-launcher reads mdev UUIDs
// from. SR-IOV vGPUs are PCI devices to KubeVirt and use KubevirtEnvName.
std::string KubevirtMdevEnvName(std::string_view resource_name);

// Cozystack's default permittedHostDevices table (vendor 10de): device id -> name part.
const std::map<uint16_t, std::string>& PinnedNames();

struct NameOverride {
  uint16_t vendor_id = 0;
  uint16_t device_id = 0;
  std::string name;  // name part, without the domain
};

// "10de:2335=GH100_H200_SXM_141GB".
absl::StatusOr<NameOverride> ParseOverride(std::string_view text);
// One override per line; '#' comments and blank lines ignored.
absl::StatusOr<std::vector<NameOverride>> LoadOverrideFile(const std::filesystem::path& path);

enum class NameSource { kOverride, kPinned, kPciIds, kDeviceId };
const char* NameSourceName(NameSource source);

struct ResolvedName {
  uint16_t vendor_id = 0;
  uint16_t device_id = 0;
  std::string pci_ids_name;   // as found in pci.ids; "" if absent or not looked up (override and pinned names)
  std::string name;           // name part actually registered
  std::string resource_name;  // "<domain>/<name>"
  NameSource source = NameSource::kPciIds;
  std::string issue;          // non-empty when the derived name was invalid or colliding and got fixed
};

inline uint32_t NameKey(uint16_t vendor_id, uint16_t device_id) {
  return (static_cast<uint32_t>(vendor_id) << 16) | device_id;
}

// Resolves names for the device ids of a node so that collisions between two device ids and invalid names
// are fixed deterministically (same input -> same output), and a name once given never changes for the
// resolver's life: resource names are what the kubelet, KubeVirt's permittedHostDevices and running VMs
// know a GPU by.
//
// The first Resolve fixes the names of every id the node could ever advertise: the ids it is given (the
// selected GPUs present in sysfs, whatever their driver), every pinned id and every overridden id, so that
// `inspect` and `serve` agree and a GPU bound or hot-plugged later renames nothing. An id first seen by a
// later call is fitted around the names already given (it takes the suffix, never an existing id).
class NameResolver {
 public:
  // `db` may be null (no pci.ids available): names then come from overrides, the pinned table or the
  // device id. A later override for the same id wins over an earlier one (file first, then flags).
  NameResolver(const PciIdsDatabase* db, std::string domain, std::vector<NameOverride> overrides);

  // Input: (vendor, device) ids (duplicates ignored). Output: their names, keyed by NameKey().
  // A name shared by several ids gets `_<DEVICE>` (upper-case hex) appended on every id that shares it,
  // except that a single operator override or pinned entry among them keeps its name. Thread-safe.
  std::map<uint32_t, ResolvedName> Resolve(const std::vector<std::pair<uint16_t, uint16_t>>& ids) const;

  const std::string& domain() const { return domain_; }

 private:
  struct Given;  // names handed out so far; shared by copies of the resolver

  const PciIdsDatabase* db_;
  std::string domain_;
  std::vector<NameOverride> overrides_;
  std::shared_ptr<Given> given_;
};

}  // namespace vfio_agent::names
