// Layer 3: the device plugin, seen as the kubelet sees it (GetDevicePluginOptions, then ListAndWatch).
#include <algorithm>
#include <map>

#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "cluster_check_util.h"
#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "vfio_gpu_agent/common/fs.h"
#include "vfio_gpu_agent/plugin/agent.h"

namespace vfio_agent::validation {
namespace {

namespace fs = std::filesystem;
using cluster::DeviceList;
using cluster::MakeCheck;

constexpr char kServeFix[] =
    "Run the agent on this node (`vfio-gpu-agent run`, the DaemonSet's command; `serve` if the GPUs are bound "
    "already); its log says why it does not serve %s.";

struct Listing {
  std::set<std::string> healthy, unhealthy;
};

struct PluginAnswer {
  grpc::Status options_status;
  ::v1beta1::DevicePluginOptions options;
  grpc::Status list_status;  // OK once a ListAndWatch message arrived
  Listing listing;           // the last message read
  int messages = 0;
};

Listing ToListing(const ::v1beta1::ListAndWatchResponse& message) {
  Listing out;
  for (const auto& device : message.devices()) {
    // The kubelet's exact match: any other spelling is unhealthy to it.
    (device.health() == plugin::kHealthy ? out.healthy : out.unhealthy).insert(device.id());
  }
  return out;
}

// GetDevicePluginOptions, then ListAndWatch messages until `done` accepts one or `wait` has passed; the stream is
// then cancelled, as a kubelet whose plugin went away would.
PluginAnswer AskPlugin(const fs::path& socket, std::chrono::milliseconds wait,
                       const std::function<bool(const Listing&)>& done) {
  PluginAnswer answer;
  auto stub = ::v1beta1::DevicePlugin::NewStub(cluster::DialUnix(socket));
  const auto deadline = cluster::DeadlineAfter(wait);
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline);
    answer.options_status = stub->GetDevicePluginOptions(&ctx, ::v1beta1::Empty(), &answer.options);
  }
  if (!answer.options_status.ok()) return answer;
  grpc::ClientContext ctx;
  ctx.set_deadline(deadline);
  // Not the kubelet's stream: the agent must not take it for the one that follows a Register, nor wait for its end.
  ctx.AddMetadata(plugin::kProbeMetadata, "validate");
  auto reader = stub->ListAndWatch(&ctx, ::v1beta1::Empty());
  ::v1beta1::ListAndWatchResponse message;
  while (reader->Read(&message)) {
    answer.listing = ToListing(message);
    ++answer.messages;
    if (done(answer.listing)) break;
  }
  ctx.TryCancel();
  const grpc::Status finish = reader->Finish();
  answer.list_status = answer.messages > 0 ? grpc::Status::OK : finish;
  return answer;
}

std::set<std::string> HealthyIds(const node::ServedDevices& devices) {
  std::set<std::string> out;
  for (const node::ServedDevice& device : devices) {
    if (device.healthy) out.insert(device.id);
  }
  return out;
}

std::set<std::string> Minus(const std::set<std::string>& a, const std::set<std::string>& b) {
  std::set<std::string> out;
  std::set_difference(a.begin(), a.end(), b.begin(), b.end(), std::inserter(out, out.end()));
  return out;
}

std::string ExpectedText(const node::ServedDevices& devices) {
  std::set<std::string> unhealthy;
  for (const node::ServedDevice& device : devices) {
    if (!device.healthy) unhealthy.insert(absl::StrCat(device.id, " (", device.unhealthy_reason, ")"));
  }
  std::string text = absl::StrCat("healthy ", DeviceList(HealthyIds(devices)));
  if (!unhealthy.empty()) absl::StrAppend(&text, "; unhealthy ", absl::StrJoin(unhealthy, ","));
  return text;
}

std::string ListingText(const PluginAnswer& answer) {
  std::string text = absl::StrCat("healthy ", DeviceList(answer.listing.healthy));
  if (!answer.listing.unhealthy.empty()) absl::StrAppend(&text, "; unhealthy ", DeviceList(answer.listing.unhealthy));
  absl::StrAppend(&text, " (", answer.messages, answer.messages == 1 ? " message)" : " messages)");
  return text;
}

// `devices`: what the node serves under `name` (node.served), which ListAndWatch must list with the same health.
void CheckResource(const NodeView& node, const std::string& name, const node::ServedDevices& devices,
                   std::chrono::milliseconds wait, std::vector<Check>* out) {
  const fs::path socket = node.paths.kubelet_dir / plugin::SocketName(name);
  const std::string expected_source = absl::StrCat("sysfs under ", node.paths.sysfs_root.string(), " (expected)");
  std::error_code ec;
  if (!fs::is_socket(fs::symlink_status(socket, ec))) {
    out->push_back(MakeCheck("plugin.socket", Layer::kPlugin, name, Result::kFail,
                             absl::StrCat("no device-plugin socket for ", name),
                             {{socket.string(), fs::exists(fs::symlink_status(socket, ec)) ? "not a socket" : "absent"}},
                             absl::StrFormat(kServeFix, name)));
    out->push_back(MakeCheck("plugin.devices", Layer::kPlugin, name, Result::kSkip,
                             "not checked: no socket (see plugin.socket)"));
    return;
  }
  const std::set<std::string> expected = HealthyIds(devices);
  PluginAnswer answer = AskPlugin(socket, wait, [&](const Listing& listing) { return listing.healthy == expected; });
  const std::string options_source = absl::StrCat("GetDevicePluginOptions ", socket.filename().string());
  if (!answer.options_status.ok()) {
    out->push_back(MakeCheck(
        "plugin.socket", Layer::kPlugin, name, Result::kFail,
        absl::StrCat(socket.filename().string(), " does not answer: no plugin listens there (left by one that died)"),
        {{options_source, cluster::RpcError(answer.options_status)}}, absl::StrFormat(kServeFix, name)));
    out->push_back(MakeCheck("plugin.devices", Layer::kPlugin, name, Result::kSkip,
                             "not checked: the socket does not answer (see plugin.socket)"));
    return;
  }
  out->push_back(MakeCheck(
      "plugin.socket", Layer::kPlugin, name, Result::kPass,
      absl::StrCat(socket.filename().string(), " answers GetDevicePluginOptions"),
      {{options_source, absl::StrFormat("pre_start_required=%s get_preferred_allocation_available=%s",
                                        answer.options.pre_start_required() ? "true" : "false",
                                        answer.options.get_preferred_allocation_available() ? "true" : "false")}}));

  const std::string list_source = absl::StrCat("ListAndWatch ", socket.filename().string());
  if (!answer.list_status.ok()) {
    out->push_back(MakeCheck("plugin.devices", Layer::kPlugin, name, Result::kFail,
                             absl::StrFormat("no ListAndWatch message within %d ms", wait.count()),
                             {{list_source, cluster::RpcError(answer.list_status)}},
                             absl::StrCat("Restart the plugin serving ", name,
                                          " (delete the agent's pod on this node); a plugin that never sends its "
                                          "list leaves the kubelet with no devices.")));
    return;
  }
  std::vector<Evidence> evidence = {{list_source, ListingText(answer)}, {expected_source, ExpectedText(devices)}};
  if (answer.listing.healthy == expected) {
    out->push_back(MakeCheck("plugin.devices", Layer::kPlugin, name, Result::kPass,
                             absl::StrCat("lists exactly the ", expected.size(), " healthy ",
                                          node.workload == Workload::kVmVgpu ? "vGPUs" : "vfio-bound GPUs"),
                             std::move(evidence)));
    return;
  }
  std::vector<std::string> wrong;
  if (auto missing = Minus(expected, answer.listing.healthy); !missing.empty()) {
    wrong.push_back(absl::StrCat("not listed healthy: ", absl::StrJoin(missing, ",")));
  }
  if (auto extra = Minus(answer.listing.healthy, expected); !extra.empty()) {
    wrong.push_back(absl::StrCat("listed healthy but not a healthy vfio-bound GPU here: ", absl::StrJoin(extra, ",")));
  }
  out->push_back(MakeCheck(
      "plugin.devices", Layer::kPlugin, name, Result::kFail,
      absl::StrCat("the plugin's list disagrees with sysfs: ", absl::StrJoin(wrong, "; ")), std::move(evidence),
      absl::StrCat("Restart the plugin serving ", name,
                   " (delete the agent's pod on this node) so it rescans; if the list stays wrong, another plugin "
                   "owns the socket (see plugin.duplicate_provider).")));
}

// Sockets of other plugins that serve one of our names or our devices: KubeVirt's own PCI plugin for a name
// permitted without externalResourceProvider (kubevirt-<domain>-<name>.sock, its device ids are IOMMU groups),
// or any plugin whose list holds our GPUs or their companions (the GPU Operator's sandbox plugin under an older
// pci.ids name, or v1.5 advertising the audio function).
void CheckOtherProviders(const NodeView& node, std::chrono::milliseconds wait, std::vector<Check>* out) {
  std::set<std::string> own_sockets = {"kubelet.sock"};
  std::map<std::string, std::string> kubevirt_sockets;  // KubeVirt's socket name -> our resource name
  std::set<std::string> our_ids;
  for (const node::ServedDevice& device : *node.served) {
    const std::string& name = device.resource_name;
    own_sockets.insert(plugin::SocketName(name));
    kubevirt_sockets[absl::StrCat("kubevirt-", absl::StrReplaceAll(name, {{"/", "-"}}), ".sock")] = name;
    our_ids.insert(device.id);
    // The functions of its IOMMU group: a plugin advertising a GPU's audio function hands out the same group.
    if (const node::Device* modelled = node.model != nullptr ? node.model->Find(device.id) : nullptr) {
      our_ids.insert(modelled->group_functions.begin(), modelled->group_functions.end());
    }
  }
  if (node.selection != nullptr) {
    our_ids.insert(node.selection->gpus.begin(), node.selection->gpus.end());
    our_ids.insert(node.selection->companions.begin(), node.selection->companions.end());
  }

  std::vector<fs::path> others;
  // The kubelet deletes and recreates sockets while we list: an entry that vanished is simply not examined.
  for (const std::string& name : vfio_agent::fs::ListDir(node.paths.kubelet_dir).value_or(std::vector<std::string>{})) {
    std::error_code stat_ec;
    const fs::path path = node.paths.kubelet_dir / name;
    if (!fs::is_socket(fs::symlink_status(path, stat_ec))) continue;
    if (own_sockets.count(name) == 0) others.push_back(path);
  }

  const size_t before = out->size();
  std::vector<std::string> examined;
  for (const fs::path& socket : others) {
    const std::string file = socket.filename().string();
    PluginAnswer answer = AskPlugin(socket, wait, [](const Listing&) { return true; });
    if (!answer.options_status.ok()) {
      examined.push_back(absl::StrCat(file, " (does not answer)"));
      continue;
    }
    std::set<std::string> listed = answer.listing.healthy;
    listed.insert(answer.listing.unhealthy.begin(), answer.listing.unhealthy.end());
    std::set<std::string> shared;
    std::set_intersection(listed.begin(), listed.end(), our_ids.begin(), our_ids.end(),
                          std::inserter(shared, shared.end()));
    examined.push_back(absl::StrCat(file, " (", DeviceList(listed), ")"));
    const std::vector<Evidence> evidence = {{absl::StrCat("ListAndWatch ", file), ListingText(answer)}};
    if (auto it = kubevirt_sockets.find(file); it != kubevirt_sockets.end()) {
      out->push_back(MakeCheck(
          "plugin.duplicate_provider", Layer::kPlugin, it->second, Result::kFail,
          absl::StrCat("KubeVirt's own device plugin (virt-handler) also serves ", it->second, " on ", file,
                       ": the kubelet keeps one of the two, and VMs may get no PCI_RESOURCE_* address"),
          evidence,
          absl::StrCat("Set externalResourceProvider: true on the permittedHostDevices entry for ", it->second,
                       " in the KubeVirt CR (`vfio-gpu-agent kubevirt-config` prints it).")));
    } else if (!shared.empty()) {
      out->push_back(MakeCheck(
          "plugin.duplicate_provider", Layer::kPlugin, file, Result::kFail,
          absl::StrCat("another device plugin on ", file, " advertises this node's GPUs: ", absl::StrJoin(shared, ",")),
          evidence,
          "Remove the other plugin from this node, e.g. for the GPU Operator's sandbox device plugin: "
          "`kubectl label node <node> nvidia.com/gpu.deploy.sandbox-device-plugin=false`."));
    }
  }
  if (out->size() == before) {
    out->push_back(MakeCheck(
        "plugin.duplicate_provider", Layer::kPlugin, "node", Result::kPass,
        "no other device plugin serves these resources or GPUs",
        {{node.paths.kubelet_dir.string(),
          others.empty() ? "no other plugin socket" : absl::StrJoin(examined, "; ")}}));
  }
}

}  // namespace

std::vector<Check> PluginChecks(const NodeView& node, std::chrono::milliseconds wait) {
  std::vector<Check> out;
  if (node.served == nullptr || node.served->empty()) {
    out.push_back(MakeCheck("plugin.socket", Layer::kPlugin, "node", Result::kSkip,
                            "not checked: no GPU on a vfio driver, so there is nothing to advertise (see layer 2)"));
    return out;
  }
  for (const auto& [name, devices] : node::ByResource(*node.served)) CheckResource(node, name, devices, wait, &out);
  CheckOtherProviders(node, wait, &out);
  return out;
}

}  // namespace vfio_agent::validation
