// Layer 5 on a vm-vgpu node: what the KubeVirt CR permits, against the vGPU resources this node advertises.
//
// Checked against kubevirt/kubevirt @ d923fdb8 (2026-08-22):
// - virt-controller services/renderresources.go validatePermittedHostDevices: a VM's gpus[].deviceName is
//   admitted when any pciHostDevices, mediatedDevices or usb entry has it as resourceName.
// - virt-handler device-manager/device_controller.go updatePermittedHostDevicePlugins: an entry without
//   externalResourceProvider makes virt-handler serve the name itself. pciHostDevices are keyed by lower-cased
//   pciVendorSelector, and since PR #16890 discoverPermittedHostPCIDevices (pci_device.go) with shouldPermitNvidia
//   (nvidia.go) takes every VF on `nvidia` with a non-zero nvidia/current_vgpu_type: all profiles of one card
//   (they share the PF's vendor:device) under one name. So an SR-IOV profile is permitted as a pciHostDevices
//   entry {pciVendorSelector: the VF's "10DE:xxxx", resourceName, externalResourceProvider: true}; the selector is
//   then not matched at all (several profiles may repeat it) but is required by the CRD.
// - mediatedDevices entries: mdevNameSelector compared with mdev_type/name after every space of both becomes '_'
//   (removeSelectorSpaces; mediated_device.go getMdevTypeName). mediated_devices_types.go
//   updateMDEVTypesConfiguration removes every mdev whose type is neither in mediatedDevicesConfiguration nor
//   named by an externalResourceProvider entry, unless mdev handling is disabled: a wrong selector costs mdevs.
// - virt-launcher gpu/hostdev.go takes PCI addresses from PCI_RESOURCE_<name> and mdev UUIDs from
//   MDEV_PCI_RESOURCE_<name>, whichever the device plugin set, so only the entry's resourceName reaches the VM.
#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "check_builder.h"
#include "kubevirt_cr.h"
#include "kubevirt_shared.h"
#include "vfio_gpu_agent/names/resource_names.h"
#include "vfio_gpu_agent/validation/kubevirt_config.h"

namespace vfio_agent::validation {
namespace {

using internal::CheckBuilder;
using internal::CrName;

constexpr Layer kKubevirtLayer = Layer::kKubevirt;
constexpr char kMdevPath[] = "spec.configuration.permittedHostDevices.mediatedDevices";
constexpr char kAddVgpuEntryFix[] =
    "Apply the merge patch `vfio-gpu-agent kubevirt-config --workload vm-vgpu` prints (`kubectl patch kubevirt -n "
    "kubevirt kubevirt --type merge --patch-file <file>`), with the entries the CR has for other nodes added to its "
    "lists.";

// virt-handler's removeSelectorSpaces / getMdevTypeName: every space to '_', then trimmed.
std::string MdevSelectorKey(std::string_view text) {
  return std::string(absl::StripAsciiWhitespace(absl::StrReplaceAll(absl::string_view(text.data(), text.size()), {{" ", "_"}})));
}

std::string ExternalText(const std::optional<bool>& external) {
  return external ? (*external ? "true" : "false") : "(absent)";
}

// One advertised vGPU resource and what KubeVirt must be told about it.
struct VgpuResource {
  bool mdev = false;
  std::set<std::string> type_names;  // mdev_type/name, or the SR-IOV profile name
  std::set<std::string> selectors;   // SR-IOV: the VFs' "10DE:xxxx"
};

std::map<std::string, VgpuResource> ResourcesOf(const NodeView& node) {
  std::map<std::string, VgpuResource> out;
  const vgpu::Discovery& discovery = *node.vgpu->discovery;
  for (const vgpu::Mdev& mdev : discovery.mdevs) {
    absl::StatusOr<std::string> name = names::VgpuResourceName(node.vgpu->domain, mdev.type_name);
    if (!name.ok()) continue;
    out[*name].mdev = true;
    out[*name].type_names.insert(mdev.type_name);
  }
  for (const vgpu::SriovVgpu& vf : discovery.vgpus) {
    absl::StatusOr<std::string> name = names::VgpuResourceName(node.vgpu->domain, vf.type_name);
    if (!name.ok()) continue;
    out[*name].type_names.insert(vf.type_name);
    if (const pci::Function* fn = node.inventory->Find(vf.bdf)) {
      out[*name].selectors.insert(PciVendorSelector(fn->vendor_id, fn->device_id));
    }
  }
  // Only what the node advertises (a resource the model dropped has its reason in the vgpu layer).
  const std::map<std::string, node::ServedDevices> served = node::ByResource(*node.served);
  std::erase_if(out, [&](const auto& item) { return !served.contains(item.first); });
  return out;
}

void CheckMdev(const KubevirtCr& cr, const std::string& name, const VgpuResource& resource, std::vector<Check>* out) {
  CheckBuilder check("kubevirt.permitted", kKubevirtLayer, name);
  const std::string source = absl::StrCat(CrName(cr), " ", kMdevPath);
  std::vector<const MediatedDeviceEntry*> entries;
  for (const MediatedDeviceEntry& entry : cr.mediated_devices) {
    if (entry.resource_name == name) entries.push_back(&entry);
  }
  const std::string type = *resource.type_names.begin();
  if (entries.empty()) {
    check.Saw(source, cr.has_permitted_host_devices
                          ? absl::StrCat(cr.mediated_devices.size(), " entries, none with resourceName ", name)
                          : "permittedHostDevices absent");
    out->push_back(check.Fail(
        absl::StrCat(name, " is not permitted as a mediated device: KubeVirt rejects VMs asking for it, and "
                           "virt-handler may remove the ", type, " mdevs as undesired"),
        kAddVgpuEntryFix));
    return;
  }
  const MediatedDeviceEntry* match = nullptr;
  for (const MediatedDeviceEntry* entry : entries) {
    check.Saw(absl::StrCat(source, "[", entry->index, "]"),
              absl::StrFormat("mdevNameSelector=%s resourceName=%s externalResourceProvider=%s",
                              entry->mdev_name_selector, entry->resource_name,
                              ExternalText(entry->external_resource_provider)));
    if (MdevSelectorKey(entry->mdev_name_selector) == MdevSelectorKey(type)) match = entry;
  }
  if (match == nullptr) {
    out->push_back(check.Fail(
        absl::StrCat(name, " is permitted, but no entry's mdevNameSelector is the type \"", type,
                     "\": virt-handler treats these mdevs as nobody's and may remove them"),
        absl::StrCat("Set mdevNameSelector: \"", type, "\" (the type's mdev_type/name) on the ", name, " entry.")));
    return;
  }
  if (!match->external_resource_provider.value_or(false)) {
    out->push_back(check.Fail(
        absl::StrCat(kMdevPath, "[", match->index, "] lacks externalResourceProvider: true, so virt-handler serves ",
                     name, " itself and competes with this agent"),
        absl::StrCat("Set externalResourceProvider: true on the ", name, " entry.")));
    return;
  }
  out->push_back(check.Pass(absl::StrCat(name, " is permitted for type \"", type, "\", provided by this agent")));
}

void CheckSriov(const KubevirtCr& cr, const std::string& name, const VgpuResource& resource,
                std::vector<Check>* out) {
  CheckBuilder check("kubevirt.permitted", kKubevirtLayer, name);
  const std::string source = absl::StrCat(CrName(cr), " ", internal::kPciHostDevicesPath);
  std::vector<const PciHostDeviceEntry*> entries;
  for (const PciHostDeviceEntry& entry : cr.pci_host_devices) {
    if (entry.resource_name == name) entries.push_back(&entry);
  }
  if (entries.empty()) {
    check.Saw(source, cr.has_permitted_host_devices
                          ? absl::StrCat(cr.pci_host_devices.size(), " entries, none with resourceName ", name)
                          : "permittedHostDevices absent");
    out->push_back(check.Fail(absl::StrCat(name, " is not permitted: KubeVirt rejects VMs asking for it (\"not "
                                           "permitted in permittedHostDevices configuration\")"),
                              kAddVgpuEntryFix));
    return;
  }
  std::vector<std::string> internal;
  for (const PciHostDeviceEntry* entry : entries) {
    check.Saw(absl::StrCat(source, "[", entry->index, "]"),
              absl::StrFormat("pciVendorSelector=%s resourceName=%s externalResourceProvider=%s",
                              entry->pci_vendor_selector, entry->resource_name,
                              ExternalText(entry->external_resource_provider)));
    if (!entry->external_resource_provider.value_or(false)) internal.push_back(absl::StrCat("[", entry->index, "]"));
  }
  if (!internal.empty()) {
    out->push_back(check.Fail(
        absl::StrCat("entry ", absl::StrJoin(internal, ","), " lacks externalResourceProvider: true: virt-handler then "
                     "advertises every vGPU VF of that pciVendorSelector (all profiles of the card) as ", name),
        absl::StrCat("Set externalResourceProvider: true on the ", name, " entry.")));
    return;
  }
  std::vector<std::string> other;  // selectors that name no VF of this profile: harmless, but misleading
  for (const PciHostDeviceEntry* entry : entries) {
    const auto ids = ParsePciVendorSelector(entry->pci_vendor_selector);
    if (!ids || resource.selectors.count(PciVendorSelector(ids->first, ids->second)) == 0) {
      other.push_back(entry->pci_vendor_selector.empty() ? "(none)" : entry->pci_vendor_selector);
    }
  }
  if (!other.empty()) {
    check.Saw("this profile's VFs", resource.selectors.empty() ? "(none)" : absl::StrJoin(resource.selectors, ","));
    out->push_back(check.Warn(
        absl::StrCat(name, " is permitted and provided by this agent, but pciVendorSelector ", absl::StrJoin(other, ","),
                     " is not its VFs' id (KubeVirt ignores it with externalResourceProvider: true)"),
        absl::StrCat("Set pciVendorSelector: ", *resource.selectors.begin(), " so the entry says which card it is.")));
    return;
  }
  out->push_back(check.Pass(absl::StrCat(name, " is permitted, provided by this agent")));
}

}  // namespace

std::vector<Check> VgpuKubevirtChecks(const NodeView& node, const std::optional<std::string>& kubevirt_cr) {
  std::vector<Check> out;
  if (!kubevirt_cr) {
    out.push_back(CheckBuilder("kubevirt.permitted", kKubevirtLayer, "node")
                      .Skip("not checked: no KubeVirt CR given (--kubevirt-cr FILE, e.g. from `kubectl get kubevirt "
                            "-A -o yaml`) and no cluster to read it from (--kubeconfig, or in-cluster)"));
    return out;
  }
  absl::StatusOr<KubevirtCr> cr = ParseKubevirtCr(*kubevirt_cr);
  if (!cr.ok()) {
    out.push_back(CheckBuilder("kubevirt.permitted", kKubevirtLayer, "node")
                      .Saw("--kubevirt-cr", std::string(cr.status().message()))
                      .Fail(absl::StrCat("the KubeVirt CR given cannot be read: ", cr.status().message()),
                            "Pass the output of `kubectl get kubevirt -A -o yaml` (YAML or JSON) unchanged."));
    return out;
  }
  const std::map<std::string, VgpuResource> resources =
      node.vgpu != nullptr && node.vgpu->discovery != nullptr && node.served != nullptr
          ? ResourcesOf(node)
          : std::map<std::string, VgpuResource>{};
  if (resources.empty()) {
    out.push_back(CheckBuilder("kubevirt.permitted", kKubevirtLayer, "node")
                      .Skip("not checked: this node advertises no vGPU (see the vgpu layer)"));
  }
  for (const auto& [name, resource] : resources) {
    if (resource.mdev) {
      CheckMdev(*cr, name, resource, &out);
    } else {
      CheckSriov(*cr, name, resource, &out);
    }
  }
  internal::CheckFeatureGates(*cr, &out);
  return out;
}

}  // namespace vfio_agent::validation
