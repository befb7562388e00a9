#include "vfio_gpu_agent/validation/kubevirt_config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace vfio_agent::validation {
namespace {

// Cozystack's table (gpu-passthrough-defaults.yaml) is NVIDIA's, under nvidia.com.
constexpr char kCozystackDomain[] = "nvidia.com/";

void EmitEntries(YAML::Emitter& out, const std::vector<const PermittedEntry*>& entries) {
  out << YAML::BeginSeq;
  for (const PermittedEntry* entry : entries) {
    out << YAML::BeginMap;
    out << YAML::Key << "pciVendorSelector" << YAML::Value << YAML::DoubleQuoted
        << PciVendorSelector(entry->vendor_id, entry->device_id);
    out << YAML::Key << "resourceName" << YAML::Value << entry->resource_name;
    out << YAML::Key << "externalResourceProvider" << YAML::Value << true;
    out << YAML::EndMap;
  }
  out << YAML::EndSeq;
}

// The comment and the maps down to spec.configuration.permittedHostDevices, left open for the lists.
void BeginMergePatch(YAML::Emitter& out, std::string_view replaced) {
  out << YAML::Comment(absl::StrCat(
             "Merge patch for a plain KubeVirt CR:\n"
             "  kubectl patch kubevirt kubevirt -n kubevirt --type merge --patch-file <this file>\n"
             "A merge patch replaces the whole ", absl::string_view(replaced.data(), replaced.size()), ": add the entries the CR already has for other "
             "nodes' GPUs.\nThe HostDevices feature gate must be on as well "
             "(spec.configuration.developerConfiguration.featureGates); it is not patched here because that would "
             "replace the other gates."))
      << YAML::Newline;
  out << YAML::BeginMap << YAML::Key << "spec" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "configuration" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "permittedHostDevices" << YAML::Value << YAML::BeginMap;
}

std::string Line(const PermittedEntry& entry) {
  return absl::StrCat(PciVendorSelector(entry.vendor_id, entry.device_id), " ", entry.resource_name);
}

}  // namespace

std::string PciVendorSelector(uint16_t vendor_id, uint16_t device_id) {
  return absl::StrFormat("%04X:%04X", vendor_id, device_id);
}

std::vector<PermittedEntry> PermittedEntries(const std::vector<std::pair<uint16_t, uint16_t>>& ids,
                                             const names::NameResolver& names) {
  const std::set<std::pair<uint16_t, uint16_t>> distinct(ids.begin(), ids.end());
  const auto resolved = names.Resolve(ids);
  std::vector<PermittedEntry> out;
  for (const auto& [vendor, device] : distinct) {
    PermittedEntry entry;
    entry.vendor_id = vendor;
    entry.device_id = device;
    auto it = resolved.find(names::NameKey(vendor, device));
    if (it == resolved.end()) continue;
    entry.resource_name = it->second.resource_name;
    if (vendor == 0x10de) {
      const auto& table = names::PinnedNames();
      if (auto pinned = table.find(device); pinned != table.end()) {
        const std::string default_name = absl::StrCat(kCozystackDomain, pinned->second);
        entry.in_cozystack_defaults = default_name == entry.resource_name;
        if (!entry.in_cozystack_defaults) entry.cozystack_default_name = default_name;
      }
    }
    out.push_back(std::move(entry));
  }
  return out;
}

std::string CozystackValuesYaml(const std::vector<PermittedEntry>& entries) {
  std::vector<const PermittedEntry*> missing;
  std::string header =
      "Cozystack platform values for this node's GPUs: gpu.permittedHostDevices.pciHostDevices.\n"
      "With gpu.replaceDefaults false (the default) Cozystack appends this list to its default table.";
  std::string present, shadowed;
  for (const PermittedEntry& entry : entries) {
    if (entry.in_cozystack_defaults) {
      absl::StrAppend(&present, "\n  ", Line(entry));
      continue;
    }
    missing.push_back(&entry);
    if (!entry.cozystack_default_name.empty()) {
      absl::StrAppend(&shadowed, "\n  ", PciVendorSelector(entry.vendor_id, entry.device_id), " is ",
                      entry.cozystack_default_name, " there, but this node advertises ", entry.resource_name);
    }
  }
  if (!present.empty()) absl::StrAppend(&header, "\nAlready in Cozystack's default table (nothing to add):", present);
  if (!shadowed.empty()) {
    absl::StrAppend(&header,
                    "\nRenamed here (--resource-name), so the default table's entry does not match:", shadowed,
                    "\nAppending the entry below lists that selector twice, which Cozystack resolves "
                    "non-deterministically:\ndrop the override, or set gpu.replaceDefaults: true and list every GPU.");
  }
  if (missing.empty()) absl::StrAppend(&header, "\nNothing to add: every GPU here is in the default table.");

  YAML::Emitter out;
  out << YAML::Comment(header) << YAML::Newline;
  out << YAML::BeginMap << YAML::Key << "gpu" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "permittedHostDevices" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "pciHostDevices" << YAML::Value;
  if (missing.empty()) out << YAML::Flow;
  EmitEntries(out, missing);
  out << YAML::EndMap << YAML::EndMap << YAML::EndMap;
  return absl::StrCat(out.c_str(), "\n");
}

std::string KubevirtMergePatchYaml(const std::vector<PermittedEntry>& entries) {
  std::vector<const PermittedEntry*> all;
  for (const PermittedEntry& entry : entries) all.push_back(&entry);
  YAML::Emitter out;
  BeginMergePatch(out, "pciHostDevices list");
  out << YAML::Key << "pciHostDevices" << YAML::Value;
  if (all.empty()) out << YAML::Flow;
  EmitEntries(out, all);
  out << YAML::EndMap << YAML::EndMap << YAML::EndMap << YAML::EndMap;
  return absl::StrCat(out.c_str(), "\n");
}

std::vector<VgpuPermittedEntry> VgpuPermittedEntries(const vgpu::Discovery& discovery, const pci::Inventory& inventory,
                                                     std::string_view domain) {
  std::map<std::string, VgpuPermittedEntry> by_name;
  for (const vgpu::Mdev& mdev : discovery.mdevs) {
    absl::StatusOr<std::string> name = names::VgpuResourceName(domain, mdev.type_name);
    if (name.ok()) by_name[*name] = {.resource_name = *name, .mdev_type_name = mdev.type_name};
  }
  for (const vgpu::SriovVgpu& vf : discovery.vgpus) {
    absl::StatusOr<std::string> name = names::VgpuResourceName(domain, vf.type_name);
    const pci::Function* fn = inventory.Find(vf.bdf);
    if (!name.ok() || fn == nullptr) continue;
    by_name[*name] = {.resource_name = *name, .vendor_id = fn->vendor_id, .device_id = fn->device_id};
  }
  std::vector<VgpuPermittedEntry> out;
  out.reserve(by_name.size());
  for (auto& [name, entry] : by_name) out.push_back(std::move(entry));
  return out;
}

std::string VgpuKubevirtMergePatchYaml(const std::vector<VgpuPermittedEntry>& entries) {
  std::vector<const VgpuPermittedEntry*> mdev, pci;
  for (const VgpuPermittedEntry& entry : entries) (entry.mdev_type_name.empty() ? pci : mdev).push_back(&entry);
  YAML::Emitter out;
  BeginMergePatch(out, "mediatedDevices and pciHostDevices lists (each one only when listed below)");
  if (!mdev.empty()) {
    out << YAML::Key << "mediatedDevices" << YAML::Value << YAML::BeginSeq;
    for (const VgpuPermittedEntry* entry : mdev) {
      out << YAML::BeginMap;
      out << YAML::Key << "mdevNameSelector" << YAML::Value << YAML::DoubleQuoted << entry->mdev_type_name;
      out << YAML::Key << "resourceName" << YAML::Value << entry->resource_name;
      out << YAML::Key << "externalResourceProvider" << YAML::Value << true;
      out << YAML::EndMap;
    }
    out << YAML::EndSeq;
  }
  if (!pci.empty() || mdev.empty()) {
    out << YAML::Key << "pciHostDevices" << YAML::Value;
    if (pci.empty()) out << YAML::Flow;
    std::vector<PermittedEntry> as_pci;
    as_pci.reserve(pci.size());
    for (const VgpuPermittedEntry* entry : pci) {
      as_pci.push_back({.vendor_id = entry->vendor_id, .device_id = entry->device_id,
                        .resource_name = entry->resource_name});
    }
    std::vector<const PermittedEntry*> pointers;
    pointers.reserve(as_pci.size());
    for (const PermittedEntry& entry : as_pci) pointers.push_back(&entry);
    EmitEntries(out, pointers);
  }
  out << YAML::EndMap << YAML::EndMap << YAML::EndMap << YAML::EndMap;
  return absl::StrCat(out.c_str(), "\n");
}

}  // namespace vfio_agent::validation
