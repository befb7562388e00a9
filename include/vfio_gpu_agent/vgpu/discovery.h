// vGPU discovery: the node's vGPUs of either host framework, read-only from a sysfs root, beside the PCI
// inventory (which it uses for the SR-IOV functions).
//
//   mdev (Pascal..Ampere): parents <sysfs>/class/mdev_bus/<BDF> with mdev_supported_types/<type-id>/{name,
//     available_instances}; instances <sysfs>/bus/mdev/devices/<uuid> -> .../<parent BDF>/<uuid>, with
//     mdev_type -> the type directory and iommu_group -> the mdev's own group.
//   SR-IOV (vGPU 17+, Ada and newer): a VF (physfn link) of vendor 10de on the `nvidia` driver whose
//     nvidia/current_vgpu_type is neither missing, empty nor 0; named from its card's catalog (catalog.h).
//
// A device whose attributes cannot be read is an error of that device, never of the scan.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "vfio_gpu_agent/pci/inventory.h"
#include "vfio_gpu_agent/vgpu/catalog.h"

namespace vfio_agent::vgpu {

inline constexpr char kNvidiaDriver[] = "nvidia";

enum class Framework { kNone, kMdev, kSriov };
const char* FrameworkName(Framework framework);  // "none", "mdev", "sriov"

struct MdevType {
  std::string id;    // "nvidia-222"
  std::string name;  // "GRID T4-1Q"
  std::optional<int> available_instances;  // nullopt when unreadable (recorded as an error)
  // How many of this type the whole card holds: NVIDIA's `description` says "..., max_instance=16"; nullopt when
  // the file is missing or says nothing of it (not an error: only the profile applier's fit check uses it).
  std::optional<int> max_instances;
};

struct MdevParent {
  std::string bdf;
  std::vector<MdevType> types;  // sorted by id
};

struct Mdev {
  std::string uuid;        // lower-case, as the kernel prints it
  std::string parent_bdf;  // the GPU (Turing) or VF (Ampere) it was created on
  std::string type_id;     // "nvidia-222"
  std::string type_name;   // "GRID T4-1Q"
  std::optional<int> iommu_group;
};

struct SriovVgpu {
  std::string bdf;     // the VF
  std::string pf_bdf;  // its card
  int type_id = 0;     // current_vgpu_type
  std::string type_name;  // "NVIDIA H200X-1-18C"
};

// A VF with a vGPU type whose name is in no catalog seen for its card (never given a made-up name).
struct UnresolvedVgpu {
  std::string bdf;
  std::string pf_bdf;
  int type_id = 0;
  std::string reason;  // names the card key and where the catalog was looked for
};

struct DeviceError {
  std::string device;  // BDF or mdev UUID; "" for the catalog file
  std::filesystem::path path;
  absl::Status status;
};

struct Discovery {
  std::vector<MdevParent> parents;       // sorted by BDF
  std::vector<Mdev> mdevs;               // sorted by UUID
  std::vector<SriovVgpu> vgpus;          // sorted by BDF
  std::vector<UnresolvedVgpu> unresolved;  // sorted by BDF
  std::vector<DeviceError> errors;
  std::map<std::string, CardKey> cards;    // the SR-IOV cards with VFs on nvidia, by PF BDF (catalog keys)
  // kNone, kMdev or kSriov; FailedPrecondition naming devices of both when the node has mdev parents and SR-IOV
  // vGPUs (one framework per node: NVIDIA supports no mix, and one config cannot describe both).
  absl::StatusOr<Framework> framework = Framework::kNone;
};

// 8-4-4-4-12 hex digits, as the kernel accepts in mdev_supported_types/<type>/create.
bool IsMdevUuid(std::string_view text);

// Reads both frameworks. `inventory` must be a scan of the same root with details of vendor 10de (physfn). The
// catalogs read from the cards are merged into `catalog` (refreshed from its file first; saved when they
// changed; a failed save is an error of this discovery, the names still resolve from memory). Fails only when <sysfs>/bus/mdev/devices or
// <sysfs>/class/mdev_bus exist but cannot be listed.
absl::StatusOr<Discovery> Discover(const std::filesystem::path& sysfs_root, const pci::Inventory& inventory,
                                   CatalogStore& catalog);

}  // namespace vfio_agent::vgpu
