#include "vfio_gpu_agent/vgpu/apply.h"

#include <algorithm>
#include <array>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/binding/holders.h"
#include "vfio_gpu_agent/common/fs.h"
#include "vfio_gpu_agent/vgpu/discovery.h"

namespace vfio_agent::vgpu {
namespace {

namespace stdfs = std::filesystem;

std::string RandomUuid() {
  std::random_device random;
  std::array<uint8_t, 16> bytes{};
  for (uint8_t& byte : bytes) byte = static_cast<uint8_t>(random());
  bytes[6] = static_cast<uint8_t>((bytes[6] & 0x0f) | 0x40);  // version 4
  bytes[8] = static_cast<uint8_t>((bytes[8] & 0x3f) | 0x80);  // RFC 4122 variant
  std::string text;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) text += '-';
    absl::StrAppendFormat(&text, "%02x", bytes[i]);
  }
  return text;
}

// The host as one pass sees it.
struct Host {
  pci::Inventory inventory;
  Discovery discovery;
};

absl::StatusOr<Host> ReadHost(const ApplyOptions& options) {
  absl::StatusOr<pci::Inventory> inventory =
      pci::Scan(options.paths.sysfs_root, {.detail_vendor = pci::kVendorNvidia, .driver_override = false});
  if (!inventory.ok()) return inventory.status();
  absl::StatusOr<Discovery> discovery = Discover(options.paths.sysfs_root, *inventory, *options.catalog);
  if (!discovery.ok()) return discovery.status();
  return Host{*std::move(inventory), *std::move(discovery)};
}

// A GPU's own failure, in the words the node label's event carries: the GPU, then what failed and where.
absl::Status GpuError(const std::string& gpu, const absl::Status& cause) {
  return absl::Status(cause.code(), absl::StrCat("GPU ", gpu, ": ", cause.message()));
}

// One GPU: what the pass found of it and what it changes.
class GpuApplier {
 public:
  GpuApplier(const ApplyOptions& options, const Host& host, const std::string& gpu)
      : options_(options), host_(host), gpu_(gpu), framework_(FrameworkOf()) {}

  Framework framework() const { return framework_; }

  // The vGPUs of this GPU, for PlanGpu; an error when some cannot be known (planning without them could remove
  // or create the wrong ones).
  absl::StatusOr<std::vector<ExistingVgpu>> Existing() {
    for (const UnresolvedVgpu& vgpu : host_.discovery.unresolved) {
      if (vgpu.pf_bdf == gpu_) return absl::FailedPreconditionError(vgpu.reason);
    }
    for (const DeviceError& error : host_.discovery.errors) {
      // A device error is a BDF of this GPU, or an mdev UUID that could not be read (whose parent is unknown).
      const bool mdev_error = IsMdevUuid(error.device) && framework_ == Framework::kMdev;
      if (Owns(error.device) || mdev_error) return error.status;
    }
    std::vector<ExistingVgpu> existing;
    for (const Mdev& mdev : host_.discovery.mdevs) {
      if (!Owns(mdev.parent_bdf)) continue;
      existing.push_back({.id = mdev.uuid, .type = ShortTypeName(mdev.type_name), .held = false});
      groups_[mdev.uuid] = mdev.iommu_group;
    }
    for (const SriovVgpu& vgpu : host_.discovery.vgpus) {
      if (vgpu.pf_bdf != gpu_) continue;
      existing.push_back({.id = vgpu.bdf, .type = ShortTypeName(vgpu.type_name), .held = false});
      const pci::Function* fn = host_.inventory.Find(vgpu.bdf);
      groups_[vgpu.bdf] = fn != nullptr ? fn->iommu_group : std::nullopt;
    }
    return existing;
  }

  // After Existing(): which vGPUs a running VM or a prepared claim holds, from one walk of <proc> for the whole pass.
  void MarkHeld(const std::map<int, std::vector<binding::Holder>>& holders, std::vector<ExistingVgpu>& existing) {
    holders_ = &holders;
    for (ExistingVgpu& vgpu : existing) vgpu.held = !HolderText(vgpu.id).empty();
  }

  GpuApplyResult Apply(const std::map<std::string, int>& desired, const std::vector<ExistingVgpu>& existing) {
    GpuApplyResult result{.bdf = gpu_, .outcome = GpuOutcome::kApplied, .created = {}, .removed = {}, .held = {},
                          .error = absl::OkStatus()};
    const GpuChange change = PlanGpu(existing, desired);
    for (const std::string& id : change.deferred) {
      auto vgpu = std::find_if(existing.begin(), existing.end(), [&](const ExistingVgpu& e) { return e.id == id; });
      result.held.push_back(absl::StrCat(id, " (", vgpu->type, "): ", HolderText(id)));
    }
    // Before the first write: a change the card cannot hold is refused whole, the GPU left as it is.
    if (absl::Status fits = framework_ == Framework::kMdev ? MdevFits(change, existing) : SriovFits(change, existing);
        !fits.ok()) {
      result.outcome = absl::IsResourceExhausted(fits) ? GpuOutcome::kDoesNotFit : GpuOutcome::kFailed;
      result.error = GpuError(gpu_, fits);
      spdlog::warn("vGPU config: {}; nothing written", std::string(result.error.message()));
      return result;
    }
    for (const std::string& id : change.remove) {
      if (absl::Status status = RemoveVgpu(id); !status.ok()) return Undo(std::move(result), status);
      spdlog::info("vGPU config: GPU {}: removed vGPU {}", gpu_, id);
      result.removed.push_back(id);
    }
    for (const auto& [type, count] : change.create) {
      absl::Status status = framework_ == Framework::kMdev ? CreateMdevs(type, count, existing, result)
                                                            : CreateSriov(type, count, existing, result);
      if (!status.ok()) return Undo(std::move(result), status);
    }
    if (!change.deferred.empty()) result.outcome = GpuOutcome::kPendingHeld;
    return result;
  }

  GpuApplyResult Fail(const absl::Status& cause) const {
    return Fail({.bdf = gpu_, .outcome = GpuOutcome::kFailed, .created = {}, .removed = {}, .held = {},
                 .error = absl::OkStatus()},
                cause);
  }

 private:
  // The GPU's or one of its VFs' (the mdev parents of Ampere, the SR-IOV vGPUs).
  bool Owns(const std::string& bdf) const {
    if (bdf == gpu_) return true;
    const pci::Function* fn = host_.inventory.Find(bdf);
    return fn != nullptr && fn->physfn == gpu_;
  }

  Framework FrameworkOf() const {
    for (const MdevParent& parent : host_.discovery.parents) {
      if (Owns(parent.bdf)) return Framework::kMdev;
    }
    for (const Mdev& mdev : host_.discovery.mdevs) {
      if (Owns(mdev.parent_bdf)) return Framework::kMdev;
    }
    if (host_.discovery.cards.contains(gpu_) ||
        fs::Exists(options_.paths.PciDevice(gpu_) / "nvidia/creatable_vgpu_types")) {
      return Framework::kSriov;
    }
    return Framework::kNone;
  }

  std::string HolderText(const std::string& id) const {
    std::vector<std::string> texts;
    // A prepared claim holds its vGPU from Prepare on; its VM opens the group only once virt-launcher runs.
    if (auto claim = options_.claimed.find(id); claim != options_.claimed.end()) texts.push_back(claim->second);
    auto group = groups_.find(id);
    if (holders_ != nullptr && group != groups_.end() && group->second) {
      if (auto held = holders_->find(*group->second); held != holders_->end()) {
        for (const binding::Holder& holder : held->second) texts.push_back(holder.ToString());
      }
    }
    return absl::StrJoin(texts, ", ");
  }

  absl::Status RemoveVgpu(const std::string& id) const {
    const stdfs::path path = framework_ == Framework::kMdev
                                 ? options_.paths.sysfs_root / "bus/mdev/devices" / id / "remove"
                                 : options_.paths.PciDevice(id) / "nvidia/current_vgpu_type";
    if (absl::Status status = fs::WriteAttribute(path, framework_ == Framework::kMdev ? "1" : "0"); !status.ok()) {
      return absl::Status(status.code(), absl::StrCat("remove vGPU ", id, ": ", status.message()));
    }
    return absl::OkStatus();
  }

  // A vGPU this pass removed, made again as it was: the mdev under its UUID on its parent with its type id, the VF
  // with its type id.
  absl::Status RestoreVgpu(const std::string& id) const {
    for (const Mdev& mdev : host_.discovery.mdevs) {
      if (mdev.uuid != id) continue;
      const stdfs::path path = options_.paths.sysfs_root / "class/mdev_bus" / mdev.parent_bdf / "mdev_supported_types" /
                               mdev.type_id / "create";
      return fs::WriteAttribute(path, mdev.uuid);
    }
    for (const SriovVgpu& vgpu : host_.discovery.vgpus) {
      if (vgpu.bdf != id) continue;
      return fs::WriteAttribute(options_.paths.PciDevice(id) / "nvidia/current_vgpu_type", std::to_string(vgpu.type_id));
    }
    return absl::NotFoundError(absl::StrCat("vGPU ", id, " is not in this pass's discovery"));
  }

  // A write failed mid-way: the GPU goes back to what the pass found (created ones removed, removed ones made
  // again, in that order so the room is there), and the result says whether that worked.
  GpuApplyResult Undo(GpuApplyResult result, const absl::Status& cause) const {
    if (result.created.empty() && result.removed.empty()) return Fail(std::move(result), cause);
    std::vector<std::string> failures;
    for (auto it = result.created.rbegin(); it != result.created.rend(); ++it) {
      if (absl::Status status = RemoveVgpu(*it); !status.ok()) failures.emplace_back(status.message());
    }
    for (const std::string& id : result.removed) {
      if (absl::Status status = RestoreVgpu(id); !status.ok()) {
        failures.push_back(absl::StrCat("restore vGPU ", id, ": ", status.message()));
      }
    }
    const std::string what = absl::StrCat(result.created.size(), " vGPUs it created removed, ", result.removed.size(),
                                          " it removed made again");
    if (!failures.empty()) {
      spdlog::error("vGPU config: GPU {}: undoing this pass failed: {}", gpu_, absl::StrJoin(failures, "; "));
      return Fail(std::move(result), absl::Status(cause.code(), absl::StrCat(cause.message(), "; undoing the pass (",
                                                                             what, ") failed: ",
                                                                             absl::StrJoin(failures, "; "))));
    }
    spdlog::warn("vGPU config: GPU {}: {}; undone: {}", gpu_, std::string(cause.message()), what);
    result.created.clear();
    result.removed.clear();
    result.undone = true;
    return Fail(std::move(result), absl::Status(cause.code(), absl::StrCat(cause.message(), "; undone: the GPU is as it was (",
                                                                           what, ")")));
  }

  // The vGPUs the GPU keeps (not removed by `change`), by short type name.
  static std::map<std::string, int> Kept(const GpuChange& change, const std::vector<ExistingVgpu>& existing) {
    std::map<std::string, int> kept;
    for (const ExistingVgpu& vgpu : existing) {
      if (std::find(change.remove.begin(), change.remove.end(), vgpu.id) == change.remove.end()) ++kept[vgpu.type];
    }
    return kept;
  }

  static std::string CountsText(const std::map<std::string, int>& counts) {
    return absl::StrJoin(counts, ", ", [](std::string* out, const auto& entry) {
      absl::StrAppend(out, entry.second, "x ", entry.first);
    });
  }

  // mdev: every type offered by a parent of the GPU; a VF parent hosts one vGPU (Ampere); an instance of a type
  // takes 1/max_instance of the card (NVIDIA's description file), so the kept and the new ones must add up to at
  // most the whole card; with nothing removed, available_instances (the driver's own count, which also says
  // when a GPU runs one type at a time) bounds each type. ResourceExhausted: it does not fit.
  absl::Status MdevFits(const GpuChange& change, const std::vector<ExistingVgpu>& existing) const {
    if (change.create.empty()) return absl::OkStatus();
    std::map<std::string, const MdevType*> types;  // short name -> the first parent's offer
    std::vector<const MdevParent*> parents;
    std::set<std::string> occupied;  // VF parents whose instance stays
    for (const MdevParent& parent : host_.discovery.parents) {
      if (!Owns(parent.bdf)) continue;
      parents.push_back(&parent);
      for (const MdevType& type : parent.types) types.emplace(ShortTypeName(type.name), &type);
    }
    for (const Mdev& mdev : host_.discovery.mdevs) {
      const bool removed = std::find(change.remove.begin(), change.remove.end(), mdev.uuid) != change.remove.end();
      if (Owns(mdev.parent_bdf) && mdev.parent_bdf != gpu_ && !removed) occupied.insert(mdev.parent_bdf);
    }
    std::vector<std::string> offered;
    for (const auto& [name, type] : types) offered.push_back(name);
    for (const auto& [type, count] : change.create) {
      if (!types.contains(type)) {
        return absl::NotFoundError(absl::StrCat("create ", count, " ", type, ": no mdev parent of the GPU offers it",
                                                offered.empty() ? "" : absl::StrCat(" (offered: ", absl::StrJoin(offered, ", "), ")")));
      }
    }
    std::map<std::string, int> wanted = Kept(change, existing);
    for (const auto& [type, count] : change.create) wanted[type] += count;
    const std::string card = absl::StrCat("card ", gpu_);
    const bool vf_parents = std::any_of(parents.begin(), parents.end(), [&](const MdevParent* p) { return p->bdf != gpu_; });
    if (vf_parents) {
      int created = 0;
      for (const auto& [type, count] : change.create) created += count;
      const int free = static_cast<int>(std::count_if(parents.begin(), parents.end(), [&](const MdevParent* p) {
        return p->bdf != gpu_ && !occupied.contains(p->bdf);
      }));
      if (created > free) {
        return absl::ResourceExhaustedError(absl::StrCat(
            card, ": the config wants ", CountsText(wanted), "; each VF holds one vGPU and ", free, " of ",
            parents.size(), " VFs are free for the ", created, " to create: ", free, " possible"));
      }
    }
    // The card's share in units of 1/L, L the lcm of the max_instance of every type wanted.
    uint64_t lcm = 1;
    for (const auto& [type, count] : wanted) {
      auto it = types.find(type);
      if (it == types.end() || !it->second->max_instances) return absl::OkStatus();  // not known: the kernel decides
      lcm = std::lcm(lcm, static_cast<uint64_t>(*it->second->max_instances));
    }
    auto unit = [&](const std::string& type) { return lcm / static_cast<uint64_t>(*types.at(type)->max_instances); };
    uint64_t used = 0;
    for (const auto& [type, count] : wanted) used += static_cast<uint64_t>(count) * unit(type);
    if (used > lcm) {
      std::vector<std::string> over;
      for (const auto& [type, count] : change.create) {
        const uint64_t others = used - static_cast<uint64_t>(wanted[type]) * unit(type);
        const uint64_t possible = others >= lcm ? 0 : (lcm - others) / unit(type);
        over.push_back(absl::StrCat(type, " (", types.at(type)->id, ", max_instance ", *types.at(type)->max_instances,
                                    "): wanted ", wanted[type], ", possible ", possible,
                                    wanted.size() > 1 ? " beside the other types wanted" : ""));
      }
      return absl::ResourceExhaustedError(absl::StrCat(card, " cannot hold ", CountsText(wanted), ": ",
                                                       absl::StrJoin(over, "; ")));
    }
    if (change.remove.empty()) {
      for (const auto& [type, count] : change.create) {
        int available = 0;
        for (const MdevParent* parent : parents) {
          if (occupied.contains(parent->bdf)) continue;
          for (const MdevType& offer : parent->types) {
            if (ShortTypeName(offer.name) == type) available += offer.available_instances.value_or(0);
          }
        }
        if (count > available) {
          const std::map<std::string, int> kept = Kept(change, existing);
          return absl::ResourceExhaustedError(absl::StrCat(
              card, ": ", type, " (", types.at(type)->id, "): wanted ", wanted[type], ", possible ",
              wanted[type] - count + available, " (available_instances ", available,
              kept.empty() ? "" : absl::StrCat(" beside the ", CountsText(kept), " it keeps"), ")"));
        }
      }
    }
    return absl::OkStatus();
  }

  // SR-IOV: each vGPU is a VF on nvidia without a type, and the type must be in the card's catalog.
  absl::Status SriovFits(const GpuChange& change, const std::vector<ExistingVgpu>& existing) const {
    if (change.create.empty()) return absl::OkStatus();
    auto key = host_.discovery.cards.find(gpu_);
    if (key == host_.discovery.cards.end()) {
      return absl::FailedPreconditionError(absl::StrCat("no VF of the GPU is on ", kNvidiaDriver, " (",
                                                        options_.paths.PciDevice(gpu_).string(), "/virtfn*)"));
    }
    std::set<std::string> names;
    std::vector<std::string> known;
    for (const auto& [id, name] : options_.catalog->Types(key->second)) {
      names.insert(ShortTypeName(name));
      known.push_back(absl::StrCat(id, " ", name));
    }
    int created = 0;
    for (const auto& [type, count] : change.create) {
      if (!names.contains(type)) {
        return absl::NotFoundError(absl::StrCat("create ", type, ": not a type of card ", key->second.ToString(),
                                                " (its catalog: ", known.empty() ? "none seen" : absl::StrJoin(known, ", "),
                                                ")"));
      }
      created += count;
    }
    std::set<std::string> taken;
    for (const ExistingVgpu& vgpu : existing) taken.insert(vgpu.id);
    for (const std::string& id : change.remove) taken.erase(id);
    int free = 0;
    for (const pci::Function& fn : host_.inventory.functions()) {
      free += fn.physfn == gpu_ && fn.driver == kNvidiaDriver && !taken.contains(fn.bdf);
    }
    if (created > free) {
      std::map<std::string, int> wanted = Kept(change, existing);
      for (const auto& [type, count] : change.create) wanted[type] += count;
      return absl::ResourceExhaustedError(absl::StrCat("card ", gpu_, ": the config wants ", CountsText(wanted),
                                                       "; each vGPU is a VF and ", free, " VFs on ", kNvidiaDriver,
                                                       " are free for the ", created, " to create: ", free,
                                                       " possible"));
    }
    return absl::OkStatus();
  }

  GpuApplyResult Fail(GpuApplyResult result, const absl::Status& cause) const {
    result.outcome = GpuOutcome::kFailed;
    result.error = GpuError(gpu_, cause);
    return result;
  }

  // Turing and older: the GPU is the parent of every instance. Ampere: each VF is the parent of at most one.
  absl::Status CreateMdevs(const std::string& type, int count, const std::vector<ExistingVgpu>& existing,
                           GpuApplyResult& result) {
    std::set<std::string> occupied;  // VF parents with an instance that stays
    for (const Mdev& mdev : host_.discovery.mdevs) {
      const bool stays = std::any_of(existing.begin(), existing.end(), [&](const ExistingVgpu& e) { return e.id == mdev.uuid; }) &&
                         std::find(result.removed.begin(), result.removed.end(), mdev.uuid) == result.removed.end();
      if (Owns(mdev.parent_bdf) && mdev.parent_bdf != gpu_ && stays) occupied.insert(mdev.parent_bdf);
    }
    for (const std::string& created : created_on_) occupied.insert(created);
    std::vector<std::string> offered;
    for (int made = 0; made < count; ++made) {
      const MdevParent* parent = nullptr;
      const MdevType* chosen = nullptr;
      for (const MdevParent& candidate : host_.discovery.parents) {
        if (!Owns(candidate.bdf) || occupied.contains(candidate.bdf)) continue;
        for (const MdevType& offer : candidate.types) {
          if (ShortTypeName(offer.name) == type) chosen = &offer;
          offered.push_back(ShortTypeName(offer.name));
        }
        if (chosen != nullptr) {
          parent = &candidate;
          break;
        }
      }
      if (chosen == nullptr) {
        std::sort(offered.begin(), offered.end());
        offered.erase(std::unique(offered.begin(), offered.end()), offered.end());
        return absl::ResourceExhaustedError(absl::StrCat(
            "create ", count - made, " more ", type, ": no mdev parent of the GPU offers it",
            offered.empty() ? " (every VF holds an instance)" : absl::StrCat(" (offered: ", absl::StrJoin(offered, ", "), ")")));
      }
      const std::string uuid = options_.new_uuid ? options_.new_uuid() : RandomUuid();
      const stdfs::path path = options_.paths.sysfs_root / "class/mdev_bus" / parent->bdf / "mdev_supported_types" /
                               chosen->id / "create";
      if (absl::Status status = fs::WriteAttribute(path, uuid); !status.ok()) {
        return absl::Status(status.code(), absl::StrCat("create ", type, " on ", parent->bdf, ": ", status.message()));
      }
      spdlog::info("vGPU config: GPU {}: created mdev {} ({}) on {}", gpu_, uuid, chosen->name, parent->bdf);
      result.created.push_back(uuid);
      if (parent->bdf != gpu_) {
        occupied.insert(parent->bdf);
        created_on_.insert(parent->bdf);
      }
    }
    return absl::OkStatus();
  }

  absl::Status CreateSriov(const std::string& type, int count, const std::vector<ExistingVgpu>& existing,
                           GpuApplyResult& result) {
    auto key = host_.discovery.cards.find(gpu_);
    if (key == host_.discovery.cards.end()) {
      return absl::FailedPreconditionError(absl::StrCat("create ", type, ": no VF of the GPU is on ", kNvidiaDriver,
                                                        " (", options_.paths.PciDevice(gpu_).string(), "/virtfn*)"));
    }
    std::optional<int> type_id;
    std::vector<std::string> known;
    for (const auto& [id, name] : options_.catalog->Types(key->second)) {
      if (ShortTypeName(name) == type) type_id = id;
      known.push_back(absl::StrCat(id, " ", name));
    }
    if (!type_id) {
      return absl::NotFoundError(absl::StrCat("create ", type, ": not a type of card ", key->second.ToString(),
                                              " (its catalog: ", known.empty() ? "none seen" : absl::StrJoin(known, ", "),
                                              ")"));
    }
    std::set<std::string> taken;  // VFs with a type that stays, or given one in this pass
    for (const ExistingVgpu& vgpu : existing) taken.insert(vgpu.id);
    for (const std::string& removed : result.removed) taken.erase(removed);
    taken.insert(result.created.begin(), result.created.end());
    int made = 0;
    for (const pci::Function& fn : host_.inventory.functions()) {
      if (made == count) break;
      if (fn.physfn != gpu_ || fn.driver != kNvidiaDriver || taken.contains(fn.bdf)) continue;
      const stdfs::path path = options_.paths.PciDevice(fn.bdf) / "nvidia/current_vgpu_type";
      if (absl::Status status = fs::WriteAttribute(path, std::to_string(*type_id)); !status.ok()) {
        return absl::Status(status.code(), absl::StrCat("create ", type, " (type ", *type_id, ") on ", fn.bdf, ": ",
                                                        status.message()));
      }
      spdlog::info("vGPU config: GPU {}: VF {} is now {} (type {})", gpu_, fn.bdf, type, *type_id);
      result.created.push_back(fn.bdf);
      ++made;
    }
    if (made < count) {
      return absl::ResourceExhaustedError(absl::StrCat("create ", count - made, " more ", type,
                                                       ": no free VF of the GPU on ", kNvidiaDriver));
    }
    return absl::OkStatus();
  }

  const ApplyOptions& options_;
  const Host& host_;
  const std::string gpu_;
  const Framework framework_;
  const std::map<int, std::vector<binding::Holder>>* holders_ = nullptr;
  std::map<std::string, std::optional<int>> groups_;  // vGPU id -> its IOMMU group
  std::set<std::string> created_on_;                  // VF parents given an instance in this pass
};

// SR-IOV disabled on a GPU the config gives vGPUs, which is no mdev parent itself: every VF it can have.
// nullopt when nothing was needed; else whether it was written.
std::optional<absl::Status> EnableVfsIfNeeded(const ApplyOptions& options, const Host& host, const std::string& gpu) {
  for (const MdevParent& parent : host.discovery.parents) {
    if (parent.bdf == gpu) return std::nullopt;
  }
  const stdfs::path dir = options.paths.PciDevice(gpu);
  absl::StatusOr<int64_t> total = fs::ReadInt(dir / "sriov_totalvfs");
  if (!total.ok() || *total <= 0) return std::nullopt;  // no SR-IOV: the GPU's framework decides what fails
  absl::StatusOr<int64_t> enabled = fs::ReadInt(dir / "sriov_numvfs");
  if (!enabled.ok()) return enabled.status();
  if (*enabled > 0) return std::nullopt;
  if (absl::Status status = fs::WriteAttribute(dir / "sriov_numvfs", std::to_string(*total)); !status.ok()) {
    return absl::Status(status.code(), absl::StrCat("enable VFs: ", status.message()));
  }
  spdlog::info("vGPU config: GPU {}: enabled {} VFs", gpu, *total);
  return absl::OkStatus();
}

}  // namespace

std::vector<ConfigGpu> ConfigGpus(const pci::Inventory& inventory) {
  std::vector<ConfigGpu> gpus;
  for (const pci::Function& fn : inventory.functions()) {
    const uint32_t base_sub = fn.class_code >> 8;  // 0x0300 display (VGA), 0x0302 3D controller
    if (fn.vendor_id != pci::kVendorNvidia || fn.IsVirtualFunction() || (base_sub != 0x0300 && base_sub != 0x0302)) {
      continue;
    }
    gpus.push_back({.index = static_cast<int>(gpus.size()), .bdf = fn.bdf, .vendor_id = fn.vendor_id,
                    .device_id = fn.device_id});
  }
  return gpus;
}

const char* GpuOutcomeName(GpuOutcome outcome) {
  switch (outcome) {
    case GpuOutcome::kApplied: return "applied";
    case GpuOutcome::kPendingHeld: return "pending-held";
    case GpuOutcome::kFailed: return "failed";
    case GpuOutcome::kDoesNotFit: return "does-not-fit";
  }
  return "failed";
}

bool ApplyReport::changed() const {
  return enabled_vfs || std::any_of(gpus.begin(), gpus.end(), [](const GpuApplyResult& gpu) {
           return !gpu.created.empty() || !gpu.removed.empty() || gpu.undone;
         });
}

bool ApplyReport::RetryLater() const {
  return std::any_of(gpus.begin(), gpus.end(), [](const GpuApplyResult& gpu) {
    return gpu.outcome == GpuOutcome::kFailed || gpu.outcome == GpuOutcome::kPendingHeld;
  });
}

std::string ApplyReport::State() const {
  auto any = [&](GpuOutcome outcome) {
    return std::any_of(gpus.begin(), gpus.end(), [&](const GpuApplyResult& gpu) { return gpu.outcome == outcome; });
  };
  if (any(GpuOutcome::kFailed) || any(GpuOutcome::kDoesNotFit)) return "failed";
  if (any(GpuOutcome::kPendingHeld)) return "pending";
  return "success";
}

absl::StatusOr<ApplyReport> ApplyVgpuConfig(const ApplyOptions& options, const VgpuConfigFile& file,
                                            std::string_view config_name) {
  if (options.catalog == nullptr) return absl::InvalidArgumentError("vGPU config: no catalog store");
  absl::StatusOr<Host> host = ReadHost(options);
  if (!host.ok()) return host.status();
  absl::StatusOr<std::map<std::string, std::map<std::string, int>>> desired =
      DesiredTypes(file, config_name, ConfigGpus(host->inventory));
  if (!desired.ok()) return desired.status();

  ApplyReport report;
  std::map<std::string, absl::Status> failed;  // GPUs whose VFs could not be enabled
  // First the VFs: on Ampere they are the mdev parents, on SR-IOV vGPU cards the vGPUs; only then is a GPU's
  // framework known.
  for (const auto& [gpu, types] : *desired) {
    if (types.empty()) continue;
    std::optional<absl::Status> enabled = EnableVfsIfNeeded(options, *host, gpu);
    if (!enabled) continue;
    if (enabled->ok()) {
      report.enabled_vfs = true;
    } else {
      failed[gpu] = *enabled;
    }
  }
  if (report.enabled_vfs) {
    host = ReadHost(options);
    if (!host.ok()) return host.status();
  }
  if (!host->discovery.framework.ok()) return host->discovery.framework.status();

  std::map<Framework, std::vector<std::string>> used;  // framework -> GPUs with vGPUs wanted or present
  for (const auto& [gpu, types] : *desired) {
    const Framework framework = GpuApplier(options, *host, gpu).framework();
    if (framework != Framework::kNone) used[framework].push_back(gpu);
  }
  if (used.size() > 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "vGPU config '", std::string(config_name), "' needs both vGPU frameworks on one node: mdev on ",
        absl::StrJoin(used[Framework::kMdev], ", "), " and SR-IOV on ", absl::StrJoin(used[Framework::kSriov], ", "),
        "; a node runs one framework"));
  }

  std::optional<std::map<int, std::vector<binding::Holder>>> holders;  // read once, when a removal is planned
  for (const auto& [gpu, types] : *desired) {
    GpuApplier applier(options, *host, gpu);
    if (auto it = failed.find(gpu); it != failed.end()) {
      report.gpus.push_back(applier.Fail(it->second));
      continue;
    }
    absl::StatusOr<std::vector<ExistingVgpu>> existing = applier.Existing();
    if (!existing.ok()) {
      report.gpus.push_back(applier.Fail(existing.status()));
      continue;
    }
    if (applier.framework() == Framework::kNone && !types.empty()) {
      report.gpus.push_back(applier.Fail(absl::FailedPreconditionError(absl::StrCat(
          "no vGPU manager on the GPU: neither an mdev parent (", (options.paths.sysfs_root / "class/mdev_bus").string(),
          ") nor SR-IOV vGPU attributes (", (options.paths.PciDevice(gpu) / "nvidia/creatable_vgpu_types").string(),
          ")"))));
      continue;
    }
    // Whether a vGPU is held matters only for one the plan would remove: the /proc walk is skipped otherwise.
    if (!PlanGpu(*existing, types).remove.empty()) {
      if (!holders) holders = binding::VfioGroupOpenersByGroup(options.paths);
      applier.MarkHeld(*holders, *existing);
    }
    report.gpus.push_back(applier.Apply(types, *existing));
  }
  return report;
}

}  // namespace vfio_agent::vgpu
