// Layer 5: what the KubeVirt CR permits, against what this node advertises.
#include <algorithm>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "cluster_check_util.h"
#include "kubevirt_cr.h"
#include "kubevirt_shared.h"
#include "vfio_backend_checks.h"
#include "vfio_gpu_agent/validation/kubevirt_config.h"

namespace vfio_agent::validation {
namespace {

using cluster::MakeCheck;

constexpr char kGatesPath[] = "spec.configuration.developerConfiguration.featureGates";
constexpr char kAddEntryFix[] =
    "Cozystack: add the output of `vfio-gpu-agent kubevirt-config` to the platform values "
    "(gpu.permittedHostDevices.pciHostDevices); plain KubeVirt: apply `vfio-gpu-agent kubevirt-config --format "
    "kubevirt-patch`.";

}  // namespace

// Shared with the vGPU checks (kubevirt_shared.h).
namespace internal {

std::string CrName(const KubevirtCr& cr) {
  return cr.namespace_.empty() ? absl::StrCat("kubevirt ", cr.name) : absl::StrCat("kubevirt ", cr.namespace_, "/", cr.name);
}

}  // namespace internal

namespace {

using internal::CrName;

std::string EntryText(const PciHostDeviceEntry& entry) {
  return absl::StrFormat("pciVendorSelector=%s resourceName=%s externalResourceProvider=%s",
                         entry.pci_vendor_selector.empty() ? "(none)" : entry.pci_vendor_selector,
                         entry.resource_name.empty() ? "(none)" : entry.resource_name,
                         entry.external_resource_provider ? (*entry.external_resource_provider ? "true" : "false")
                                                          : "(absent)");
}

Evidence EntryEvidence(const KubevirtCr& cr, const PciHostDeviceEntry& entry) {
  return {absl::StrCat(CrName(cr), " ", internal::kPciHostDevicesPath, "[", entry.index, "]"), EntryText(entry)};
}

// What the node advertises now (node.served) and what it will once every selected GPU is bound.
struct NodeNames {
  std::map<std::string, std::vector<std::string>> selectors_of;  // resource name -> "10DE:2335"...
  std::map<std::pair<uint16_t, uint16_t>, std::string> name_of;  // (vendor, device) -> resource name
};

NodeNames NamesOf(const NodeView& node, const names::NameResolver& names) {
  NodeNames out;
  std::vector<std::pair<uint16_t, uint16_t>> ids;
  if (node.selection != nullptr && node.inventory != nullptr) {
    for (const auto& bdf : node.selection->gpus) {
      if (const pci::Function* fn = node.inventory->Find(bdf)) ids.emplace_back(fn->vendor_id, fn->device_id);
    }
  }
  for (const PermittedEntry& entry : PermittedEntries(ids, names)) {
    out.name_of[{entry.vendor_id, entry.device_id}] = entry.resource_name;
    out.selectors_of[entry.resource_name].push_back(PciVendorSelector(entry.vendor_id, entry.device_id));
  }
  if (node.served != nullptr) {
    for (const node::ServedDevice& device : *node.served) out.selectors_of[device.resource_name];
  }
  return out;
}

void CheckPermitted(const KubevirtCr& cr, const NodeNames& node_names, std::vector<Check>* out) {
  if (node_names.selectors_of.empty()) {
    out->push_back(MakeCheck("kubevirt.permitted", Layer::kKubevirt, "node", Result::kSkip,
                             "not checked: this node has no GPU to advertise (see layer 2)"));
    out->push_back(MakeCheck("kubevirt.external_provider", Layer::kKubevirt, "node", Result::kSkip,
                             "not checked: this node has no GPU to advertise (see layer 2)"));
    return;
  }
  const std::string cr_source = absl::StrCat(CrName(cr), " ", internal::kPciHostDevicesPath);
  for (const auto& [name, selectors] : node_names.selectors_of) {
    std::vector<const PciHostDeviceEntry*> entries;
    for (const auto& entry : cr.pci_host_devices) {
      if (entry.resource_name == name) entries.push_back(&entry);
    }
    if (entries.empty()) {
      const std::string value =
          !cr.has_permitted_host_devices
              ? "permittedHostDevices absent"
              : absl::StrCat(cr.pci_host_devices.size(), " entries, none with resourceName ", name);
      out->push_back(MakeCheck(
          "kubevirt.permitted", Layer::kKubevirt, name, Result::kFail,
          absl::StrCat(name, " is not permitted: KubeVirt rejects VMs asking for it (\"not permitted in "
                       "permittedHostDevices configuration\")"),
          {{cr_source, value}}, kAddEntryFix));
      out->push_back(MakeCheck("kubevirt.external_provider", Layer::kKubevirt, name, Result::kSkip,
                               "not checked: no entry for it (see kubevirt.permitted)"));
      continue;
    }
    std::vector<Evidence> evidence;
    for (const auto* entry : entries) evidence.push_back(EntryEvidence(cr, *entry));
    out->push_back(MakeCheck("kubevirt.permitted", Layer::kKubevirt, name, Result::kPass,
                             absl::StrCat(name, " is permitted"), evidence));
    std::vector<std::string> internal;
    for (const auto* entry : entries) {
      if (!entry->external_resource_provider.value_or(false)) internal.push_back(absl::StrCat("[", entry->index, "]"));
    }
    if (internal.empty()) {
      out->push_back(MakeCheck("kubevirt.external_provider", Layer::kKubevirt, name, Result::kPass,
                               "externalResourceProvider: true (virt-handler leaves it to this agent)",
                               std::move(evidence)));
    } else {
      out->push_back(MakeCheck(
          "kubevirt.external_provider", Layer::kKubevirt, name, Result::kFail,
          absl::StrCat("entry ", absl::StrJoin(internal, ","),
                       " lacks externalResourceProvider: true, so virt-handler serves ", name,
                       " itself and competes with this agent"),
          std::move(evidence),
          absl::StrCat("Set externalResourceProvider: true on the ", name, " entry (Cozystack: in "
                       "gpu.permittedHostDevices.pciHostDevices).")));
    }
  }
}

}  // namespace

namespace internal {

void CheckFeatureGates(const KubevirtCr& cr, std::vector<Check>* out) {
  const std::string source = absl::StrCat(CrName(cr), " ", kGatesPath);
  const std::string value = cr.feature_gates.empty() ? "(none)" : absl::StrJoin(cr.feature_gates, ",");
  auto has = [&](std::string_view gate) {
    return std::find(cr.feature_gates.begin(), cr.feature_gates.end(), gate) != cr.feature_gates.end();
  };
  constexpr char kGateFix[] =
      "Add %s to %s (Cozystack: %s; plain KubeVirt: `kubectl edit kubevirt -n kubevirt kubevirt`).";
  constexpr char kCozystackHostDevices[] = "it adds HostDevices when the cozystack.gpu-operator package is enabled";
  constexpr char kCozystackGpu[] = "its kubevirt chart sets GPU itself; a CR without it was not rendered by that chart";
  if (has("HostDevices")) {
    out->push_back(MakeCheck("kubevirt.feature_gate", Layer::kKubevirt, "HostDevices", Result::kPass,
                             "the HostDevices feature gate is on", {{source, value}}));
  } else {
    out->push_back(MakeCheck("kubevirt.feature_gate", Layer::kKubevirt, "HostDevices", Result::kFail,
                             "the HostDevices feature gate is off: KubeVirt ignores permittedHostDevices",
                             {{source, value}}, absl::StrFormat(kGateFix, "HostDevices", kGatesPath, kCozystackHostDevices)));
  }
  // Only KubeVirt releases that still gate `spec.domain.devices.gpus` (what Cozystack's VMInstance renders)
  // need GPU, so its absence is a warning, not a failure.
  if (has("GPU")) {
    out->push_back(MakeCheck("kubevirt.feature_gate", Layer::kKubevirt, "GPU", Result::kPass,
                             "the GPU feature gate is on", {{source, value}}));
  } else {
    out->push_back(MakeCheck(
        "kubevirt.feature_gate", Layer::kKubevirt, "GPU", Result::kWarn,
        "the GPU feature gate is off: KubeVirt releases that gate devices.gpus reject such VMs (\"GPU feature "
        "gate is not enabled\")",
        {{source, value}}, absl::StrFormat(kGateFix, "GPU", kGatesPath, kCozystackGpu)));
  }
}

}  // namespace internal

namespace {

using internal::CheckFeatureGates;

void CheckDuplicateSelectors(const KubevirtCr& cr, std::vector<Check>* out) {
  std::map<std::string, std::vector<const PciHostDeviceEntry*>> by_selector;  // upper-cased selector
  for (const auto& entry : cr.pci_host_devices) {
    by_selector[absl::AsciiStrToUpper(entry.pci_vendor_selector)].push_back(&entry);
  }
  bool any = false;
  for (const auto& [selector, entries] : by_selector) {
    if (entries.size() < 2) continue;
    any = true;
    std::vector<Evidence> evidence;
    bool differ = false;
    for (const auto* entry : entries) {
      evidence.push_back(EntryEvidence(cr, *entry));
      differ |= entry->resource_name != entries.front()->resource_name ||
                entry->external_resource_provider.value_or(false) !=
                    entries.front()->external_resource_provider.value_or(false);
    }
    out->push_back(MakeCheck(
        "kubevirt.duplicate_selector", Layer::kKubevirt, selector, differ ? Result::kFail : Result::kWarn,
        differ ? absl::StrCat(entries.size(), " entries for ", selector,
                              " disagree; which one KubeVirt uses is not deterministic")
               : absl::StrCat(entries.size(), " identical entries for ", selector),
        std::move(evidence),
        absl::StrCat("Keep one entry for ", selector,
                     ": Cozystack appends gpu.permittedHostDevices to its default table, so remove the user entry "
                     "(or set gpu.replaceDefaults: true and list every GPU).")));
  }
  if (!any) {
    out->push_back(MakeCheck("kubevirt.duplicate_selector", Layer::kKubevirt, "node", Result::kPass,
                             "no pciVendorSelector is listed twice",
                             {{absl::StrCat(CrName(cr), " ", internal::kPciHostDevicesPath),
                               absl::StrCat(cr.pci_host_devices.size(), " entries")}}));
  }
}

void CheckNameMismatch(const KubevirtCr& cr, const NodeNames& node_names, std::vector<Check>* out) {
  bool any = false;
  for (const auto& entry : cr.pci_host_devices) {
    const auto ids = ParsePciVendorSelector(entry.pci_vendor_selector);
    if (!ids) continue;
    auto it = node_names.name_of.find(*ids);
    if (it == node_names.name_of.end() || it->second == entry.resource_name) continue;
    any = true;
    out->push_back(MakeCheck(
        "kubevirt.name_mismatch", Layer::kKubevirt, entry.resource_name.empty() ? entry.pci_vendor_selector : entry.resource_name,
        Result::kFail,
        absl::StrCat("permits ", entry.resource_name, " for ", entry.pci_vendor_selector,
                     ", but this node advertises that GPU as ", it->second,
                     " (a name from another pci.ids, or another plugin's)"),
        {EntryEvidence(cr, entry), {"name this node advertises", it->second}},
        absl::StrCat("Set resourceName: ", it->second, " in that entry, or make the agent advertise the CR's name: "
                     "--resource-name ", absl::AsciiStrToLower(entry.pci_vendor_selector), "=",
                     entry.resource_name.substr(entry.resource_name.find('/') + 1), ".")));
  }
  if (!any) {
    out->push_back(MakeCheck("kubevirt.name_mismatch", Layer::kKubevirt, "node", Result::kPass,
                             "every entry for this node's device ids names what the node advertises",
                             {{absl::StrCat(CrName(cr), " ", internal::kPciHostDevicesPath),
                               absl::StrCat(cr.pci_host_devices.size(), " entries")}}));
  }
}

}  // namespace

std::vector<Check> KubevirtChecks(const NodeView& node, const std::optional<std::string>& kubevirt_cr,
                                  const names::NameResolver& names) {
  std::vector<Check> out;
  if (!kubevirt_cr) {
    out.push_back(MakeCheck("kubevirt.permitted", Layer::kKubevirt, "node", Result::kSkip,
                            "not checked: no KubeVirt CR given (--kubevirt-cr FILE, e.g. from `kubectl get kubevirt "
                            "-A -o yaml`) and no cluster to read it from (--kubeconfig, or in-cluster)"));
    return out;
  }
  absl::StatusOr<KubevirtCr> cr = ParseKubevirtCr(*kubevirt_cr);
  if (!cr.ok()) {
    out.push_back(MakeCheck("kubevirt.permitted", Layer::kKubevirt, "node", Result::kFail,
                            absl::StrCat("the KubeVirt CR given cannot be read: ", cr.status().message()),
                            {{"--kubevirt-cr", std::string(cr.status().message())}},
                            "Pass the output of `kubectl get kubevirt -A -o yaml` (YAML or JSON) unchanged."));
    return out;
  }
  const NodeNames node_names = NamesOf(node, names);
  CheckPermitted(*cr, node_names, &out);
  CheckFeatureGates(*cr, &out);
  CheckDuplicateSelectors(*cr, &out);
  CheckNameMismatch(*cr, node_names, &out);
  out.push_back(VfioBackendCheck(node, *cr));
  return out;
}

// Failures, not skips, wherever the answer itself says the chain is broken: a node running this agent exists to
// hand its GPUs to KubeVirt VMs, so "KubeVirt is not installed", "there is no KubeVirt CR" and "the agent's
// account may not read it" all mean no VM gets a GPU here yet, or nobody can tell; exit 0 would say the node is
// ready. An operator checking a node before KubeVirt is installed leaves the layer out (--layers), as the fix
// says. Only an API server that did not answer is a skip: that says nothing about KubeVirt.
std::vector<Check> KubevirtUnavailableChecks(const KubevirtCrUnavailable& why) {
  using Reason = KubevirtCrUnavailable::Reason;
  constexpr char kRule[] =
      "ClusterRole rule {apiGroups: [\"kubevirt.io\"], resources: [\"kubevirts\"], verbs: [\"get\", \"list\"]}";
  constexpr char kWithoutLayer[] = "to check the node without KubeVirt: --layers platform,devices,plugin,kubelet";
  std::vector<Evidence> evidence = {{why.request, why.detail}};
  auto check = [&](Result result, std::string message, std::string fix) {
    return std::vector<Check>{MakeCheck("kubevirt.permitted", Layer::kKubevirt, "node", result, std::move(message),
                                        std::move(evidence), std::move(fix))};
  };
  switch (why.reason) {
    case Reason::kNotInstalled:
      return check(Result::kFail,
                   "KubeVirt is not installed: the API server does not serve kubevirt.io/v1 kubevirts (404), so no VM "
                   "can be given this node's GPUs",
                   absl::StrCat("Install KubeVirt (Cozystack: the kubevirt-operator and kubevirt packages; plain "
                                "KubeVirt: its operator and CR from the release), or ", kWithoutLayer, "."));
    case Reason::kNoCr:
      return check(Result::kFail,
                   "no KubeVirt CR in the cluster: kubevirt.io/v1 is served but no KubeVirt object exists, so "
                   "virt-operator deploys nothing and no permittedHostDevices apply",
                   absl::StrCat("Create the KubeVirt CR (Cozystack: the kubevirt package renders it; plain KubeVirt: "
                                "kubevirt-cr.yaml of the release) with the entries of `vfio-gpu-agent kubevirt-config`, "
                                "or ", kWithoutLayer, "."));
    case Reason::kUnauthorized:
      return check(Result::kFail,
                   "the API server did not accept the credentials (401), so the KubeVirt CR could not be read",
                   absl::StrCat("In the pod: the service account token is missing or expired (automountServiceAccountToken, "
                                "the ServiceAccount vfio-gpu-agent); with --kubeconfig: its user's credentials. The "
                                "account needs get/list kubevirts.kubevirt.io: ", kRule,
                                ". Or pass --kubevirt-cr FILE (`kubectl get kubevirt -A -o yaml`)."));
    case Reason::kForbidden:
      return check(Result::kFail,
                   "the agent's account lacks get/list kubevirts.kubevirt.io (403), so the KubeVirt CR could not be "
                   "read",
                   absl::StrCat("Add to the agent's ClusterRole (daemonset/base/agent/rbac.yaml ships it) the ", kRule,
                                ", bound to the ServiceAccount the pod runs as; or pass --kubevirt-cr FILE "
                                "(`kubectl get kubevirt -A -o yaml`)."));
    case Reason::kUnavailable:
      break;
  }
  return check(Result::kSkip, absl::StrCat("not checked: the KubeVirt CR could not be read from the API server (", why.detail,
                                           ")"),
               "");
}

}  // namespace vfio_agent::validation
