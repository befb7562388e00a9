#include "vfio_gpu_agent/kube/resource_slices.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "api_client.h"
#include "config.h"
#include "nlohmann/json.hpp"

namespace vfio_agent::kube {
namespace {

using Json = nlohmann::json;


struct ExistingSlice {
  std::string name;
  std::string uid;
  std::string resource_version;
  int64_t generation = 0;
  int64_t slice_count = 0;
  std::vector<SliceDevice> devices;  // sorted by name
};

// What a request's answer means to the caller: its error, with the request and the server's words.
absl::Status AnswerStatus(const absl::StatusOr<ApiResponse>& response, const std::string& request) {
  if (!response.ok()) return response.status();
  if (response->code >= 200 && response->code < 300) return absl::OkStatus();
  const std::string what = absl::StrCat(request, ": ", response->code, " ", ServerMessage(*response));
  switch (response->code) {
    case 401: return absl::UnauthenticatedError(what);
    case 403: return absl::PermissionDeniedError(what);
    case 404: return absl::NotFoundError(what);
    case 409: return absl::AbortedError(what);
    case 400:
    case 422: return absl::InvalidArgumentError(what);
    default: return absl::UnavailableError(what);
  }
}

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

// The node's slices of the driver, in the order Matches compares them.
absl::StatusOr<std::vector<ExistingSlice>> ListSlices(ApiClient& client, const SliceOptions& options) {
  const std::string path = absl::StrCat(kResourceSlicesPath, "?fieldSelector=",
                                        Escape(absl::StrCat("spec.nodeName=", options.node_name, ",spec.driver=",
                                                            options.driver)));
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
  std::vector<std::vector<SliceDevice>> chunks;
  for (size_t i = 0; i < devices.size(); i += kMaxDevicesPerSlice) {
    const size_t end = std::min(devices.size(), i + kMaxDevicesPerSlice);
    chunks.emplace_back(devices.begin() + static_cast<ptrdiff_t>(i), devices.begin() + static_cast<ptrdiff_t>(end));
  }
  if (chunks.empty()) chunks.emplace_back();  // the pool stays, with no device: the node has none now

  absl::StatusOr<std::vector<ExistingSlice>> existing = ListSlices(*client_, options_);
  if (!existing.ok()) return existing.status();

  PublishResult result;
  if (Matches(*existing, chunks)) {
    result.generation = existing->front().generation;
    return result;
  }
  absl::StatusOr<std::string> uid = NodeUid();
  if (!uid.ok()) return uid.status();
  int64_t generation = 0;
  for (const ExistingSlice& slice : *existing) generation = std::max(generation, slice.generation + 1);
  result.generation = generation;

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
  }
  for (size_t i = chunks.size(); i < existing->size(); ++i) {
    const ExistingSlice& obsolete = (*existing)[i];
    const std::string path = absl::StrCat(kResourceSlicesPath, "/", obsolete.name);
    const Json options = {{"apiVersion", "v1"},
                          {"kind", "DeleteOptions"},
                          {"preconditions", {{"uid", obsolete.uid}, {"resourceVersion", obsolete.resource_version}}}};
    absl::StatusOr<ApiResponse> deleted = client_->Send("DELETE", path, "application/json", options.dump(),
                                                        options_.timeout);
    absl::Status status = AnswerStatus(deleted, absl::StrCat("DELETE ", client_->Url(path)));
    if (!status.ok() && status.code() != absl::StatusCode::kNotFound) return status;  // gone already: as wanted
    ++result.deleted;
  }
  return result;
}

absl::Status ResourceSlicePublisher::DeleteAll() {
  absl::StatusOr<std::vector<ExistingSlice>> existing = ListSlices(*client_, options_);
  if (!existing.ok()) return existing.status();
  for (const ExistingSlice& slice : *existing) {
    const std::string path = absl::StrCat(kResourceSlicesPath, "/", slice.name);
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
