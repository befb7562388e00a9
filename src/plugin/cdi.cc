#include "vfio_gpu_agent/plugin/cdi.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "cdi/v1/spec.pb.h"
#include "google/protobuf/util/json_util.h"
#include "vfio_gpu_agent/common/fs.h"
#include "vfio_gpu_agent/pci/vfio_backend.h"

namespace vfio_agent::plugin {
namespace {

void AddNode(cdi::v1::ContainerEdits* edits, const std::string& path) {
  cdi::v1::DeviceNode* node = edits->add_device_nodes();
  node->set_path(path);
  node->set_permissions("rw");
}

bool IsLetter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool IsAlnum(char c) { return IsLetter(c) || (c >= '0' && c <= '9'); }

// The least cdiVersion that allows what the spec uses (the reference library refuses an older one): device
// names starting with a digit, as every BDF does, need 0.5.0; a '.' in the kind's class needs 0.6.0.
std::string RequiredCdiVersion(const ResourceDevices& resource) {
  const size_t slash = resource.resource_name.find('/');
  if (slash != std::string::npos && resource.resource_name.find('.', slash) != std::string::npos) return "0.6.0";
  for (const PluginDevice& device : resource.devices) {
    if (!device.id.empty() && !IsLetter(device.id.front())) return "0.5.0";
  }
  return "0.3.0";
}

// A CDI kind is vendor/class: each starts with a letter and ends alphanumeric; [A-Za-z0-9_.-] between.
absl::Status ValidateCdiKind(std::string_view kind) {
  auto valid = [](std::string_view part) {
    return !part.empty() && IsLetter(part.front()) && IsAlnum(part.back()) &&
           std::all_of(part.begin(), part.end(), [](char c) { return IsAlnum(c) || c == '_' || c == '.' || c == '-'; });
  };
  const size_t slash = kind.find('/');
  if (slash == std::string_view::npos || !valid(kind.substr(0, slash)) || !valid(kind.substr(slash + 1))) {
    return absl::InvalidArgumentError(absl::StrCat("\"", std::string(kind),
                                                   "\" is not a CDI kind (vendor/class, each starting with a letter); "
                                                   "no CDI spec written, give the resource a name with --resource-name"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string CdiDeviceName(std::string_view resource_name, std::string_view device_id) {
  return std::string(resource_name) + "=" + std::string(device_id);
}

std::filesystem::path CdiSpecPath(const std::filesystem::path& cdi_dir, std::string_view resource_name) {
  std::string name(resource_name);
  std::replace(name.begin(), name.end(), '/', '_');
  return cdi_dir / ("vfio-gpu-agent_" + name + ".json");
}

std::string CdiSpecJson(const ResourceDevices& resource, pci::VfioNodeSet node_set, bool host_iommufd) {
  const pci::VfioNodeSet set = resource.NodeSetFor(node_set);
  cdi::v1::Spec spec;
  spec.set_cdi_version(RequiredCdiVersion(resource));
  spec.set_kind(resource.resource_name);
  for (const PluginDevice& device : resource.devices) {
    absl::StatusOr<std::vector<std::string>> nodes =
        pci::VfioNodes(set, device.vfio_cdevs, device.iommu_group, host_iommufd, device.id);
    if (!nodes.ok()) continue;
    cdi::v1::Device* entry = spec.add_devices();
    entry->set_name(device.id);
    cdi::v1::ContainerEdits* edits = entry->mutable_container_edits();
    for (const std::string& node : *nodes) AddNode(edits, node);
  }
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  (void)google::protobuf::util::MessageToJsonString(spec, &json, options);
  return json;
}

absl::Status WriteCdiSpec(const std::filesystem::path& cdi_dir, const ResourceDevices& resource,
                          pci::VfioNodeSet node_set, bool host_iommufd) {
  if (absl::Status kind = ValidateCdiKind(resource.resource_name); !kind.ok()) return kind;
  std::error_code ec;
  std::filesystem::create_directories(cdi_dir, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("create ", cdi_dir.string(), ": ", ec.message()));
  return fs::WriteFileAtomically(CdiSpecPath(cdi_dir, resource.resource_name), CdiSpecJson(resource, node_set, host_iommufd));
}

}  // namespace vfio_agent::plugin
