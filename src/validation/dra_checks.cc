#include "vfio_gpu_agent/validation/dra_checks.h"

#include <unistd.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cluster_check_util.h"
#include "kubevirt_cr.h"
#include "pluginregistration/v1/api.grpc.pb.h"
#include "vfio_gpu_agent/dra/device_names.h"
#include "vfio_gpu_agent/dra/devices.h"
#include "vfio_gpu_agent/dra/registration_record.h"
#include "vfio_gpu_agent/dra/taints.h"
#include "vfio_gpu_agent/dra/vgpu_devices.h"

namespace vfio_agent::validation {
namespace {

using cluster::MakeCheck;
using Json = nlohmann::json;

constexpr char kOverlayFix[] = "kubectl apply -k daemonset/overlays/dra (or the chart with kubeletApi: dra)";

Check RegistrationCheck(const dra::DriverOptions& options, std::chrono::milliseconds rpc_wait) {
  const std::filesystem::path socket = dra::RegistrationSocket(options);
  const std::string subject = options.driver_name;
  if (std::error_code ec; !std::filesystem::exists(socket, ec)) {
    return MakeCheck("dra.registration", Layer::kPlugin, subject, Result::kFail,
                     "no registration socket: the kubelet cannot find the DRA driver",
                     {{socket.string(), "(absent)"}},
                     absl::StrCat("run the agent with --kubelet-api dra (", kOverlayFix,
                                  "); --kubelet-registry-dir must be the kubelet's plugins_registry"));
  }
  auto stub = ::pluginregistration::Registration::NewStub(cluster::DialUnix(socket));
  grpc::ClientContext ctx;
  ctx.set_deadline(cluster::DeadlineAfter(rpc_wait));
  ::pluginregistration::PluginInfo info;
  const grpc::Status rpc = stub->GetInfo(&ctx, ::pluginregistration::InfoRequest(), &info);
  const std::string source = absl::StrCat("GetInfo ", socket.string());
  if (!rpc.ok()) {
    return MakeCheck("dra.registration", Layer::kPlugin, subject, Result::kFail,
                     "the registration socket does not answer GetInfo (a socket left by a dead agent?)",
                     {{source, cluster::RpcError(rpc)}},
                     "restart the agent's pod: it replaces a stale socket at start");
  }
  const std::string seen = absl::StrCat("type ", info.type(), ", name ", info.name(), ", endpoint ", info.endpoint(),
                                        ", versions ", absl::StrJoin(info.supported_versions(), ","));
  std::vector<std::string> wrong;
  if (info.type() != dra::kPluginType) wrong.push_back(absl::StrCat("type is not ", std::string(dra::kPluginType)));
  if (info.name() != options.driver_name) wrong.push_back(absl::StrCat("name is not ", options.driver_name));
  if (info.endpoint() != dra::DraSocket(options).string()) {
    wrong.push_back(absl::StrCat("endpoint is not ", dra::DraSocket(options).string()));
  }
  if (info.supported_versions().empty() || info.supported_versions(0) != dra::kServiceV1) {
    wrong.push_back(absl::StrCat("the first version offered is not ", std::string(dra::kServiceV1)));
  }
  if (!wrong.empty()) {
    return MakeCheck("dra.registration", Layer::kPlugin, subject, Result::kFail,
                     absl::StrCat("another driver answers on our registration socket: ", absl::StrJoin(wrong, "; ")),
                     {{source, seen}},
                     "give validate the agent's --dra-driver-name and --kubelet-plugins-dir; stop the other driver");
  }
  return MakeCheck("dra.registration", Layer::kPlugin, subject, Result::kPass,
                   absl::StrCat("GetInfo names this driver, endpoint ", info.endpoint()), {{source, seen}});
}

Check AcceptedCheck(const dra::DriverOptions& options) {
  const std::filesystem::path record = dra::RegistrationRecordPath(options);
  absl::StatusOr<dra::RegistrationStatus> status = dra::ReadRegistrationRecord(record);
  if (absl::IsNotFound(status.status())) {
    return MakeCheck("dra.kubelet_accepted", Layer::kPlugin, options.driver_name, Result::kWarn,
                     "the kubelet has not answered the registration yet", {{record.string(), "(absent)"}},
                     "the kubelet's log says why (grep 'plugin' in journalctl -u kubelet): DynamicResourceAllocation "
                     "needs Kubernetes >= 1.34, and the kubelet watches <root-dir>/plugins_registry");
  }
  if (!status.ok()) {
    return MakeCheck("dra.kubelet_accepted", Layer::kPlugin, options.driver_name, Result::kWarn,
                     "the registration record cannot be read", {{record.string(), std::string(status.status().message())}},
                     "restart the agent's pod: the next registration rewrites it");
  }
  const std::string seen = absl::StrCat("registered ", status->registered ? "true" : "false", ", error \"",
                                        status->error, "\", notifications ", status->notifications);
  if (!status->registered) {
    return MakeCheck("dra.kubelet_accepted", Layer::kPlugin, options.driver_name, Result::kFail,
                     absl::StrCat("the kubelet refused the registration: ", status->error), {{record.string(), seen}},
                     "an 'already registered' error means another process serves this driver name: stop it, then "
                     "restart the agent's pod");
  }
  return MakeCheck("dra.kubelet_accepted", Layer::kPlugin, options.driver_name, Result::kPass,
                   "the kubelet accepted the registration", {{record.string(), seen}});
}

Check CdiCheck(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return MakeCheck("dra.cdi_dir", Layer::kPlugin, dir.string(), Result::kFail,
                     "no CDI spec directory: no claim's /dev/vfio nodes or device metadata reach a container",
                     {{dir.string(), "(absent or not a directory)"}},
                     absl::StrCat("mount the host's CDI directory at the same path (", kOverlayFix,
                                  " does) and enable CDI in the runtime (containerd >= 1.7: enable_cdi = true)"));
  }
  if (::access(dir.c_str(), W_OK) != 0) {
    return MakeCheck("dra.cdi_dir", Layer::kPlugin, dir.string(), Result::kFail,
                     "the CDI spec directory is not writable: Prepare cannot write a claim's spec",
                     {{dir.string(), "read-only"}}, "mount it read-write (the agent's DaemonSet must not set readOnly)");
  }
  return MakeCheck("dra.cdi_dir", Layer::kPlugin, dir.string(), Result::kPass, "the CDI spec directory is writable");
}

// An API read that did not answer: a failed check naming the request, or nothing when it answered.
std::optional<Check> UnreadCheck(const char* id, const std::string& subject, const std::optional<ApiListRead>& read,
                                 const char* what) {
  if (!read) {
    return MakeCheck(id, Layer::kKubelet, subject, Result::kSkip, absl::StrCat("no cluster to read ", what, " from"));
  }
  if (!read->body.ok()) {
    return MakeCheck(id, Layer::kKubelet, subject, Result::kFail, absl::StrCat(what, " cannot be read"),
                     {{read->request, std::string(read->body.status().message())}},
                     "a 403 needs the DRA overlay's ClusterRole (resource.k8s.io resourceslices list, deviceclasses "
                     "list); a 404 means resource.k8s.io/v1 is not served (Kubernetes >= 1.34)");
  }
  return std::nullopt;
}

Json Items(const std::string& body) {
  Json list = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  return list.is_object() && list.contains("items") && list["items"].is_array() ? list["items"] : Json::array();
}

std::string JsonString(const Json& object, const Json::json_pointer& pointer) {
  return object.contains(pointer) && object[pointer].is_string() ? object[pointer].get<std::string>() : "";
}

Check SlicesCheck(const DraExpectedDevices& expected_devices, const DraValidation& dra) {
  const std::string& driver = dra.driver.driver_name;
  if (auto unread = UnreadCheck("dra.slices", "node", dra.slices, "the node's ResourceSlices")) return *unread;
  const std::set<std::string> expected(expected_devices.names.begin(), expected_devices.names.end());
  // The driver's failure taints (one key per kind, taints.h): what blocks scheduling, the None warnings aside.
  const std::vector<std::string> failure_keys = dra::FailureTaintKeys(driver);
  std::set<std::string> published;
  std::map<std::string, std::set<std::string>> tainted;  // device -> failure keys published on it
  int slices = 0;
  for (const Json& slice : Items(*dra.slices->body)) {
    if (JsonString(slice, "/spec/driver"_json_pointer) != driver) continue;
    ++slices;
    if (!slice.contains("/spec/devices"_json_pointer) || !slice["spec"]["devices"].is_array()) continue;
    for (const Json& device : slice["spec"]["devices"]) {
      const std::string name = JsonString(device, "/name"_json_pointer);
      published.insert(name);
      if (!device.contains("taints") || !device["taints"].is_array()) continue;
      for (const Json& taint : device["taints"]) {
        const std::string key = JsonString(taint, "/key"_json_pointer);
        if (JsonString(taint, "/effect"_json_pointer) != "None" &&
            std::find(failure_keys.begin(), failure_keys.end(), key) != failure_keys.end()) {
          tainted[name].insert(key);
        }
      }
    }
  }
  std::vector<std::string> missing, extra;
  std::set_difference(expected.begin(), expected.end(), published.begin(), published.end(), std::back_inserter(missing));
  std::set_difference(published.begin(), published.end(), expected.begin(), expected.end(), std::back_inserter(extra));
  const bool vgpus = expected_devices.vgpus;
  std::vector<Evidence> evidence = {
      {dra.slices->request, absl::StrCat(slices, " slice(s) of ", driver, ": ", cluster::DeviceList(published))},
      {vgpus ? "vGPUs the driver serves here" : "selected GPUs", cluster::DeviceList(expected)}};
  if (!expected_devices.problems.empty()) {
    evidence.push_back({"vGPUs not served", absl::StrJoin(expected_devices.problems, "; ")});
  }
  // A whole GPU's name on a vGPU node, or the reverse: the agent serves the other workload.
  const bool other_model = std::any_of(extra.begin(), extra.end(),
                                       [&](const std::string& name) { return dra::VgpuOfDevice(name).ok() != vgpus; });
  if (other_model && !missing.empty()) {
    return MakeCheck("dra.slices", Layer::kKubelet, "node", Result::kFail,
                     absl::StrCat("published ", vgpus ? "whole GPUs" : "vGPUs", " (", absl::StrJoin(extra, ","),
                                  ") instead of ", vgpus ? "this vm-vgpu node's vGPUs" : "the selected GPUs", " (",
                                  absl::StrJoin(missing, ","), ")"),
                     std::move(evidence),
                     absl::StrCat("run the agent with the node's workload (", vgpus ? "--workload vm-vgpu" : "without "
                                  "--workload vm-vgpu", ", as the nvidia.com/gpu.workload.config label says), or "
                                  "validate with the agent's --workload"));
  }
  if (!missing.empty()) {
    return MakeCheck("dra.slices", Layer::kKubelet, "node", Result::kFail,
                     absl::StrCat("not published: ", absl::StrJoin(missing, ",")), std::move(evidence),
                     "the agent republishes within seconds of a change: if it stays, read the agent's log for "
                     "'ResourceSlice' (a 403 is the admission policy or RBAC)");
  }
  if (!extra.empty()) {
    return MakeCheck("dra.slices", Layer::kKubelet, "node", Result::kFail,
                     absl::StrCat("published but not a ", vgpus ? "vGPU the driver serves" : "selected GPU", " here: ",
                                  absl::StrJoin(extra, ",")),
                     std::move(evidence),
                     vgpus ? "a vGPU removed or retyped stays published, tainted, until its resource has new vGPUs or "
                             "the agent restarts: restart the agent's pod; otherwise another agent with this driver "
                             "name writes this node's slices: stop it"
                           : "another agent with this driver name writes this node's slices: stop it");
  }
  // Same devices; their health as the driver judges it here. A GPU on its host driver is healthy only under
  // --bind-on-prepare, so a flag that differs from the agent's shows as a taint on every such GPU.
  std::vector<std::string> health;
  for (const std::string& name : expected) {
    auto reason = expected_devices.unhealthy.find(name);
    const bool unhealthy = reason != expected_devices.unhealthy.end();
    const std::set<std::string>& keys = tainted[name];
    if (!unhealthy) {
      if (!keys.empty()) health.push_back(absl::StrCat(name, " tainted ", absl::StrJoin(keys, ","), ", healthy here"));
      continue;
    }
    const std::string kind = dra::FailureTaint(driver, reason->second).key;
    if (keys.contains(kind)) continue;
    health.push_back(keys.empty() ? absl::StrCat(name, " untainted, unhealthy here (", reason->second, ")")
                                  : absl::StrCat(name, " tainted ", absl::StrJoin(keys, ","), ", unhealthy here as ",
                                                 kind, " (", reason->second, ")"));
  }
  if (!health.empty()) {
    evidence.push_back({"the driver's health rule here", absl::StrJoin(health, "; ")});
    return MakeCheck("dra.slices", Layer::kKubelet, "node", Result::kWarn,
                     absl::StrCat("published with other health than the driver gives them here: ",
                                  absl::StrJoin(health, "; ")),
                     std::move(evidence),
                     vgpus ? std::string("the agent republishes within seconds of a change: if it stays, its log "
                                         "says why ('DRA device')")
                           : absl::StrCat("validate with the agent's --bind-on-prepare (validate had it ",
                                          dra.driver.bind_on_prepare ? "on" : "off",
                                          "): only with it is a GPU on its host driver healthy; otherwise the agent "
                                          "republishes within seconds of a change"));
  }
  return MakeCheck("dra.slices", Layer::kKubelet, "node", Result::kPass,
                   absl::StrCat(expected.size(), vgpus ? " vGPU(s)" : " GPU(s)", " published in ", slices, " slice(s)"),
                   std::move(evidence));
}

Check ClassCheck(const DraValidation& dra) {
  const std::string& driver = dra.driver.driver_name;
  if (auto unread = UnreadCheck("dra.device_class", driver, dra.classes, "the DeviceClasses")) return *unread;
  const std::string double_quoted = absl::StrCat("device.driver == \"", driver, "\"");
  const std::string single_quoted = absl::StrCat("device.driver == '", driver, "'");
  std::vector<std::string> selecting;
  for (const Json& klass : Items(*dra.classes->body)) {
    if (!klass.contains("/spec/selectors"_json_pointer) || !klass["spec"]["selectors"].is_array()) continue;
    for (const Json& selector : klass["spec"]["selectors"]) {
      const std::string cel = JsonString(selector, "/cel/expression"_json_pointer);
      if (cel.find(double_quoted) != std::string::npos || cel.find(single_quoted) != std::string::npos) {
        selecting.push_back(JsonString(klass, "/metadata/name"_json_pointer));
        break;
      }
    }
  }
  if (selecting.empty()) {
    return MakeCheck("dra.device_class", Layer::kKubelet, driver, Result::kFail,
                     "no DeviceClass selects the driver's devices: no claim can be allocated one",
                     {{dra.classes->request, "(none selecting device.driver == \"" + driver + "\")"}},
                     absl::StrCat(kOverlayFix, ", or: vfio-gpu-agent kubevirt-config --format dra | kubectl apply -f -"));
  }
  return MakeCheck("dra.device_class", Layer::kKubelet, driver, Result::kPass,
                   absl::StrCat(selecting.size(), " DeviceClass(es) select the driver"),
                   {{dra.classes->request, absl::StrJoin(selecting, ",")}});
}

}  // namespace

std::vector<Check> DraDriverChecks(const DraValidation& dra, std::chrono::milliseconds rpc_wait) {
  return {RegistrationCheck(dra.driver, rpc_wait), AcceptedCheck(dra.driver), CdiCheck(dra.driver.cdi_dir)};
}

DraExpectedDevices ExpectedDraDevices(const NodeView& node, const DraValidation& dra, const names::NameResolver& names,
                                      const names::PciIdsDatabase* pci_ids) {
  DraExpectedDevices expected{.vgpus = node.workload == Workload::kVmVgpu};
  std::vector<dra::GpuDevice> devices;
  if (expected.vgpus) {
    const vgpu::GoneReasons gone(node.paths.sysfs_root, *node.inventory, *node.vgpu->discovery);
    dra::VgpuDevices vgpus = node.model != nullptr
                                 ? dra::VgpusOf(*node.model, gone, pci_ids, node.vgpu->domain, dra.driver.driver_name, {})
                                 : dra::BuildVgpuDevices(node.paths, *node.inventory, *node.vgpu->discovery, pci_ids,
                                                         node.vgpu->domain, dra.driver.driver_name, {});
    for (dra::VgpuDevice& vgpu : vgpus.vgpus) devices.push_back(std::move(vgpu.device));
    expected.problems = std::move(vgpus.problems);
  } else if (node.model != nullptr && !dra.driver.bind_on_prepare) {
    devices = dra::GpusOf(*node.model, *node.inventory, pci_ids, dra.driver.driver_name, {});
  } else {
    devices = dra::BuildDevices(node.paths, *node.inventory, *node.selection, names, pci_ids, dra.driver.driver_name, {},
                                dra.driver.bind_on_prepare);
  }
  for (const dra::GpuDevice& device : devices) {
    expected.names.push_back(device.slice.name);
    if (!device.healthy()) expected.unhealthy[device.slice.name] = device.unhealthy_reason;
  }
  return expected;
}

std::vector<Check> DraSliceChecks(const DraExpectedDevices& expected, const DraValidation& dra) {
  return {SlicesCheck(expected, dra), ClassCheck(dra)};
}

std::vector<Check> DraKubevirtChecks(const std::optional<std::string>& kubevirt_cr) {
  std::vector<Check> checks;
  std::optional<KubevirtCr> cr;
  if (kubevirt_cr) {
    if (auto parsed = ParseKubevirtCr(*kubevirt_cr); parsed.ok()) cr = *std::move(parsed);
  }
  for (const char* gate : {"GPUsWithDRA", "HostDevicesWithDRA"}) {
    if (!cr) {
      checks.push_back(MakeCheck("dra.kubevirt_gate", Layer::kKubevirt, gate, Result::kSkip, "no KubeVirt CR read"));
      continue;
    }
    const std::string source = absl::StrCat("kubevirt ", cr->namespace_, "/", cr->name,
                                            " spec.configuration.developerConfiguration");
    const auto has = [&](const std::vector<std::string>& gates) {
      return std::find(gates.begin(), gates.end(), gate) != gates.end();
    };
    if (has(cr->disabled_feature_gates)) {
      checks.push_back(MakeCheck("dra.kubevirt_gate", Layer::kKubevirt, gate, Result::kFail,
                                 "disabled: KubeVirt ignores the claims of a VM's gpus/hostDevices",
                                 {{source + ".disabledFeatureGates", absl::StrJoin(cr->disabled_feature_gates, ",")}},
                                 absl::StrCat("remove ", gate, " from disabledFeatureGates")));
      continue;
    }
    checks.push_back(MakeCheck(
        "dra.kubevirt_gate", Layer::kKubevirt, gate, Result::kPass,
        has(cr->feature_gates) ? "enabled" : "not disabled (Beta, on by default since KubeVirt v1.9; before: add it to "
                                             "featureGates)",
        {{source + ".featureGates", cr->feature_gates.empty() ? "(none)" : absl::StrJoin(cr->feature_gates, ",")}}));
  }
  return checks;
}

}  // namespace vfio_agent::validation
