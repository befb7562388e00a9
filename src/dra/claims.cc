#include "claims.h"

#include <array>

#include <algorithm>
#include <optional>
#include <set>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "cdi/v1/spec.pb.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/common/fs.h"
#include "vfio_gpu_agent/dra/checkpoint.h"
#include "vfio_gpu_agent/dra/device_names.h"
#include "vfio_gpu_agent/dra/vfio_backend.h"
#include "vfio_gpu_agent/pci/vfio_health.h"

namespace vfio_agent::dra::internal {
namespace {

using Json = nlohmann::ordered_json;

// KEP-5304 (k8s.io/dynamic-resource-allocation/api/metadata): where the container finds a request's metadata.
constexpr char kMetadataContainerDir[] = "/var/run/kubernetes.io/dra-device-attributes";
constexpr char kPodClaimNameAnnotation[] = "resource.kubernetes.io/pod-claim-name";
constexpr char kPciBusIdAttribute[] = "resource.kubernetes.io/pciBusID";
// The versions of the metadata file, newest first, as the Go helper writes them from Kubernetes 1.37 on: a reader
// takes the first object of a version it knows (KubeVirt 1.9 knows v1alpha1 only).
constexpr std::array<const char*, 2> kMetadataApiVersions = {"metadata.resource.k8s.io/v1beta1",
                                                             "metadata.resource.k8s.io/v1alpha1"};
// Set by the scheduler on the claim it creates for a pod's extended-resource request (DRAExtendedResource).
// A claim's files serve this boot only: the checkpoint of another boot is discarded with them (Load), and the CDI
// directory is a tmpfs. So no fsync (ten disk flushes for an 8-GPU claim).
constexpr fs::Durability kClaimFiles = fs::Durability::kThisBoot;
constexpr char kExtendedResourceClaimAnnotation[] = "resource.kubernetes.io/extended-resource-claim";

std::string ClaimRef(const std::string& namespace_name, const std::string& name, const std::string& uid) {
  return absl::StrCat("claim ", namespace_name, "/", name, " (", uid, ")");
}
std::string ClaimRef(const drav1::Claim& claim) { return ClaimRef(claim.namespace_(), claim.name(), claim.uid()); }

// The request a result belongs to, without its subrequest ("gpus/h200" -> "gpus"), as the kubelet matches it.
std::string BaseRequest(const std::string& request) { return request.substr(0, request.find('/')); }

// A claim UID (a UUID) becomes part of file names: only what a UUID holds is accepted.
bool IsSafeUid(const std::string& uid) {
  return !uid.empty() && uid.size() <= 64 &&
         std::all_of(uid.begin(), uid.end(), [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'; });
}

Json DeviceJson(const PreparedDevice& device) {
  Json json = {{"request", device.request}, {"pool", device.pool}, {"device", device.device}, {"bdf", device.bdf},
               {"cdiDeviceIds", device.cdi_ids}};
  if (!device.mdev_uuid.empty()) json["mdevUUID"] = device.mdev_uuid;
  return json;
}

Json CheckpointJson(const PreparedClaim& claim) {
  Json devices = Json::array();
  for (const PreparedDevice& device : claim.devices) devices.push_back(DeviceJson(device));
  Json json = {{"bootID", claim.boot_id},       {"namespace", claim.namespace_name},
               {"name", claim.name},            {"uid", claim.uid},
               {"cdiSpec", claim.cdi_spec},     {"metadataDir", claim.metadata_dir},
               {"devices", std::move(devices)}, {"driversBeforeBind", claim.drivers_before_bind}};
  if (!claim.fabric_partitions.empty()) json["fabricPartitions"] = claim.fabric_partitions;
  if (!claim.consumers.empty()) json["consumers"] = claim.consumers;
  if (claim.pending) json["pending"] = true;
  if (claim.prebound) json["boundBeforePrepare"] = true;
  return json;
}

absl::StatusOr<PreparedClaim> ParseCheckpoint(const std::filesystem::path& file) {
  absl::StatusOr<std::string> text = fs::ReadTrimmed(file);
  if (!text.ok()) return text.status();
  const Json json = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
  auto str = [&](const Json& object, const char* key) {
    return object.is_object() && object.contains(key) && object[key].is_string() ? object[key].get<std::string>() : "";
  };
  if (!json.is_object() || !json.contains("devices") || !json["devices"].is_array() || str(json, "uid").empty()) {
    return absl::DataLossError(absl::StrCat("checkpoint ", file.string(), " is not a prepared claim"));
  }
  PreparedClaim claim{.namespace_name = str(json, "namespace"),
                      .name = str(json, "name"),
                      .uid = str(json, "uid"),
                      .boot_id = str(json, "bootID"),
                      .cdi_spec = str(json, "cdiSpec"),
                      .metadata_dir = str(json, "metadataDir")};
  for (const Json& device : json["devices"]) {
    PreparedDevice entry{.request = str(device, "request"), .pool = str(device, "pool"), .device = str(device, "device"),
                         .bdf = str(device, "bdf"), .mdev_uuid = str(device, "mdevUUID")};
    if (device.contains("cdiDeviceIds") && device["cdiDeviceIds"].is_array()) {
      for (const Json& id : device["cdiDeviceIds"]) {
        if (id.is_string()) entry.cdi_ids.push_back(id.get<std::string>());
      }
    }
    claim.devices.push_back(std::move(entry));
  }
  // An agent restarted between Prepare and Unprepare still returns each function where it was.
  if (json.contains("driversBeforeBind") && json["driversBeforeBind"].is_object()) {
    for (const auto& [bdf, driver] : json["driversBeforeBind"].items()) {
      if (driver.is_string()) claim.drivers_before_bind[bdf] = driver.get<std::string>();
    }
  }
  if (json.contains("fabricPartitions") && json["fabricPartitions"].is_array()) {
    for (const Json& id : json["fabricPartitions"]) {
      if (id.is_number_unsigned()) claim.fabric_partitions.push_back(id.get<uint32_t>());
    }
  }
  if (json.contains("consumers") && json["consumers"].is_array()) {
    for (const Json& uid : json["consumers"]) {
      if (uid.is_string()) claim.consumers.push_back(uid.get<std::string>());
    }
  }
  claim.pending = json.contains("pending") && json["pending"].is_boolean() && json["pending"].get<bool>();
  claim.prebound = json.contains("boundBeforePrepare") && json["boundBeforePrepare"].is_boolean() &&
                   json["boundBeforePrepare"].get<bool>();
  return claim;
}

// What KubeVirt reads a device from: the bare mdevUUID of an mdev vGPU, else the PCI address (a GPU, an SR-IOV
// vGPU's VF).
Json MetadataAttributes(const std::vector<PreparedDevice>& prepared, const std::string& device) {
  Json attributes = Json::object();
  for (const PreparedDevice& entry : prepared) {
    if (entry.device != device) continue;
    if (!entry.mdev_uuid.empty()) {
      attributes[std::string(kMdevUuidAttribute)] = {{"string", entry.mdev_uuid}};
    } else {
      attributes[kPciBusIdAttribute] = {{"string", entry.bdf}};
    }
  }
  return attributes;
}

// The KEP-5304 metadata of one request: a JSON stream of the same object once per version, newest first.
std::string MetadataJson(const kube::ResourceClaim& claim, const std::string& driver,
                         const std::vector<const kube::AllocationResult*>& results,
                         const std::vector<PreparedDevice>& prepared) {
  std::map<std::string, Json> requests;  // full request name -> devices
  for (const kube::AllocationResult* result : results) {
    Json attributes = MetadataAttributes(prepared, result->device);
    requests[result->request].push_back(
        {{"driver", driver}, {"pool", result->pool}, {"name", result->device}, {"attributes", std::move(attributes)}});
  }
  Json object = {{"apiVersion", ""},
                 {"kind", "DeviceMetadata"},
                 {"metadata", {{"name", claim.name}, {"namespace", claim.namespace_name}, {"uid", claim.uid},
                               {"generation", 1}}}};
  if (auto it = claim.annotations.find(kPodClaimNameAnnotation); it != claim.annotations.end()) {
    object["podClaimName"] = it->second;
  }
  object["requests"] = Json::array();
  for (auto& [name, devices] : requests) object["requests"].push_back({{"name", name}, {"devices", std::move(devices)}});
  std::string stream;
  for (const char* version : kMetadataApiVersions) {
    object["apiVersion"] = version;
    absl::StrAppend(&stream, object.dump(), "\n");
  }
  return stream;
}

// Where the container reads a request's metadata: by claim name, or by the pod's claim name for a template's claim.
std::string MetadataContainerPath(const kube::ResourceClaim& claim, const std::string& driver,
                                  const std::string& request) {
  auto it = claim.annotations.find(kPodClaimNameAnnotation);
  const std::string scope = it != claim.annotations.end()
                                ? absl::StrCat("resourceclaimtemplates/", it->second)
                                : absl::StrCat("resourceclaims/", claim.name);
  return absl::StrCat(kMetadataContainerDir, "/", scope, "/", request, "/", driver, "-metadata.json");
}

std::set<std::string> BdfsOf(const PreparedClaim& claim) {
  std::set<std::string> bdfs;
  for (const PreparedDevice& device : claim.devices) bdfs.insert(device.bdf);
  return bdfs;
}

// Whether two claims serve one pod: only then may they hold GPUs of one IOMMU group.
bool ShareConsumer(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  return std::any_of(a.begin(), a.end(), [&](const std::string& uid) { return std::find(b.begin(), b.end(), uid) != b.end(); });
}

// The driver of every function a bind of `bdfs`' IOMMU groups may move (each member not on a vfio driver, bridges
// aside), as the host has them before the bind.
RecordedDrivers DriversOffVfio(const pci::Inventory& inventory, const std::vector<std::string>& bdfs) {
  RecordedDrivers drivers;
  for (const std::string& bdf : bdfs) {
    const pci::Function* fn = inventory.Find(bdf);
    if (fn == nullptr || !fn->iommu_group) continue;
    const pci::IommuGroup* group = inventory.Group(*fn->iommu_group);
    if (group == nullptr) continue;
    for (const std::string& member : group->members) {
      const pci::Function* function = inventory.Find(member);
      if (function != nullptr && !function->IsBridge() && !pci::IsVfioDriver(function->driver)) {
        drivers[member] = function->driver;
      }
    }
  }
  return drivers;
}

absl::StatusOr<std::string> ReadBootId(const HostPaths& paths) {
  return fs::ReadTrimmed(paths.proc_root / "sys/kernel/random/boot_id");
}

}  // namespace

void AddCdiNodes(const std::vector<std::string>& paths, cdi::v1::ContainerEdits* edits) {
  for (const std::string& path : paths) {
    cdi::v1::DeviceNode* node = edits->add_device_nodes();
    node->set_path(path);
    node->set_permissions("rw");
  }
}

drav1::NodePrepareResourceResponse ToResponse(const PreparedClaim& claim) {
  drav1::NodePrepareResourceResponse response;
  for (const PreparedDevice& prepared : claim.devices) {
    drav1::Device* device = response.add_devices();
    device->add_request_names(prepared.request);
    device->set_pool_name(prepared.pool);
    device->set_device_name(prepared.device);
    for (const std::string& id : prepared.cdi_ids) device->add_cdi_device_ids(id);
  }
  return response;
}

ClaimPreparer::ClaimPreparer(const DriverOptions& options, FabricClaims* fabric, MoveTracker* moves)
    : options_(options),
      fabric_(fabric),
      moves_(moves),
      names_(options.pci_ids, options.domain, options.overrides),
      plugin_dir_(options.plugins_dir / options.driver_name),
      vgpu_catalog_(options.vgpu_catalog_file) {
  if (options.bind_on_prepare) bind_.emplace(options.paths, options.policy, moves);
}

std::filesystem::path ClaimPreparer::CheckpointFile(const std::string& uid) const {
  return CheckpointDir(options_) / (uid + ".json");
}

absl::Status ClaimPreparer::Load() {
  absl::StatusOr<std::string> boot_id = ReadBootId(options_.paths);
  if (!boot_id.ok()) return boot_id.status();
  boot_id_ = *boot_id;
  const std::filesystem::path dir = CheckpointDir(options_);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("create ", dir.string(), ": ", ec.message()));
  absl::StatusOr<std::vector<std::string>> files = fs::ListDir(dir);
  if (!files.ok()) return files.status();
  for (const std::string& file : *files) {
    if (!file.ends_with(".json")) continue;
    const std::filesystem::path path = dir / file;
    absl::StatusOr<PreparedClaim> claim = ParseCheckpoint(path);
    if (!claim.ok()) {
      spdlog::warn("DRA checkpoint {}: {}; ignored", path.string(), std::string(claim.status().message()));
      continue;
    }
    if (claim->boot_id != boot_id_) {
      spdlog::info("DRA claim {}/{} ({}) was prepared in boot {}, this is {}: discarded", claim->namespace_name,
                   claim->name, claim->uid, claim->boot_id, boot_id_);
      if (absl::Status removed = Remove(*claim); !removed.ok()) {
        spdlog::warn("DRA claim {}: {}", claim->uid, std::string(removed.message()));
      }
      continue;
    }
    const std::string uid = claim->uid;
    if (claim->pending) {
      // The process ended inside a Prepare: the kubelet never had an answer and asks again, so undo it.
      spdlog::warn("DRA claim {}/{} ({}): a Prepare did not finish before the agent stopped; undoing it",
                   claim->namespace_name, claim->name, uid);
      if (absl::Status undone = UndoPending(*claim, absl::Now() + kCallBudget); !undone.ok()) {
        spdlog::error("DRA claim {}/{} ({}): {}; its devices stay held until the kubelet's retry undoes it",
                      claim->namespace_name, claim->name, uid, std::string(undone.message()));
        prepared_[uid] = *std::move(claim);
      }
      continue;
    }
    if (fabric_ != nullptr) {
      fabric_->Restore(uid, ClaimRef(claim->namespace_name, claim->name, uid), BdfsOf(*claim),
                       claim->fabric_partitions);
    }
    prepared_[uid] = *std::move(claim);
  }
  PublishHolds();
  return absl::OkStatus();
}

void ClaimPreparer::OnHoldsChanged(std::function<void(const std::vector<GroupHold>&)> changed) {
  holds_changed_ = std::move(changed);
}

std::vector<GroupHold> ClaimPreparer::Holds() const {
  std::vector<GroupHold> holds;
  for (const auto& [uid, claim] : prepared_) {
    for (const PreparedDevice& device : claim.devices) {
      if (device.bdf.empty() || !device.mdev_uuid.empty() || VgpuOfDevice(device.device).ok()) continue;
      const std::optional<int> group = IommuGroupOf(options_.paths, device.bdf);
      if (!group) continue;  // gone from sysfs: no sibling left to hold either
      holds.push_back({.bdf = device.bdf,
                       .group = *group,
                       .claim = ClaimRef(claim.namespace_name, claim.name, uid),
                       .consumers = claim.consumers});
    }
  }
  return holds;
}

void ClaimPreparer::PublishHolds() {
  if (!holds_changed_) return;
  std::vector<GroupHold> holds = Holds();
  if (holds == holds_published_) return;
  holds_published_ = std::move(holds);
  holds_changed_(holds_published_);
}

std::vector<PreparedClaim> ClaimPreparer::Prepared() const {
  std::vector<PreparedClaim> claims;
  for (const auto& [uid, claim] : prepared_) claims.push_back(claim);
  return claims;
}

absl::Status ClaimPreparer::Forget(const std::string& uid) {
  absl::Cleanup published = [this] { PublishHolds(); };
  auto it = prepared_.find(uid);
  if (it == prepared_.end()) return absl::OkStatus();  // unprepared meanwhile
  if (absl::Status released = Release(it->second, absl::Now() + kCallBudget); !released.ok()) return released;
  prepared_.erase(it);
  return absl::OkStatus();
}

absl::Status ClaimPreparer::Remove(const PreparedClaim& claim) const {
  // The checkpoint goes last, so a claim whose files could not all be removed is still known and retried.
  for (const std::filesystem::path& path : {claim.cdi_spec, claim.metadata_dir, CheckpointFile(claim.uid)}) {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
    if (ec) return absl::UnavailableError(absl::StrCat("remove ", path.string(), ": ", ec.message()));
  }
  if (fabric_ != nullptr) fabric_->Release(claim.uid);  // the partition goes once nothing names its GPUs
  return absl::OkStatus();
}

absl::Status ClaimPreparer::WriteCheckpoint(const PreparedClaim& claim) const {
  return fs::WriteFileAtomically(CheckpointFile(claim.uid), CheckpointJson(claim).dump(2) + "\n", 0644, kClaimFiles);
}

RecordedDrivers ClaimPreparer::HandOverSharedGroups(const PreparedClaim& claim) {
  RecordedDrivers mine = claim.drivers_before_bind;
  for (auto& [uid, other] : prepared_) {
    if (uid == claim.uid) continue;
    std::set<int> groups;
    for (const PreparedDevice& device : other.devices) {
      if (std::optional<int> group = IommuGroupOf(options_.paths, device.bdf)) groups.insert(*group);
    }
    bool handed = false;
    for (auto it = mine.begin(); it != mine.end();) {
      std::optional<int> group = IommuGroupOf(options_.paths, it->first);
      if (!group || !groups.contains(*group)) {
        ++it;
        continue;
      }
      spdlog::info("DRA claim {}/{} ({}): {} stays on vfio-pci, its IOMMU group {} is in claim {}/{} ({}) too",
                   claim.namespace_name, claim.name, claim.uid, it->first, *group, other.namespace_name, other.name,
                   uid);
      other.drivers_before_bind.insert(*it);
      it = mine.erase(it);
      handed = true;
    }
    if (handed) {
      if (absl::Status written = WriteCheckpoint(other); !written.ok()) {
        spdlog::error("DRA claim {}/{} ({}): {}", other.namespace_name, other.name, uid, std::string(written.message()));
      }
    }
  }
  return mine;
}

absl::Status ClaimPreparer::UndoPending(const PreparedClaim& claim, absl::Time deadline) const {
  RecordedDrivers moved;
  for (const auto& [bdf, driver] : claim.drivers_before_bind) {
    absl::StatusOr<std::string> now = fs::ReadLinkBasename(options_.paths.PciDevice(bdf) / "driver");
    if (now.ok() && pci::IsVfioDriver(*now)) moved[bdf] = driver;
  }
  if (!moved.empty()) {
    const BindOnPrepare returner(options_.paths, options_.policy, moves_);
    if (absl::Status returned = returner.Return(moved, deadline); !returned.ok()) return returned;
    for (const auto& [bdf, driver] : moved) {
      spdlog::info("DRA claim {}/{} ({}): {} returned to {} (unfinished Prepare)", claim.namespace_name, claim.name,
                   claim.uid, bdf, driver.empty() ? "no driver" : driver);
    }
  }
  return Remove(claim);
}

absl::Status ClaimPreparer::Release(const PreparedClaim& claim, absl::Time deadline) {
  if (claim.pending) return UndoPending(claim, deadline);
  // Functions first: a claim whose GPUs could not go back keeps its checkpoint, so a retry still knows where.
  if (bind_ && !claim.drivers_before_bind.empty()) {
    const RecordedDrivers returning = HandOverSharedGroups(claim);
    if (absl::Status returned = bind_->Return(returning, deadline); !returned.ok()) return returned;
    for (const auto& [bdf, driver] : returning) {
      spdlog::info("DRA claim {}/{} ({}): {} returned to {}", claim.namespace_name, claim.name, claim.uid, bdf,
                   driver.empty() ? "no driver" : driver);
    }
  }
  return Remove(claim);
}

absl::Status ClaimPreparer::CheckNotHeld(const std::string& bdf, const std::string& device,
                                         const kube::ResourceClaim& claim) const {
  const std::optional<int> group = IommuGroupOf(options_.paths, bdf);
  for (const auto& [other_uid, other] : prepared_) {
    if (other_uid == claim.uid) continue;
    const std::string holder = absl::StrCat("prepared claim ", other.namespace_name, "/", other.name, " (", other.uid, ")");
    for (const PreparedDevice& held : other.devices) {
      if (held.bdf.empty()) continue;  // an mdev vGPU is no whole function
      if (held.bdf == bdf) {
        return absl::FailedPreconditionError(absl::StrCat("device ", device, " (", bdf, ") is held by ", holder));
      }
      if (group && IommuGroupOf(options_.paths, held.bdf) == group && !ShareConsumer(claim.reserved_for, other.consumers)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "device ", device, " (", bdf, ") shares IOMMU group ", *group, " with ", held.device, " (", held.bdf,
            ") of ", holder, ", reserved for another pod: a group is passed to one VM whole"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<RecordedDrivers> ClaimPreparer::BindDevices(const std::vector<std::string>& bdfs,
                                                           const kube::ResourceClaim& claim,
                                                           absl::Time call_start) const {
  for (const std::string& bdf : bdfs) {
    if (absl::Status held = CheckNotHeld(bdf, DeviceName(bdf), claim); !held.ok()) return held;
  }
  return bind_->Bind(bdfs, call_start);
}

absl::Status ClaimPreparer::CheckDevice(const std::string& bdf, const std::string& device,
                                        const pci::Inventory& inventory, const pci::Selection& selection,
                                        const kube::ResourceClaim& claim) const {
  const std::string what = absl::StrCat("device ", device, " (", bdf, ")");
  if (absl::Status held = CheckNotHeld(bdf, device, claim); !held.ok()) return held;
  const pci::Function* fn = inventory.Find(bdf);
  if (fn == nullptr) {
    return absl::NotFoundError(absl::StrCat(what, ": not in ", options_.paths.PciDevices().string()));
  }
  if (selection.RoleOf(bdf) != pci::Role::kGpu) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": ", fn->VendorDevice(), " is not a GPU this agent manages"));
  }
  if (!fn->iommu_group) return absl::FailedPreconditionError(absl::StrCat(what, ": no IOMMU group (IOMMU off?)"));
  const int group_id = *fn->iommu_group;
  const pci::GroupAssessment* group = selection.GroupOf(*fn);
  if (group == nullptr) return absl::InternalError(absl::StrCat(what, ": IOMMU group ", group_id, " not assessed"));
  // A VM takes the whole group: every endpoint must be ours and on a vfio driver (bridges stay on pcieport).
  for (const pci::Member& member : group->members) {
    if (member.role == pci::Role::kBridge) continue;
    const pci::Function* other = inventory.Find(member.bdf);
    const std::string driver = other == nullptr ? "" : other->driver;
    if (member.role == pci::Role::kForeign) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": IOMMU group ", group_id, " also holds ", member.bdf, " (",
          other == nullptr ? "unreadable" : other->VendorDevice(), ", driver ", driver.empty() ? "none" : driver,
          "), which is not this agent's to hand to a VM; move it to its own group (ACS) or leave this GPU out"));
    }
    if (!pci::IsVfioDriver(driver)) {
      return absl::FailedPreconditionError(absl::StrCat(what, ": IOMMU group ", group_id, " member ", member.bdf,
                                                        " is on driver ", driver.empty() ? "none" : driver,
                                                        ", not vfio-pci (run `vfio-gpu-agent bind`)"));
    }
  }
  const std::filesystem::path group_node = options_.paths.VfioDir() / std::to_string(group_id);
  if (!fs::Exists(group_node)) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": ", group_node.string(), " does not exist"));
  }
  return absl::OkStatus();
}

void ClaimPreparer::AddExtendedResourceEnv(const std::vector<PreparedDevice>& devices,
                                           const pci::Inventory& inventory, const pci::Selection& selection,
                                           cdi::v1::ContainerEdits* edits) const {
  // Names over every selected GPU, as the device plugin and the slices resolve them.
  std::vector<std::pair<uint16_t, uint16_t>> ids;
  for (const std::string& bdf : selection.gpus) {
    if (const pci::Function* fn = inventory.Find(bdf); fn != nullptr && selection.RoleOf(bdf) == pci::Role::kGpu) {
      ids.emplace_back(fn->vendor_id, fn->device_id);
    }
  }
  const std::map<uint32_t, names::ResolvedName> resolved = names_.Resolve(ids);
  std::map<std::string, std::set<std::string>> bdfs_by_env;  // sorted, as Allocate sends them
  for (const PreparedDevice& device : devices) {
    const pci::Function* fn = inventory.Find(device.bdf);
    auto name = fn == nullptr ? resolved.end() : resolved.find(names::NameKey(fn->vendor_id, fn->device_id));
    if (name != resolved.end()) bdfs_by_env[names::KubevirtEnvName(name->second.resource_name)].insert(device.bdf);
  }
  for (const auto& [env, bdfs] : bdfs_by_env) edits->add_env(absl::StrCat(env, "=", absl::StrJoin(bdfs, ",")));
}

absl::StatusOr<PreparedClaim> ClaimPreparer::PrepareOne(const drav1::Claim& request, const pci::Inventory& scanned,
                                                        const pci::Selection& scanned_selection,
                                                        absl::Time call_start, const VgpuView* vgpus,
                                                        const PreparedClaim* prebound) {
  const std::string ref = ClaimRef(request);
  if (!IsSafeUid(request.uid())) return absl::InvalidArgumentError(absl::StrCat(ref, ": not a claim UID"));
  if (!options_.get_claim) {
    return absl::FailedPreconditionError(absl::StrCat(ref, ": no Kubernetes API configured to read the claim"));
  }
  absl::StatusOr<kube::ResourceClaim> claim = options_.get_claim(request.namespace_(), request.name());
  if (!claim.ok()) return absl::Status(claim.status().code(), absl::StrCat(ref, ": ", claim.status().message()));
  if (claim->uid != request.uid()) {
    return absl::FailedPreconditionError(
        absl::StrCat(ref, ": the API has UID ", claim->uid, " for this name (the claim was replaced)"));
  }
  if (!claim->allocated) return absl::FailedPreconditionError(absl::StrCat(ref, ": not allocated"));
  std::vector<const kube::AllocationResult*> ours;
  for (const kube::AllocationResult& result : claim->results) {
    if (result.driver == options_.driver_name) ours.push_back(&result);
  }
  if (ours.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(ref, ": no device allocated to driver ", options_.driver_name));
  }
  // The requests' DeviceClasses choose the VFIO backend, the same for every device of the claim.
  const absl::StatusOr<pci::VfioBackend> backend = ClaimBackend(ours, options_.driver_name, ref);
  if (!backend.ok()) return backend.status();

  PreparedClaim prepared{.namespace_name = claim->namespace_name,
                         .name = claim->name,
                         .uid = claim->uid,
                         .boot_id = boot_id_,
                         .cdi_spec = options_.cdi_dir / absl::StrCat(options_.driver_name, "_claim_", claim->uid, ".json"),
                         .metadata_dir = plugin_dir_ / "dra-device-metadata" /
                                         absl::StrCat(claim->namespace_name, "_", claim->name),
                         .consumers = claim->reserved_for};

  // --bind-on-prepare: the groups go onto vfio-pci first, and the checks below see the host after the bind. From
  // here on a failure returns every function moved before the claim's error is answered.
  RecordedDrivers bound;
  std::optional<pci::Inventory> rescanned;
  pci::Selection reselected;
  std::vector<std::string> to_bind;
  if (bind_ && vgpus == nullptr) {  // a vGPU is never a whole GPU to bind
    for (const kube::AllocationResult* result : ours) {
      if (absl::StatusOr<std::string> bdf = BdfOfDevice(result->device); bdf.ok()) to_bind.push_back(*bdf);
    }
  }
  // Before sysfs or Fabric Manager is touched, the checkpoint says what may change: a process killed from here on
  // leaves a pending record the next start undoes, so no GPU stays on vfio-pci for the rest of the boot.
  const bool record_intent = !to_bind.empty() || fabric_ != nullptr;
  PreparedClaim intent = prepared;
  intent.pending = true;
  intent.drivers_before_bind = DriversOffVfio(scanned, to_bind);
  if (prebound != nullptr) {
    // The drivers the pre-bind found are the ones to return to: those functions are on vfio-pci now.
    for (const auto& [bdf, driver] : prebound->drivers_before_bind) intent.drivers_before_bind[bdf] = driver;
    intent.fabric_partitions = prebound->fabric_partitions;
  }
  if (record_intent) {
    if (absl::Status written = WriteCheckpoint(intent); !written.ok()) {
      return absl::Status(written.code(), absl::StrCat(ref, ": ", written.message()));
    }
  }
  // A failed Prepare leaves no record, unless a function it moved could not go back: then the pending record
  // stays, its devices held, and the kubelet's retry of this claim undoes it first.
  absl::Cleanup drop_intent = [&] {
    if (!record_intent) return;
    for (const auto& [bdf, driver] : intent.drivers_before_bind) {
      absl::StatusOr<std::string> now = fs::ReadLinkBasename(options_.paths.PciDevice(bdf) / "driver");
      if (now.ok() && pci::IsVfioDriver(*now)) {
        spdlog::warn("DRA prepare: {}: {} stays on {} for now; the claim's next Prepare returns it first", ref, bdf,
                     *now);
        prepared_[claim->uid] = intent;
        return;
      }
    }
    std::error_code ec;
    std::filesystem::remove(CheckpointFile(claim->uid), ec);
  };
  if (!to_bind.empty()) {
    absl::StatusOr<RecordedDrivers> moved = BindDevices(to_bind, *claim, call_start);
    if (!moved.ok()) return absl::Status(moved.status().code(), absl::StrCat(ref, ": ", moved.status().message()));
    bound = *std::move(moved);
    absl::StatusOr<pci::Inventory> after =
        pci::Scan(options_.paths.sysfs_root, {.detail_vendor = options_.policy.vendor_id, .driver_override = false});
    if (after.ok()) {
      rescanned = *std::move(after);
      reselected = pci::Select(*rescanned, options_.policy);
    }
  }
  const pci::Inventory& inventory = rescanned ? *rescanned : scanned;
  const pci::Selection& selection = rescanned ? reselected : scanned_selection;
  absl::Cleanup undo_bind = [&] {
    if (bound.empty()) return;
    if (absl::Status returned = bind_->Return(bound, call_start + kCallBudget); !returned.ok()) {
      spdlog::error("DRA prepare: {}: {}", ref, std::string(returned.message()));
    }
  };

  const bool iommufd = fs::Exists(options_.paths.dev_root / "iommu");
  const std::string kind = absl::StrCat(options_.driver_name, "/claim");
  cdi::v1::Spec spec;
  spec.set_cdi_version("0.5.0");  // device names start with the claim UID, maybe a digit
  spec.set_kind(kind);
  prepared.drivers_before_bind = bound;
  std::map<std::string, std::vector<const kube::AllocationResult*>> by_request;
  for (const kube::AllocationResult* result : ours) {
    if (vgpus != nullptr) {
      if (absl::Status added = AddVgpu(*result, *vgpus, *backend, kind, spec, prepared); !added.ok()) {
        return absl::Status(added.code(), absl::StrCat(ref, ": ", added.message()));
      }
      by_request[BaseRequest(result->request)].push_back(result);
      continue;
    }
    absl::StatusOr<std::string> bdf = BdfOfDevice(result->device);
    if (!bdf.ok()) return absl::InvalidArgumentError(absl::StrCat(ref, ": ", bdf.status().message()));
    if (absl::Status device = CheckDevice(*bdf, result->device, inventory, selection, *claim); !device.ok()) {
      return absl::Status(device.code(), absl::StrCat(ref, ": ", device.message()));
    }
    const pci::Function* fn = inventory.Find(*bdf);
    const std::string cdi_name = absl::StrCat(claim->uid, "-", result->device);
    cdi::v1::Device* cdi_device = spec.add_devices();
    cdi_device->set_name(cdi_name);
    cdi::v1::ContainerEdits* edits = cdi_device->mutable_container_edits();
    absl::StatusOr<std::vector<std::string>> nodes =
        pci::VfioBackendNodes(*backend, fn->vfio_cdevs, fn->iommu_group, iommufd, absl::StrCat(ref, ": ", *bdf));
    if (!nodes.ok()) return nodes.status();
    AddCdiNodes(*nodes, edits);
    prepared.devices.push_back({.request = BaseRequest(result->request),
                                .pool = result->pool,
                                .device = result->device,
                                .bdf = *bdf,
                                .cdi_ids = {absl::StrCat(kind, "=", cdi_name)}});
    by_request[BaseRequest(result->request)].push_back(result);
  }

  if (prebound != nullptr) {
    // Bound before the pod was: returned to where the pre-bind found them, and its partition kept.
    for (const auto& [bdf, driver] : prebound->drivers_before_bind) prepared.drivers_before_bind[bdf] = driver;
    prepared.fabric_partitions = prebound->fabric_partitions;
  }
  if (fabric_ != nullptr && (prebound == nullptr || prebound->fabric_partitions.empty())) {
    absl::StatusOr<std::vector<uint32_t>> partitions = fabric_->Activate(claim->uid, ref, BdfsOf(prepared));
    if (!partitions.ok()) {
      return absl::Status(partitions.status().code(), absl::StrCat(ref, ": ", partitions.status().message()));
    }
    prepared.fabric_partitions = *std::move(partitions);
  }

  if (auto it = claim->annotations.find(kExtendedResourceClaimAnnotation);
      it != claim->annotations.end() && it->second == "true") {
    if (vgpus != nullptr) {
      std::vector<std::string> names;
      for (const PreparedDevice& device : prepared.devices) names.push_back(device.device);
      vgpus->AddExtendedResourceEnv(names, spec.mutable_container_edits());
    } else {
      AddExtendedResourceEnv(prepared.devices, inventory, selection, spec.mutable_container_edits());
    }
  }

  // One metadata file per request, bind-mounted by its own CDI device, whose ID goes with the request's first device.
  std::vector<std::pair<std::filesystem::path, std::string>> metadata_files;
  for (const auto& [request_name, results] : by_request) {
    const std::string cdi_name = absl::StrCat(claim->uid, "-metadata-", request_name);
    const std::filesystem::path host = prepared.metadata_dir / request_name / "metadata.json";
    cdi::v1::Mount* mount = spec.add_devices()->mutable_container_edits()->add_mounts();
    spec.mutable_devices(spec.devices_size() - 1)->set_name(cdi_name);
    mount->set_host_path(host.string());
    mount->set_container_path(MetadataContainerPath(*claim, options_.driver_name, request_name));
    mount->add_options("ro");
    mount->add_options("bind");
    metadata_files.emplace_back(host, MetadataJson(*claim, options_.driver_name, results, prepared.devices));
    for (PreparedDevice& device : prepared.devices) {
      if (device.request == request_name) {
        device.cdi_ids.push_back(absl::StrCat(kind, "=", cdi_name));
        break;
      }
    }
  }

  std::string spec_json;
  google::protobuf::util::JsonPrintOptions print;
  print.add_whitespace = true;
  (void)google::protobuf::util::MessageToJsonString(spec, &spec_json, print);
  absl::Status written = [&]() -> absl::Status {
    std::error_code ec;
    for (const auto& [path, content] : metadata_files) {
      std::filesystem::create_directories(path.parent_path(), ec);
      if (ec) return absl::UnavailableError(absl::StrCat("create ", path.parent_path().string(), ": ", ec.message()));
      if (absl::Status status = fs::WriteFileAtomically(path, content, 0644, kClaimFiles); !status.ok()) return status;
    }
    std::filesystem::create_directories(options_.cdi_dir, ec);
    if (ec) return absl::UnavailableError(absl::StrCat("create ", options_.cdi_dir.string(), ": ", ec.message()));
    if (absl::Status status = fs::WriteFileAtomically(prepared.cdi_spec, spec_json, 0644, kClaimFiles); !status.ok()) {
      return status;
    }
    // Last: a checkpoint names only what exists; a crash before it leaves files the retry overwrites.
    return WriteCheckpoint(prepared);
  }();
  if (!written.ok()) {
    (void)Remove(prepared);  // best effort: what is left is overwritten by the retry
    return absl::Status(written.code(), absl::StrCat(ref, ": ", written.message()));
  }
  std::move(undo_bind).Cancel();
  std::move(drop_intent).Cancel();  // the checkpoint is the final one now
  return prepared;
}

bool ClaimPreparer::PreBound(const std::string& uid) const {
  auto it = prepared_.find(uid);
  return it != prepared_.end() && it->second.prebound;
}

absl::StatusOr<std::string> ClaimPreparer::PreBind(const kube::ResourceClaim& claim, absl::Time start) {
  // From the moment the claim's GPUs are held here (before the kubelet prepares it), their groups' other GPUs are
  // off new allocations.
  absl::Cleanup published = [this] { PublishHolds(); };
  const std::string ref = ClaimRef(claim.namespace_name, claim.name, claim.uid);
  if (!IsSafeUid(claim.uid)) return absl::InvalidArgumentError(absl::StrCat(ref, ": not a claim UID"));
  if (auto it = prepared_.find(claim.uid); it != prepared_.end()) {
    if (!it->second.pending) return std::string("done already");  // pre-bound before, or prepared by the kubelet
    if (absl::Status undone = UndoPending(it->second, start + kCallBudget); !undone.ok()) {
      return absl::Status(undone.code(), absl::StrCat(ref, ": undoing an unfinished bind: ", undone.message()));
    }
    prepared_.erase(it);
  }
  PreparedClaim intent{.namespace_name = claim.namespace_name,
                       .name = claim.name,
                       .uid = claim.uid,
                       .boot_id = boot_id_,
                       .consumers = claim.reserved_for,
                       .pending = true,
                       .prebound = true};
  std::vector<std::string> bdfs;
  for (const kube::AllocationResult& result : claim.results) {
    if (result.driver != options_.driver_name || result.pool != options_.node_name) continue;
    absl::StatusOr<std::string> bdf = BdfOfDevice(result.device);
    if (!bdf.ok()) return absl::InvalidArgumentError(absl::StrCat(ref, ": ", bdf.status().message()));
    bdfs.push_back(*bdf);
    intent.devices.push_back(
        {.request = BaseRequest(result.request), .pool = result.pool, .device = result.device, .bdf = *bdf});
  }
  if (bdfs.empty()) return absl::FailedPreconditionError(absl::StrCat(ref, ": no device of pool ", options_.node_name));
  absl::StatusOr<pci::Inventory> scanned =
      pci::Scan(options_.paths.sysfs_root, {.detail_vendor = options_.policy.vendor_id, .driver_override = false});
  if (!scanned.ok()) return absl::Status(scanned.status().code(), absl::StrCat(ref, ": ", scanned.status().message()));
  for (const std::string& bdf : bdfs) {
    if (absl::Status held = CheckNotHeld(bdf, DeviceName(bdf), claim); !held.ok()) {
      return absl::Status(held.code(), absl::StrCat(ref, ": ", held.message()));
    }
  }
  if (bind_) intent.drivers_before_bind = DriversOffVfio(*scanned, bdfs);
  // As in Prepare: the intent is on disk before sysfs or Fabric Manager is touched.
  if (absl::Status written = WriteCheckpoint(intent); !written.ok()) {
    return absl::Status(written.code(), absl::StrCat(ref, ": ", written.message()));
  }
  RecordedDrivers bound;
  auto give_up = [&](const absl::Status& why) {
    if (!bound.empty()) {
      if (absl::Status returned = bind_->Return(bound, start + kCallBudget); !returned.ok()) {
        spdlog::error("DRA binding: {}: {}; the claim's record stays pending until it is undone", ref,
                      std::string(returned.message()));
        prepared_[claim.uid] = intent;
        return absl::Status(why.code(), absl::StrCat(ref, ": ", why.message()));
      }
    }
    std::error_code ec;
    std::filesystem::remove(CheckpointFile(claim.uid), ec);
    if (fabric_ != nullptr) fabric_->Release(claim.uid);
    return absl::Status(why.code(), absl::StrCat(ref, ": ", why.message()));
  };
  std::vector<std::string> done;
  if (bind_) {
    absl::StatusOr<RecordedDrivers> moved = bind_->Bind(bdfs, start);
    if (!moved.ok()) return give_up(moved.status());  // Bind put back what it moved
    bound = *std::move(moved);
    done.push_back(absl::StrCat(absl::StrJoin(bdfs, ", "), " and the rest of their IOMMU groups on vfio-pci"));
  }
  PreparedClaim result = intent;
  if (fabric_ != nullptr && fabric_->enabled()) {
    absl::StatusOr<std::vector<uint32_t>> partitions =
        fabric_->Activate(claim.uid, ref, std::set<std::string>(bdfs.begin(), bdfs.end()));
    if (!partitions.ok()) return give_up(partitions.status());
    result.fabric_partitions = *std::move(partitions);
    done.push_back(result.fabric_partitions.empty()
                       ? std::string("no Fabric Manager partition needed")
                       : absl::StrCat("Fabric Manager partition ", absl::StrJoin(result.fabric_partitions, ","),
                                      " active"));
  }
  result.pending = false;
  result.drivers_before_bind = bound;
  if (absl::Status written = WriteCheckpoint(result); !written.ok()) return give_up(written);
  prepared_[claim.uid] = result;
  return done.empty() ? std::string("ready") : absl::StrJoin(done, "; ");
}

drav1::NodePrepareResourcesResponse ClaimPreparer::Prepare(const drav1::NodePrepareResourcesRequest& request,
                                                           absl::Time call_start) {
  drav1::NodePrepareResourcesResponse response;
  const absl::Time start = call_start;
  // Read once per call, and only when some claim is new: a repeat (the kubelet after a restart) costs no scan.
  std::optional<absl::StatusOr<pci::Inventory>> inventory;
  pci::Selection selection;
  std::optional<absl::StatusOr<VgpuView>> vgpus;  // vm-vgpu only
  for (const drav1::Claim& claim : request.claims()) {
    drav1::NodePrepareResourceResponse& entry = (*response.mutable_claims())[claim.uid()];
    std::optional<PreparedClaim> prebound;
    if (auto it = prepared_.find(claim.uid()); it != prepared_.end() && it->second.prebound && !it->second.pending) {
      // Bound before the pod was (binding conditions): only the files are left to write.
      prebound = it->second;
      prepared_.erase(it);
    } else if (it != prepared_.end()) {
      if (!it->second.pending) {
        entry = ToResponse(it->second);  // a repeat answers what the first call prepared
        continue;
      }
      // A Prepare of this claim that did not finish: undone first, then prepared afresh.
      if (absl::Status undone = UndoPending(it->second, call_start + kCallBudget); !undone.ok()) {
        entry.set_error(absl::StrCat(ClaimRef(claim), ": undoing an unfinished Prepare: ", undone.message()));
        continue;
      }
      prepared_.erase(it);
    }
    // The call's time counts from the kubelet's call: after a long wait for the driver (another call, the stale-claim
    // sweep returning GPUs) the claim is not started, and the kubelet's retry finds the driver free.
    if (absl::Now() >= call_start + kBindBudget) {
      entry.set_error(absl::StrCat(ClaimRef(claim), ": not started: ", absl::FormatDuration(absl::Now() - call_start),
                                   " of the kubelet's call went waiting for the driver's other work; retried"));
      continue;
    }
    if (!inventory) {
      inventory = pci::Scan(options_.paths.sysfs_root,
                            {.detail_vendor = options_.policy.vendor_id, .driver_override = false});
      if (inventory->ok()) selection = pci::Select(**inventory, options_.policy);
      if (inventory->ok() && options_.workload == Workload::kVmVgpu) {
        vgpus = VgpuView::Discover(options_.paths, **inventory, vgpu_catalog_, options_.domain, options_.driver_name);
      }
    }
    if (!inventory->ok() || (vgpus && !vgpus->ok())) {
      const absl::Status& failed = !inventory->ok() ? inventory->status() : vgpus->status();
      entry.set_error(absl::StrCat(ClaimRef(claim), ": ", failed.message()));
      continue;
    }
    absl::StatusOr<PreparedClaim> prepared =
        PrepareOne(claim, **inventory, selection, start, vgpus ? &**vgpus : nullptr, prebound ? &*prebound : nullptr);
    if (!prepared.ok() && prebound && !prepared_.contains(claim.uid())) {
      // Its GPUs stay bound for the kubelet's retry, as the pre-bind left them.
      if (absl::Status kept = WriteCheckpoint(*prebound); !kept.ok()) {
        spdlog::error("DRA prepare: {}: {}", ClaimRef(claim), std::string(kept.message()));
      }
      prepared_[claim.uid()] = *prebound;
    }
    if (!prepared.ok()) {
      spdlog::warn("DRA prepare: {}", std::string(prepared.status().message()));
      entry.set_error(std::string(prepared.status().message()));
      continue;
    }
    std::vector<std::string> bdfs;
    for (const PreparedDevice& device : prepared->devices) {
      bdfs.push_back(device.mdev_uuid.empty() ? device.bdf : device.mdev_uuid);
    }
    spdlog::info("DRA prepare: {}: {}", ClaimRef(claim), absl::StrJoin(bdfs, ","));
    entry = ToResponse(*prepared);
    prepared_[claim.uid()] = *std::move(prepared);
  }
  PublishHolds();
  if (options_.on_prepare) {
    bool ok = true;
    for (const auto& [uid, entry] : response.claims()) ok = ok && entry.error().empty();
    options_.on_prepare(ok, absl::ToChronoNanoseconds(absl::Now() - call_start));
  }
  return response;
}

drav1::NodeUnprepareResourcesResponse ClaimPreparer::Unprepare(const drav1::NodeUnprepareResourcesRequest& request,
                                                               absl::Time call_start) {
  drav1::NodeUnprepareResourcesResponse response;
  const absl::Time deadline = call_start + kCallBudget;
  for (const drav1::Claim& claim : request.claims()) {
    (*response.mutable_claims())[claim.uid()];
    auto it = prepared_.find(claim.uid());
    if (it == prepared_.end()) continue;  // never prepared here, or already unprepared: nothing to undo
    // By default the GPUs stay on vfio-pci and only this claim's files go; --bind-on-prepare returns what it bound.
    if (absl::Status removed = Release(it->second, deadline); !removed.ok()) {
      (*response.mutable_claims())[claim.uid()].set_error(absl::StrCat(ClaimRef(claim), ": ", removed.message()));
      continue;
    }
    spdlog::info("DRA unprepare: {}", ClaimRef(claim));
    prepared_.erase(it);
  }
  PublishHolds();
  return response;
}

}  // namespace vfio_agent::dra::internal

namespace vfio_agent::dra {

std::filesystem::path CheckpointDir(const DriverOptions& options) {
  return options.plugins_dir / options.driver_name / "claims";
}

absl::StatusOr<CheckpointRead> ReadCheckpoint(const DriverOptions& options) {
  absl::StatusOr<std::string> boot_id = internal::ReadBootId(options.paths);
  if (!boot_id.ok()) return boot_id.status();
  CheckpointRead read{.dir = CheckpointDir(options)};
  if (!fs::Exists(read.dir)) return read;
  absl::StatusOr<std::vector<std::string>> files = fs::ListDir(read.dir);
  if (!files.ok()) return files.status();
  std::sort(files->begin(), files->end());
  for (const std::string& file : *files) {
    if (!file.ends_with(".json")) continue;
    absl::StatusOr<internal::PreparedClaim> claim = internal::ParseCheckpoint(read.dir / file);
    if (!claim.ok()) {
      read.unreadable.push_back(absl::StrCat(file, ": ", claim.status().message()));
      continue;
    }
    if (claim->boot_id != *boot_id) {
      read.other_boot.push_back(file);
      continue;
    }
    std::set<std::string> bdfs = internal::BdfsOf(*claim);
    for (const auto& [bdf, driver] : claim->drivers_before_bind) bdfs.insert(bdf);
    bdfs.erase("");  // an mdev vGPU has none
    std::set<std::string> mdevs, vfs;
    for (const internal::PreparedDevice& device : claim->devices) {
      if (!device.mdev_uuid.empty()) mdevs.insert(device.mdev_uuid);
      // A vm-vgpu claim's device named by its VF (VfDeviceName) is an SR-IOV vGPU; a GPU's device name is not.
      if (!device.bdf.empty() && VgpuOfDevice(device.device).ok()) vfs.insert(device.bdf);
    }
    read.claims.push_back({.ref = absl::StrCat(claim->namespace_name, "/", claim->name, " (", claim->uid, ")"),
                           .bdfs = {bdfs.begin(), bdfs.end()},
                           .mdev_uuids = {mdevs.begin(), mdevs.end()},
                           .vgpu_vfs = {vfs.begin(), vfs.end()}});
  }
  return read;
}

}  // namespace vfio_agent::dra
