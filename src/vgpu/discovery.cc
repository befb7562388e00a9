#include "vfio_gpu_agent/vgpu/discovery.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "vfio_gpu_agent/common/fs.h"

namespace vfio_agent::vgpu {
namespace {

namespace stdfs = std::filesystem;

std::optional<int> ParseInt(std::string_view text) {
  int value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size()) return std::nullopt;
  return value;
}

// "num_heads=4, frl_config=60, framebuffer=1024M, max_resolution=5120x2880, max_instance=16" -> 16.
std::optional<int> MaxInstanceOf(const std::string& description) {
  for (absl::string_view field : absl::StrSplit(description, ',')) {
    field = absl::StripAsciiWhitespace(field);
    constexpr absl::string_view kKey = "max_instance=";
    if (!absl::StartsWith(field, kKey)) continue;
    field.remove_prefix(kKey.size());
    std::optional<int> value = ParseInt(std::string_view(field.data(), field.size()));
    if (value && *value > 0) return value;
  }
  return std::nullopt;
}

// A directory that is absent is empty (no such framework on this node); one that exists but cannot be listed
// is an error, so that a transient failure never looks like every vGPU gone.
absl::StatusOr<std::vector<std::string>> ListIfPresent(const stdfs::path& dir) {
  absl::StatusOr<std::vector<std::string>> names = fs::ListDir(dir);
  if (absl::IsNotFound(names.status())) return std::vector<std::string>{};
  return names;
}

void ReadParents(const stdfs::path& sysfs_root, const std::vector<std::string>& bdfs, Discovery& out) {
  for (const std::string& bdf : bdfs) {
    MdevParent parent{.bdf = bdf, .types = {}};
    const stdfs::path types_dir = sysfs_root / "class/mdev_bus" / bdf / "mdev_supported_types";
    absl::StatusOr<std::vector<std::string>> types = fs::ListDir(types_dir);
    if (!types.ok()) {
      out.errors.push_back({bdf, types_dir, types.status()});
    } else {
      for (const std::string& id : *types) {
        MdevType type{.id = id, .name = "", .available_instances = std::nullopt, .max_instances = std::nullopt};
        absl::StatusOr<std::string> name = fs::ReadTrimmed(types_dir / id / "name", fs::kMaxAttributeBytes);
        if (name.ok()) {
          type.name = *std::move(name);
        } else {
          out.errors.push_back({bdf, types_dir / id / "name", name.status()});
        }
        absl::StatusOr<int64_t> available = fs::ReadInt(types_dir / id / "available_instances");
        if (available.ok()) {
          type.available_instances = static_cast<int>(*available);
        } else {
          out.errors.push_back({bdf, types_dir / id / "available_instances", available.status()});
        }
        if (absl::StatusOr<std::string> description = fs::ReadTrimmed(types_dir / id / "description", fs::kMaxAttributeBytes);
            description.ok()) {
          type.max_instances = MaxInstanceOf(*description);
        }
        parent.types.push_back(std::move(type));
      }
    }
    out.parents.push_back(std::move(parent));
  }
}

absl::StatusOr<Mdev> ReadMdev(const stdfs::path& devices_dir, const std::string& uuid) {
  const stdfs::path dir = devices_dir / uuid;
  if (!IsMdevUuid(uuid)) return absl::InvalidArgumentError(absl::StrCat(dir.string(), ": not an mdev UUID"));
  std::error_code ec;
  const stdfs::path target = stdfs::read_symlink(dir, ec);
  if (ec) return fs::ErrnoStatus(ec.value(), "readlink", dir);
  // .../<parent BDF>/<uuid>: the parent is the link target's directory (as KubeVirt and NVIDIA's plugin read it).
  Mdev mdev{.uuid = uuid, .parent_bdf = target.parent_path().filename().string(), .type_id = "", .type_name = "",
            .iommu_group = std::nullopt};
  absl::StatusOr<std::string> parent = pci::CanonicalBdf(mdev.parent_bdf);
  if (!parent.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(dir.string(), " -> ", target.string(), ": parent \"",
                                                   mdev.parent_bdf, "\" is not a PCI address"));
  }
  mdev.parent_bdf = *std::move(parent);
  absl::StatusOr<std::string> type_id = fs::ReadLinkBasename(dir / "mdev_type");
  if (!type_id.ok()) return type_id.status();
  mdev.type_id = *std::move(type_id);
  absl::StatusOr<std::string> type_name = fs::ReadTrimmed(dir / "mdev_type/name", fs::kMaxAttributeBytes);
  if (!type_name.ok()) return type_name.status();
  mdev.type_name = *std::move(type_name);  // ReadTrimmed strips the newline; names have no leading space
  if (mdev.type_name.empty()) return absl::InvalidArgumentError(absl::StrCat((dir / "mdev_type/name").string(), ": empty"));
  // No group link: the mdev's VFIO device is not registered yet (or any more); its health says so.
  absl::StatusOr<std::string> group = fs::ReadLinkBasename(dir / "iommu_group");
  if (group.ok()) {
    mdev.iommu_group = ParseInt(*group);
    if (!mdev.iommu_group) {
      return absl::InvalidArgumentError(absl::StrCat((dir / "iommu_group").string(), ": group \"", *group,
                                                     "\" is not a number"));
    }
  } else if (!absl::IsNotFound(group.status())) {
    return group.status();
  }
  return mdev;
}

// The vGPU type of an SR-IOV VF: nullopt when it has none (no nvidia/ attributes, empty, or 0).
absl::StatusOr<std::optional<int>> CurrentVgpuType(const stdfs::path& sysfs_root, const std::string& bdf) {
  const stdfs::path path = sysfs_root / "bus/pci/devices" / bdf / "nvidia/current_vgpu_type";
  absl::StatusOr<std::string> text = fs::ReadTrimmed(path, fs::kMaxAttributeBytes);
  if (absl::IsNotFound(text.status())) return std::optional<int>();
  if (!text.ok()) return text.status();
  const std::string& value = *text;
  if (value.empty() || value == "0") return std::optional<int>();
  std::optional<int> id = ParseInt(value);
  if (!id || *id < 0) {
    return absl::InvalidArgumentError(absl::StrCat(path.string(), ": \"", value, "\" is not a vGPU type id"));
  }
  return id;
}

// One SR-IOV card: the PF and its VFs on the nvidia driver (as the inventory saw them).
struct Card {
  CardKey key;
  std::vector<std::string> functions;  // PF first (when present), then the VFs
};

void ReadSriov(const stdfs::path& sysfs_root, const pci::Inventory& inventory, CatalogStore& catalog,
               Discovery& out) {
  std::map<std::string, Card> cards;  // by PF BDF
  for (const pci::Function& fn : inventory.functions()) {
    if (!fn.physfn || fn.vendor_id != pci::kVendorNvidia || fn.driver != kNvidiaDriver) continue;
    Card& card = cards[*fn.physfn];
    card.functions.push_back(fn.bdf);
  }
  if (cards.empty()) return;
  // Another store of the file (the plugin's, the profile applier's) may have seen a card before it filled up.
  if (absl::Status refreshed = catalog.Refresh(); !refreshed.ok()) out.errors.push_back({"", catalog.file(), refreshed});
  absl::StatusOr<std::string> version = fs::ReadTrimmed(sysfs_root / "module/nvidia/version", fs::kMaxAttributeBytes);
  bool changed = false;
  for (auto& [pf_bdf, card] : cards) {
    const pci::Function* pf = inventory.Find(pf_bdf);
    const pci::Function* first_vf = inventory.Find(card.functions.front());
    card.key = {.pf_bdf = pf_bdf,
                .vendor_id = pf != nullptr ? pf->vendor_id : first_vf->vendor_id,  // a VF has its PF's ids
                .device_id = pf != nullptr ? pf->device_id : first_vf->device_id,
                .driver_version = version.ok() ? *version : ""};
    if (pf != nullptr) card.functions.insert(card.functions.begin(), pf_bdf);
    // The card's catalog is the union of what every function lists now: each lists what it could still create.
    std::map<int, std::string> listed;
    for (const std::string& bdf : card.functions) {
      const stdfs::path path = sysfs_root / "bus/pci/devices" / bdf / "nvidia/creatable_vgpu_types";
      absl::StatusOr<std::string> text = fs::ReadTrimmed(path, fs::kMaxAttributeBytes);
      if (absl::IsNotFound(text.status())) continue;
      if (!text.ok()) {
        out.errors.push_back({bdf, path, text.status()});
        continue;
      }
      listed.merge(ParseCreatableTypes(*text));
    }
    changed |= catalog.Merge(card.key, listed);
    out.cards[pf_bdf] = card.key;
  }
  if (changed) {
    if (absl::Status saved = catalog.Save(); !saved.ok()) out.errors.push_back({"", catalog.file(), saved});
  }
  for (const auto& [pf_bdf, card] : cards) {
    for (const std::string& bdf : card.functions) {
      if (bdf == pf_bdf) continue;
      absl::StatusOr<std::optional<int>> type = CurrentVgpuType(sysfs_root, bdf);
      if (!type.ok()) {
        out.errors.push_back({bdf, sysfs_root / "bus/pci/devices" / bdf / "nvidia/current_vgpu_type", type.status()});
        continue;
      }
      if (!type->has_value()) continue;
      const int id = **type;
      if (std::optional<std::string> name = catalog.Lookup(card.key, id)) {
        out.vgpus.push_back({.bdf = bdf, .pf_bdf = pf_bdf, .type_id = id, .type_name = *std::move(name)});
      } else {
        out.unresolved.push_back(
            {.bdf = bdf, .pf_bdf = pf_bdf, .type_id = id,
             .reason = absl::StrCat("vGPU type ", id, " of ", bdf, " is in no catalog seen for card ",
                                    card.key.ToString(), " (nvidia/creatable_vgpu_types of ",
                                    absl::StrJoin(card.functions, ", "),
                                    catalog.file().empty() ? "" : absl::StrCat(", or ", catalog.file().string()),
                                    ")")});
      }
    }
  }
  std::sort(out.vgpus.begin(), out.vgpus.end(), [](const SriovVgpu& a, const SriovVgpu& b) { return a.bdf < b.bdf; });
  std::sort(out.unresolved.begin(), out.unresolved.end(),
            [](const UnresolvedVgpu& a, const UnresolvedVgpu& b) { return a.bdf < b.bdf; });
}

absl::StatusOr<Framework> DetectFramework(const Discovery& found) {
  const bool mdev = !found.parents.empty() || !found.mdevs.empty();
  std::set<std::string> vfs;
  for (const SriovVgpu& vgpu : found.vgpus) vfs.insert(vgpu.bdf);
  for (const UnresolvedVgpu& vgpu : found.unresolved) vfs.insert(vgpu.bdf);
  if (mdev && !vfs.empty()) {
    std::set<std::string> parents;
    for (const MdevParent& parent : found.parents) parents.insert(parent.bdf);
    for (const Mdev& m : found.mdevs) parents.insert(m.parent_bdf);
    return absl::FailedPreconditionError(absl::StrCat(
        "both vGPU frameworks on one node: mdev parents ", absl::StrJoin(parents, ", "),
        " and SR-IOV vGPUs (nvidia/current_vgpu_type set) ", absl::StrJoin(vfs, ", "),
        "; a node runs one framework: remove the mdevs or reset the VFs' vGPU types to 0"));
  }
  if (mdev) return Framework::kMdev;
  return vfs.empty() ? Framework::kNone : Framework::kSriov;
}

}  // namespace

const char* FrameworkName(Framework framework) {
  switch (framework) {
    case Framework::kMdev: return "mdev";
    case Framework::kSriov: return "sriov";
    case Framework::kNone: break;
  }
  return "none";
}

bool IsMdevUuid(std::string_view text) {
  if (text.size() != 36) return false;
  for (size_t i = 0; i < text.size(); ++i) {
    const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash ? text[i] != '-' : !absl::ascii_isxdigit(static_cast<unsigned char>(text[i]))) return false;
  }
  return true;
}

absl::StatusOr<Discovery> Discover(const stdfs::path& sysfs_root, const pci::Inventory& inventory,
                                   CatalogStore& catalog) {
  absl::StatusOr<std::vector<std::string>> parents = ListIfPresent(sysfs_root / "class/mdev_bus");
  if (!parents.ok()) return parents.status();
  const stdfs::path devices_dir = sysfs_root / "bus/mdev/devices";
  absl::StatusOr<std::vector<std::string>> uuids = ListIfPresent(devices_dir);
  if (!uuids.ok()) return uuids.status();

  Discovery out;
  ReadParents(sysfs_root, *parents, out);
  for (const std::string& uuid : *uuids) {
    absl::StatusOr<Mdev> mdev = ReadMdev(devices_dir, uuid);
    if (mdev.ok()) {
      out.mdevs.push_back(*std::move(mdev));
    } else {
      out.errors.push_back({uuid, devices_dir / uuid, mdev.status()});
    }
  }
  ReadSriov(sysfs_root, inventory, catalog, out);
  out.framework = DetectFramework(out);
  return out;
}

}  // namespace vfio_agent::vgpu
