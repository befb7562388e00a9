#include "vfio_gpu_agent/kube/resource_slices.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "api_client.h"
#include "config.h"
#include "list_watch.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/common/thread_name.h"

namespace vfio_agent::kube {
namespace {

using Json = nlohmann::json;
using namespace std::chrono_literals;

struct ExistingSlice {
  std::string name;
  std::string uid;
  std::string resource_version;
  int64_t generation = 0;
  int64_t slice_count = 0;
  std::vector<SliceDevice> devices;  // sorted by name
};

Json AttributeJson(const DeviceAttribute& attribute) {
  switch (attribute.kind) {
    case DeviceAttribute::Kind::kString: return {{"string", attribute.text}};
    case DeviceAttribute::Kind::kInt: return {{"int", attribute.number}};
    case DeviceAttribute::Kind::kBool: return {{"bool", attribute.flag}};
    case DeviceAttribute::Kind::kVersion: return {{"version", attribute.text}};
  }
  return {};
}

Json DeviceJson(const SliceDevice& device) {
  Json out = {{"name", device.name}};
  if (!device.attributes.empty()) {
    Json attributes = Json::object();
    for (const auto& [key, value] : device.attributes) attributes[key] = AttributeJson(value);
    out["attributes"] = std::move(attributes);
  }
  if (!device.taints.empty()) {
    Json taints = Json::array();
    for (const DeviceTaint& taint : device.taints) {
      Json entry = {{"key", taint.key}, {"effect", taint.effect}};
      if (!taint.value.empty()) entry["value"] = taint.value;
      taints.push_back(std::move(entry));
    }
    out["taints"] = std::move(taints);
  }
  if (device.binds_to_node) out["bindsToNode"] = true;
  if (!device.binding_conditions.empty()) out["bindingConditions"] = device.binding_conditions;
  if (!device.binding_failure_conditions.empty()) out["bindingFailureConditions"] = device.binding_failure_conditions;
  return out;
}

std::vector<std::string> Strings(const Json& object, const char* key) {
  std::vector<std::string> out;
  if (!object.contains(key) || !object[key].is_array()) return out;
  for (const Json& value : object[key]) {
    if (value.is_string()) out.push_back(value.get<std::string>());
  }
  return out;
}

// The parts of a stored device we publish; anything the server adds (timeAdded) is not compared.
SliceDevice ParseDevice(const Json& device) {
  SliceDevice out;
  out.name = device.value("name", "");
  if (device.contains("attributes") && device["attributes"].is_object()) {
    for (const auto& [key, value] : device["attributes"].items()) {
      if (!value.is_object()) continue;
      if (value.contains("string") && value["string"].is_string()) {
        out.attributes[key] = DeviceAttribute::String(value["string"].get<std::string>());
      } else if (value.contains("int") && value["int"].is_number_integer()) {
        out.attributes[key] = DeviceAttribute::Int(value["int"].get<int64_t>());
      } else if (value.contains("bool") && value["bool"].is_boolean()) {
        out.attributes[key] = DeviceAttribute::Bool(value["bool"].get<bool>());
      } else if (value.contains("version") && value["version"].is_string()) {
        out.attributes[key] = DeviceAttribute::Version(value["version"].get<std::string>());
      }
    }
  }
  if (device.contains("taints") && device["taints"].is_array()) {
    for (const Json& taint : device["taints"]) {
      if (!taint.is_object()) continue;
      out.taints.push_back({.key = taint.value("key", ""), .value = taint.value("value", ""),
                            .effect = taint.value("effect", "")});
    }
  }
  out.binds_to_node = device.contains("bindsToNode") && device["bindsToNode"].is_boolean() &&
                      device["bindsToNode"].get<bool>();
  out.binding_conditions = Strings(device, "bindingConditions");
  out.binding_failure_conditions = Strings(device, "bindingFailureConditions");
  return out;
}

absl::StatusOr<std::vector<ExistingSlice>> ParseList(const std::string& body, const std::string& request) {
  const Json list = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!list.is_object() || !list.contains("items") || !list["items"].is_array()) {
    return absl::DataLossError(absl::StrCat(request, ": the answer is not a list (no \"items\")"));
  }
  std::vector<ExistingSlice> slices;
  for (const Json& item : list["items"]) {
    if (!item.is_object() || !item.contains("metadata") || !item.contains("spec")) continue;
    const Json& meta = item["metadata"];
    const Json& spec = item["spec"];
    ExistingSlice slice{.name = meta.value("name", ""),
                        .uid = meta.value("uid", ""),
                        .resource_version = meta.value("resourceVersion", "")};
    if (spec.contains("pool") && spec["pool"].is_object()) {
      slice.generation = spec["pool"].value("generation", int64_t{0});
      slice.slice_count = spec["pool"].value("resourceSliceCount", int64_t{0});
    }
    if (spec.contains("devices") && spec["devices"].is_array()) {
      for (const Json& device : spec["devices"]) slice.devices.push_back(ParseDevice(device));
    }
    std::sort(slice.devices.begin(), slice.devices.end(),
              [](const SliceDevice& a, const SliceDevice& b) { return a.name < b.name; });
    slices.push_back(std::move(slice));
  }
  // A pool's slices compare with the chunks in device order; an empty slice sorts last.
  std::sort(slices.begin(), slices.end(), [](const ExistingSlice& a, const ExistingSlice& b) {
    if (a.devices.empty() != b.devices.empty()) return b.devices.empty();
    const std::string first_a = a.devices.empty() ? "" : a.devices.front().name;
    const std::string first_b = b.devices.empty() ? "" : b.devices.front().name;
    return std::tie(first_a, a.name) < std::tie(first_b, b.name);
  });
  return slices;
}

bool Matches(const std::vector<ExistingSlice>& existing, const std::vector<std::vector<SliceDevice>>& chunks) {
  if (existing.size() != chunks.size()) return false;
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (existing[i].generation != existing[0].generation ||
        existing[i].slice_count != static_cast<int64_t>(chunks.size()) || existing[i].devices != chunks[i]) {
      return false;
    }
  }
  return true;
}

// What ResourceSliceMaxDevicesWithAdvancedFeatures counts, of what we publish: taints. Binding conditions do not
// lower the cap in 1.36 (pkg/apis/resource/validation: haveDeviceTaints, haveConsumesCounters, haveListAttributes).
bool UsesAdvancedFeatures(const SliceDevice& device) { return !device.taints.empty(); }

// Devices (sorted) in slices of at most 128, or 64 once a slice holds a device with an advanced feature.
std::vector<std::vector<SliceDevice>> Chunk(const std::vector<SliceDevice>& devices) {
  std::vector<std::vector<SliceDevice>> chunks;
  std::vector<SliceDevice> current;
  bool advanced = false;
  for (const SliceDevice& device : devices) {
    const bool with = advanced || UsesAdvancedFeatures(device);
    if (current.size() + 1 > (with ? kMaxDevicesPerSliceWithAdvancedFeatures : kMaxDevicesPerSlice)) {
      chunks.push_back(std::move(current));
      current.clear();
      advanced = false;
    }
    advanced = advanced || UsesAdvancedFeatures(device);
    current.push_back(device);
  }
  if (!current.empty() || chunks.empty()) chunks.push_back(std::move(current));  // an empty pool stays
  return chunks;
}

// A taint that keeps the scheduler from allocating the device (ours are NoSchedule); None is informational.
bool KeepsOffTheDevice(const SliceDevice& device) {
  return std::any_of(device.taints.begin(), device.taints.end(),
                     [](const DeviceTaint& taint) { return taint.effect != "None"; });
}

bool HasBindingConditions(const SliceDevice& device) { return !device.binding_conditions.empty(); }

// Which of our fields the server stored a device of `written` without: the taints (DRADeviceTaints off), the
// binding conditions (DRADeviceBindingConditions or DRAResourceClaimDeviceStatus off).
struct Dropped {
  bool taints = false;
  bool binding_conditions = false;
};
Dropped FieldsDropped(const std::vector<SliceDevice>& written, const Json& stored) {
  std::map<std::string, SliceDevice> answered;
  if (stored.is_object() && stored.contains("spec") && stored["spec"].contains("devices") &&
      stored["spec"]["devices"].is_array()) {
    for (const Json& device : stored["spec"]["devices"]) {
      SliceDevice parsed = ParseDevice(device);
      answered[parsed.name] = std::move(parsed);
    }
  }
  Dropped dropped;
  for (const SliceDevice& device : written) {
    auto it = answered.find(device.name);
    if (it == answered.end()) continue;
    if (!device.taints.empty() && it->second.taints.empty()) dropped.taints = true;
    if (HasBindingConditions(device) && !HasBindingConditions(it->second)) dropped.binding_conditions = true;
  }
  return dropped;
}

std::string Escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '=') {
      out += "%3D";
    } else if (c == ',') {
      out += "%2C";
    } else {
      out += c;
    }
  }
  return out;
}

// The collection of the node's slices of the driver: the field selectors kube-apiserver offers for resourceslices.
std::string SelectedPath(const SliceOptions& options) {
  return absl::StrCat(kResourceSlicesPath, "?fieldSelector=",
                      Escape(absl::StrCat("spec.nodeName=", options.node_name, ",spec.driver=", options.driver)));
}

// The node's slices of the driver, in the order Matches compares them.
absl::StatusOr<std::vector<ExistingSlice>> ListSlices(ApiClient& client, const SliceOptions& options) {
  const std::string path = SelectedPath(options);
  const std::string request = absl::StrCat("GET ", client.Url(path));
  absl::StatusOr<ApiResponse> listed = client.Send("GET", path, "", "", options.timeout);
  if (absl::Status status = AnswerStatus(listed, request); !status.ok()) return status;
  return ParseList(listed->body, request);
}

}  // namespace

ResourceSlicePublisher::ResourceSlicePublisher(std::unique_ptr<ApiClient> client, SliceOptions options)
    : client_(std::move(client)), options_(std::move(options)) {}
ResourceSlicePublisher::~ResourceSlicePublisher() = default;

uint64_t ResourceSlicePublisher::requests() const { return client_->requests(); }

absl::StatusOr<std::string> ResourceSlicePublisher::NodeUid() {
  if (!node_uid_.empty()) return node_uid_;
  const std::string path = absl::StrCat("/api/v1/nodes/", options_.node_name);
  absl::StatusOr<ApiResponse> response = client_->Send("GET", path, "", "", options_.timeout);
  const std::string request = absl::StrCat("GET ", client_->Url(path));
  if (absl::Status status = AnswerStatus(response, request); !status.ok()) return status;
  const Json node = Json::parse(response->body, nullptr, /*allow_exceptions=*/false);
  if (!node.is_object() || !node.contains("metadata") || !node["metadata"].contains("uid") ||
      !node["metadata"]["uid"].is_string()) {
    return absl::DataLossError(absl::StrCat(request, ": the answer has no metadata.uid"));
  }
  node_uid_ = node["metadata"]["uid"].get<std::string>();
  return node_uid_;
}

absl::StatusOr<PublishResult> ResourceSlicePublisher::Publish(std::vector<SliceDevice> devices) {
  std::sort(devices.begin(), devices.end(), [](const SliceDevice& a, const SliceDevice& b) { return a.name < b.name; });
  bool dropped_now = false;
  absl::StatusOr<PublishResult> result = PublishOnce(devices, &dropped_now);
  if (!result.ok() || !dropped_now) {
    if (result.ok()) result->binding_conditions_dropped = binding_conditions_dropped_;
    return result;
  }
  const PublishResult first = *result;
  result = PublishOnce(devices, &dropped_now);
  if (!result.ok()) return result;
  result->binding_conditions_dropped = binding_conditions_dropped_;
  result->created += first.created;
  result->updated += first.updated;
  result->deleted += first.deleted;
  result->others_meanwhile = result->others_meanwhile || first.others_meanwhile;
  return result;
}

absl::StatusOr<PublishResult> ResourceSlicePublisher::PublishOnce(const std::vector<SliceDevice>& devices,
                                                                  bool* dropped_now) {
  PublishResult result;
  std::vector<SliceDevice> published;
  for (const SliceDevice& device : devices) {
    if (taints_dropped_ && KeepsOffTheDevice(device)) {
      ++result.left_out;
      continue;
    }
    published.push_back(device);
    if (taints_dropped_) published.back().taints.clear();  // informational ones: the server drops them anyway
    if (binding_conditions_dropped_) {
      published.back().binding_conditions.clear();
      published.back().binding_failure_conditions.clear();
      published.back().binds_to_node = false;
    }
  }
  const std::vector<std::vector<SliceDevice>> chunks = Chunk(published);

  absl::StatusOr<std::vector<ExistingSlice>> existing = ListSlices(*client_, options_);
  if (!existing.ok()) return existing.status();

  // What our last writes left, untouched since: equal whatever the server made of it (fields it drops or adds).
  const bool as_written = !written_versions_.empty() && chunks == written_chunks_ &&
                          existing->size() == written_versions_.size() &&
                          std::all_of(existing->begin(), existing->end(), [&](const ExistingSlice& slice) {
                            auto it = written_versions_.find(slice.name);
                            return it != written_versions_.end() && it->second == slice.resource_version;
                          });
  if (as_written || Matches(*existing, chunks)) {
    result.generation = existing->empty() ? 0 : existing->front().generation;
    return result;
  }
  absl::StatusOr<std::string> uid = NodeUid();
  if (!uid.ok()) return uid.status();
  int64_t generation = 0;
  for (const ExistingSlice& slice : *existing) generation = std::max(generation, slice.generation + 1);
  result.generation = generation;
  // Forgotten until every write of this pass succeeded: a pass cut short is compared field by field next time.
  written_chunks_.clear();
  written_versions_.clear();
  std::map<std::string, std::string> versions;
  own_->Begin();
  // On an error return too; what it held is then reported by the next pass's events or list.
  struct EndPass {
    OwnWrites& own;
    bool ended = false;
    ~EndPass() {
      if (!ended) own.End();
    }
  } end_pass{*own_};

  for (size_t i = 0; i < chunks.size(); ++i) {
    Json metadata = {{"generateName", absl::StrCat(options_.node_name, "-", options_.driver, "-")},
                     {"ownerReferences", Json::array({{{"apiVersion", "v1"},
                                                       {"kind", "Node"},
                                                       {"name", options_.node_name},
                                                       {"uid", *uid},
                                                       {"controller", true}}})}};
    Json device_list = Json::array();
    for (const SliceDevice& device : chunks[i]) device_list.push_back(DeviceJson(device));
    Json slice = {{"apiVersion", "resource.k8s.io/v1"},
                  {"kind", "ResourceSlice"},
                  {"spec", {{"driver", options_.driver},
                            {"nodeName", options_.node_name},
                            {"pool", {{"name", options_.node_name},
                                      {"generation", generation},
                                      {"resourceSliceCount", chunks.size()}}},
                            {"devices", std::move(device_list)}}}};
    std::string method = "POST";
    std::string path = kResourceSlicesPath;
    if (i < existing->size()) {
      metadata["name"] = (*existing)[i].name;
      metadata["resourceVersion"] = (*existing)[i].resource_version;
      method = "PUT";
      path = absl::StrCat(kResourceSlicesPath, "/", (*existing)[i].name);
    }
    slice["metadata"] = std::move(metadata);
    absl::StatusOr<ApiResponse> written = client_->Send(method, path, "application/json", slice.dump(), options_.timeout);
    if (absl::Status status = AnswerStatus(written, absl::StrCat(method, " ", client_->Url(path))); !status.ok()) {
      return status;
    }
    ++(method == "POST" ? result.created : result.updated);
    const Json stored = Json::parse(written->body, nullptr, /*allow_exceptions=*/false);
    if (stored.is_object() && stored.contains("metadata") && stored["metadata"].is_object()) {
      const std::string name = stored["metadata"].value("name", "");
      versions[name] = stored["metadata"].value("resourceVersion", "");
      own_->Wrote(name, versions[name]);
    }
    const Dropped dropped = FieldsDropped(chunks[i], stored);
    if (!taints_dropped_ && dropped.taints) {
      taints_dropped_ = *dropped_now = true;
      std::vector<std::string> tainted;
      for (const SliceDevice &device : devices) {
        if (KeepsOffTheDevice(device))
          tainted.push_back(device.name);
      }
      spdlog::warn("DRA ResourceSlices of node {}: the API server dropped the "
                   "devices' taints (feature gate "
                   "DRADeviceTaints off, Kubernetes < 1.36); devices with a "
                   "NoSchedule taint (unhealthy, or a GPU whose IOMMU group a "
                   "claim holds) are left "
                   "out of the slices from now on instead of tainted: {}",
                   options_.node_name, absl::StrJoin(tainted, ", "));
    }
    if (!binding_conditions_dropped_ && dropped.binding_conditions) {
      binding_conditions_dropped_ = *dropped_now = true;
      spdlog::warn(
          "DRA ResourceSlices of node {}: the API server dropped the devices' "
          "bindingConditions (feature "
          "gates DRADeviceBindingConditions/DRAResourceClaimDeviceStatus off, "
          "Kubernetes < 1.36); "
          "--binding-conditions falls back to binding in NodePrepareResources",
          options_.node_name);
    }
  }
  for (size_t i = chunks.size(); i < existing->size(); ++i) {
    const ExistingSlice& obsolete = (*existing)[i];
    const std::string path = absl::StrCat(kResourceSlicesPath, "/", obsolete.name);
    const Json options = {{"apiVersion", "v1"},
                          {"kind", "DeleteOptions"},
                          {"preconditions", {{"uid", obsolete.uid}, {"resourceVersion", obsolete.resource_version}}}};
    own_->Deleting(obsolete.name);
    absl::StatusOr<ApiResponse> deleted = client_->Send("DELETE", path, "application/json", options.dump(),
                                                        options_.timeout);
    absl::Status status = AnswerStatus(deleted, absl::StrCat("DELETE ", client_->Url(path)));
    if (!status.ok() && status.code() != absl::StatusCode::kNotFound) return status;  // gone already: as wanted
    ++result.deleted;
  }
  written_chunks_ = chunks;
  written_versions_ = std::move(versions);
  result.others_meanwhile = own_->End();
  end_pass.ended = true;
  return result;
}

// A few passes' worth: an event is read within moments of the write it reports.
constexpr size_t kOwnWritesKept = 64;

void ResourceSlicePublisher::OwnWrites::Wrote(const std::string& name, const std::string& version) {
  std::lock_guard lock(mu);
  written.emplace_back(name, version);
  if (written.size() > kOwnWritesKept) written.erase(written.begin());
}

void ResourceSlicePublisher::OwnWrites::Deleting(const std::string& name) {
  std::lock_guard lock(mu);
  deleted.push_back(name);
  if (deleted.size() > kOwnWritesKept) deleted.erase(deleted.begin());
}

bool ResourceSlicePublisher::OwnWrites::MatchesLocked(const Event& event) const {
  // A DELETED event carries the deletion's resourceVersion, not the one we deleted with: known by name (a
  // generated name is never used again).
  if (event.type == "DELETED") return std::find(deleted.begin(), deleted.end(), event.name) != deleted.end();
  return std::find(written.begin(), written.end(), std::make_pair(event.name, event.version)) != written.end();
}

bool ResourceSlicePublisher::OwnWrites::Ours(const std::string& type, const std::string& name,
                                             const std::string& version) {
  std::lock_guard lock(mu);
  Event event{.type = type, .name = name, .version = version};
  if (MatchesLocked(event)) return true;
  if (!writing) return false;
  held.push_back(std::move(event));
  return true;
}

void ResourceSlicePublisher::OwnWrites::Begin() {
  std::lock_guard lock(mu);
  writing = true;
}

bool ResourceSlicePublisher::OwnWrites::End() {
  std::lock_guard lock(mu);
  writing = false;
  const bool others = std::any_of(held.begin(), held.end(), [&](const Event& event) { return !MatchesLocked(event); });
  held.clear();
  return others;
}

std::unique_ptr<ResourceSliceWatch> ResourceSlicePublisher::Watch(std::function<void()> changed) {
  return std::make_unique<ResourceSliceWatch>(
      client_, SelectedPath(options_), std::move(changed),
      [own = own_](const std::string& type, const std::string& name, const std::string& version) {
        return own->Ours(type, name, version);
      });
}

ResourceSliceWatch::ResourceSliceWatch(std::shared_ptr<ApiClient> client, std::string path,
                                       std::function<void()> changed, Ours ours) {
  // Every list but the first reports (what happened while nobody watched); an event only when not ours.
  ListWatcher::Handlers handlers{
      .listed = [changed](const Json&, bool relisted) {
        if (relisted) changed();
      },
      .event = [changed, ours = std::move(ours)](const std::string& type, const Json& object) {
        std::string name, version;
        if (object.contains("metadata") && object["metadata"].is_object()) {
          name = object["metadata"].value("name", "");
          version = object["metadata"].value("resourceVersion", "");
        }
        if (!(ours && ours(type, name, version))) changed();
      }};
  watcher_ = std::make_unique<ListWatcher>(std::move(client), std::move(path), "ResourceSlices", "slice-watch",
                                           std::move(handlers));
}

ResourceSliceWatch::~ResourceSliceWatch() = default;
uint64_t ResourceSliceWatch::watches() const { return watcher_->watches(); }
uint64_t ResourceSliceWatch::lists() const { return watcher_->lists(); }

absl::Status ResourceSlicePublisher::DeleteAll() {
  absl::StatusOr<std::vector<ExistingSlice>> existing = ListSlices(*client_, options_);
  if (!existing.ok()) return existing.status();
  for (const ExistingSlice& slice : *existing) {
    const std::string path = absl::StrCat(kResourceSlicesPath, "/", slice.name);
    own_->Deleting(slice.name);
    absl::Status status = AnswerStatus(client_->Send("DELETE", path, "", "", options_.timeout),
                                       absl::StrCat("DELETE ", client_->Url(path)));
    if (!status.ok() && status.code() != absl::StatusCode::kNotFound) return status;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ResourceSlicePublisher>> ConnectResourceSlicePublisher(
    const std::filesystem::path& kubeconfig, const std::filesystem::path& service_account_dir, SliceOptions options) {
  if (!IsDnsSubdomain(options.node_name)) {
    return absl::InvalidArgumentError(absl::StrCat("invalid node name \"", options.node_name,
                                                   "\": lower-case letters, digits, '-' and '.' only"));
  }
  if (!IsDnsSubdomain(options.driver) || options.driver.size() > 63) {
    return absl::InvalidArgumentError(absl::StrCat("invalid DRA driver name \"", options.driver,
                                                   "\": a DNS subdomain of at most 63 characters"));
  }
  absl::StatusOr<ClusterConfig> config = LoadClusterConfig(kubeconfig, service_account_dir);
  if (!config.ok()) return config.status();
  return std::make_unique<ResourceSlicePublisher>(std::make_unique<ApiClient>(*std::move(config)), std::move(options));
}

}  // namespace vfio_agent::kube
