#include "vfio_gpu_agent/validation/dra_config.h"

#include <yaml-cpp/yaml.h>

#include <cctype>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "vfio_gpu_agent/dra/attributes.h"
#include "vfio_gpu_agent/dra/vfio_backend.h"

namespace vfio_agent::validation {
namespace {

constexpr char kApiVersion[] = "resource.k8s.io/v1";

std::string NamePart(const std::string& resource_name) {
  const size_t slash = resource_name.find('/');
  return slash == std::string::npos ? resource_name : resource_name.substr(slash + 1);
}

// The name part as a DNS label: ValidateResourceNamePart leaves only alphanumerics, '-', '_' and '.' with
// alphanumerics at both ends, so lower-casing and mapping '_' and '.' to '-' always gives a valid label.
std::string ModelLabel(const std::string& resource_name) {
  std::string label;
  for (char c : NamePart(resource_name)) {
    label.push_back(c == '_' || c == '.' ? '-' : static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  return label;
}

// KubeVirt takes exactly one device per request (virt-launcher rejects a request of count 2), so an N-GPU VM asks
// for N requests of one device each in one claim.
std::string RequestName(int index, int count) { return count == 1 ? "gpu" : absl::StrCat("gpu-", index); }

std::string TemplateName(const DraModel& model, int count) {
  return count == 1 ? ModelLabel(model.resource_name) : absl::StrCat(ModelLabel(model.resource_name), "-x", count);
}

std::string DeviceClassYaml(const DraModel& model, const std::string& driver, bool iommufd = false) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "apiVersion" << YAML::Value << kApiVersion;
  out << YAML::Key << "kind" << YAML::Value << "DeviceClass";
  out << YAML::Key << "metadata" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value
      << (iommufd ? IommufdDeviceClassName(model.resource_name, driver) : DeviceClassName(model.resource_name, driver));
  out << YAML::EndMap;
  out << YAML::Key << "spec" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "selectors" << YAML::Value << YAML::BeginSeq << YAML::BeginMap;
  out << YAML::Key << "cel" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "expression" << YAML::Value << DeviceClassSelector(model.resource_name, driver);
  out << YAML::EndMap << YAML::EndMap << YAML::EndSeq;
  if (!iommufd) out << YAML::Key << "extendedResourceName" << YAML::Value << model.resource_name;
  out << YAML::EndMap << YAML::EndMap;
  return absl::StrCat(out.c_str(), "\n");
}

// With Fabric Manager partitions (`partition`), the N requests are tied by matchAttribute on partition<N>, whose
// value only the N GPUs of one partition share: the scheduler then picks a whole partition, which Prepare activates.
std::string ClaimTemplateYaml(const DraModel& model, int count, const std::string& driver, bool partition) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "apiVersion" << YAML::Value << kApiVersion;
  out << YAML::Key << "kind" << YAML::Value << "ResourceClaimTemplate";
  out << YAML::Key << "metadata" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << TemplateName(model, count);
  out << YAML::EndMap;
  out << YAML::Key << "spec" << YAML::Value << YAML::BeginMap << YAML::Key << "spec" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "devices" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "requests" << YAML::Value << YAML::BeginSeq;
  for (int i = 0; i < count; ++i) {
    out << YAML::BeginMap;
    out << YAML::Key << "name" << YAML::Value << RequestName(i, count);
    out << YAML::Key << "exactly" << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "deviceClassName" << YAML::Value << DeviceClassName(model.resource_name, driver);
    out << YAML::Key << "allocationMode" << YAML::Value << "ExactCount";
    out << YAML::Key << "count" << YAML::Value << 1;
    out << YAML::EndMap << YAML::EndMap;
  }
  out << YAML::EndSeq;
  if (partition && count > 1) {
    out << YAML::Key << "constraints" << YAML::Value << YAML::BeginSeq << YAML::BeginMap;
    out << YAML::Key << "requests" << YAML::Value << YAML::Flow << YAML::BeginSeq;
    for (int i = 0; i < count; ++i) out << RequestName(i, count);
    out << YAML::EndSeq;
    out << YAML::Key << "matchAttribute" << YAML::Value << absl::StrCat(driver, "/", dra::PartitionAttribute(count));
    out << YAML::EndMap << YAML::EndSeq;
  }
  out << YAML::EndMap << YAML::EndMap << YAML::EndMap << YAML::EndMap;
  return absl::StrCat(out.c_str(), "\n");
}

// The sizes of the multi-GPU templates: all of the model's GPUs, or with partitions each size up to that.
std::vector<int> MultiGpuCounts(const DraModel& model, const std::set<int>& partition_sizes) {
  std::vector<int> counts;
  if (partition_sizes.empty()) {
    if (model.gpus > 1) counts.push_back(model.gpus);
    return counts;
  }
  for (int size : partition_sizes) {
    if (size > 1 && size <= model.gpus) counts.push_back(size);
  }
  return counts;
}

// spec.template.spec of a VirtualMachine: the claim from the template, one gpus[] entry per request.
std::string VmClaimSnippet(const DraModel& model, int count) {
  const std::string claim = count == 1 ? "gpu" : "gpus";
  YAML::Emitter out;
  out << YAML::BeginMap << YAML::Key << "spec" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "template" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "spec" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "resourceClaims" << YAML::Value << YAML::BeginSeq << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << claim;
  out << YAML::Key << "resourceClaimTemplateName" << YAML::Value << TemplateName(model, count);
  out << YAML::EndMap << YAML::EndSeq;
  out << YAML::Key << "domain" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "devices" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "gpus" << YAML::Value << YAML::BeginSeq;
  for (int i = 0; i < count; ++i) {
    out << YAML::BeginMap;
    out << YAML::Key << "name" << YAML::Value << absl::StrCat("gpu", i);
    out << YAML::Key << "claimName" << YAML::Value << claim;
    out << YAML::Key << "requestName" << YAML::Value << RequestName(i, count);
    out << YAML::EndMap;
  }
  out << YAML::EndSeq << YAML::EndMap << YAML::EndMap << YAML::EndMap << YAML::EndMap << YAML::EndMap << YAML::EndMap;
  return out.c_str();
}

// The same VM as on a device-plugin node: the scheduler turns the extended-resource request into a claim.
std::string VmDeviceNameSnippet(const DraModel& model) {
  YAML::Emitter out;
  out << YAML::BeginMap << YAML::Key << "spec" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "template" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "spec" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "domain" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "devices" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "gpus" << YAML::Value << YAML::BeginSeq << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << "gpu0";
  out << YAML::Key << "deviceName" << YAML::Value << model.resource_name;
  out << YAML::EndMap << YAML::EndSeq;
  out << YAML::EndMap << YAML::EndMap << YAML::EndMap << YAML::EndMap << YAML::EndMap << YAML::EndMap;
  return out.c_str();
}

std::string Commented(const std::string& title, const std::string& yaml) {
  std::string text = absl::StrCat("#\n# ", title, "\n");
  for (absl::string_view line : absl::StrSplit(yaml, '\n')) absl::StrAppend(&text, "#   ", line, "\n");
  return text;
}

}  // namespace

std::vector<DraModel> DraModels(const std::vector<std::pair<uint16_t, uint16_t>>& ids,
                                const names::NameResolver& names) {
  const auto resolved = names.Resolve(ids);
  std::map<std::string, int> gpus;
  for (const auto& [vendor, device] : ids) {
    if (auto it = resolved.find(names::NameKey(vendor, device)); it != resolved.end()) {
      ++gpus[it->second.resource_name];
    }
  }
  std::vector<DraModel> models;
  models.reserve(gpus.size());
  for (const auto& [resource_name, count] : gpus) models.push_back({resource_name, count});
  return models;
}

std::vector<DraModel> VgpuDraModels(const vgpu::Discovery& discovery, std::string_view domain) {
  std::map<std::string, int> vgpus;
  auto count = [&](const std::string& type_name) {
    if (absl::StatusOr<std::string> name = names::VgpuResourceName(domain, type_name); name.ok()) ++vgpus[*name];
  };
  for (const vgpu::Mdev& mdev : discovery.mdevs) count(mdev.type_name);
  for (const vgpu::SriovVgpu& vgpu : discovery.vgpus) count(vgpu.type_name);
  std::vector<DraModel> models;
  models.reserve(vgpus.size());
  for (const auto& [resource_name, n] : vgpus) models.push_back({resource_name, n});
  return models;
}

std::string DeviceClassName(const std::string& resource_name, const std::string& driver) {
  return absl::StrCat(ModelLabel(resource_name), ".", driver);
}

std::string IommufdDeviceClassName(const std::string& resource_name, const std::string& driver) {
  return absl::StrCat(ModelLabel(resource_name), std::string(dra::kIommufdClassSuffix), ".", driver);
}

std::string DeviceClassSelector(const std::string& resource_name, const std::string& driver) {
  return absl::StrCat("device.driver == \"", driver, "\" && device.attributes[\"", driver, "\"].",
                      std::string(dra::kResourceNameAttribute), " == \"", NamePart(resource_name), "\"");
}

std::string DeviceClassesYaml(const std::vector<DraModel>& models, const std::string& driver, bool iommufd_classes) {
  std::vector<std::string> docs;
  docs.reserve(models.size());
  for (const DraModel& model : models) {
    docs.push_back(DeviceClassYaml(model, driver));
    if (iommufd_classes) docs.push_back(DeviceClassYaml(model, driver, /*iommufd=*/true));
  }
  return absl::StrJoin(docs, "---\n");
}

std::string DraConfigYaml(const std::vector<DraModel>& models, const std::string& driver,
                          const std::set<int>& partition_sizes, bool iommufd_classes) {
  const bool partitions = !partition_sizes.empty();
  std::vector<std::string> docs;
  for (const DraModel& model : models) {
    docs.push_back(DeviceClassYaml(model, driver));
    if (iommufd_classes) docs.push_back(DeviceClassYaml(model, driver, /*iommufd=*/true));
    docs.push_back(ClaimTemplateYaml(model, 1, driver, partitions));
    for (int count : MultiGpuCounts(model, partition_sizes)) {
      docs.push_back(ClaimTemplateYaml(model, count, driver, partitions));
    }
  }
  std::string text = absl::StrCat(
      "# DRA objects for this node's GPUs, driver ", driver, ".\n"
      "# The DeviceClasses are cluster-wide; the ResourceClaimTemplates belong in each VM's namespace:\n"
      "# so: kubectl apply -n <VM namespace> -f <this file>\n"
      "# VMs with claims need KubeVirt >= 1.9 (GPUsWithDRA). A VM asking for the GPU by deviceName runs unchanged\n"
      "# through the class's extendedResourceName (Kubernetes >= 1.36, DRAExtendedResource); KubeVirt still wants\n"
      "# that name's permittedHostDevices entry (kubevirt-config --format cozystack or kubevirt-patch; for vGPU types\n"
      "# kubevirt-config --workload vm-vgpu).\n");
  if (iommufd_classes) {
    absl::StrAppend(&text, "# Each model's <model>-iommufd class hands the VM the iommufd nodes (/dev/vfio/devices/vfioN,\n"
                           "# /dev/iommu) instead of the legacy group: only with KubeVirt >= 1.9 and its iommufd gate on.\n");
  }
  if (partitions) {
    absl::StrAppend(&text, "# Fabric Manager partitions of ", absl::StrJoin(partition_sizes, ", "),
                    " GPUs: a claim of N GPUs is one partition,\n# its N requests tied by matchAttribute ", driver, "/",
                    std::string(dra::kPartitionAttributePrefix), "<N> (any other set is refused at Prepare).\n");
  }
  absl::StrAppend(&text, docs.empty() ? "" : "---\n", absl::StrJoin(docs, "---\n"));
  for (const DraModel& model : models) {
    absl::StrAppend(&text, Commented(absl::StrCat("VirtualMachine with one ", NamePart(model.resource_name),
                                                  " through a claim:"),
                                     VmClaimSnippet(model, 1)));
    for (int count : MultiGpuCounts(model, partition_sizes)) {
      absl::StrAppend(&text, Commented(absl::StrCat("VirtualMachine with ", count, " ", NamePart(model.resource_name),
                                                    partitions ? " in one claim (one partition):" : " in one claim:"),
                                       VmClaimSnippet(model, count)));
    }
    absl::StrAppend(&text, Commented(absl::StrCat("VirtualMachine with one ", NamePart(model.resource_name),
                                                  " as on a device-plugin node (unchanged spec):"),
                                     VmDeviceNameSnippet(model)));
  }
  return text;
}

}  // namespace vfio_agent::validation
