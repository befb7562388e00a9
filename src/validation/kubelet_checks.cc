// Layer 4: what the kubelet's device manager holds, through the pod-resources API (GetAllocatableResources, List).
#include <algorithm>
#include <map>

#include "absl/strings/str_format.h"
#include "cluster_check_util.h"
#include "podresources/v1/api.grpc.pb.h"

namespace vfio_agent::validation {
namespace {

namespace fs = std::filesystem;
using cluster::DeviceList;
using cluster::MakeCheck;

// resource -> device ids. The kubelet sends one ContainerDevices per (device, NUMA node), so ids repeat.
using DevicesByResource = std::map<std::string, std::set<std::string>>;

void AddDevices(const google::protobuf::RepeatedPtrField<::v1::ContainerDevices>& devices, DevicesByResource* out) {
  for (const auto& entry : devices) {
    for (const auto& id : entry.device_ids()) (*out)[entry.resource_name()].insert(id);
  }
}

struct PodUse {
  std::string pod;  // "namespace/name container"
  std::set<std::string> ids;
};

std::string UseText(const std::vector<PodUse>& uses) {
  std::vector<std::string> parts;
  for (const auto& use : uses) parts.push_back(absl::StrCat(use.pod, ": ", absl::StrJoin(use.ids, ",")));
  return parts.empty() ? "(none)" : absl::StrJoin(parts, "; ");
}

std::vector<Check> SkipAll(const std::string& why, std::vector<Evidence> evidence) {
  return {MakeCheck("kubelet.allocatable", Layer::kKubelet, "node", Result::kSkip, why, evidence),
          MakeCheck("kubelet.in_use", Layer::kKubelet, "node", Result::kSkip, why, evidence)};
}

}  // namespace

std::vector<Check> KubeletChecks(const NodeView& node, const fs::path& socket, std::chrono::milliseconds wait) {
  const std::string source = absl::StrCat("pod-resources ", socket.string());
  std::error_code ec;
  if (!fs::is_socket(fs::status(socket, ec))) {
    return SkipAll(absl::StrCat("no kubelet pod-resources socket at ", socket.string(),
                                " (not a kubelet node, or the kubelet's --root-dir is elsewhere: pass "
                                "--pod-resources-socket)"),
                   {{socket.string(), ec ? ec.message() : "not a socket"}});
  }
  if (node.served == nullptr || node.served->empty()) {
    return SkipAll("not checked: no GPU on a vfio driver, so there is nothing the kubelet should hold (see layer 2)",
                   {});
  }

  auto stub = ::v1::PodResourcesLister::NewStub(cluster::DialUnix(socket));
  const auto deadline = cluster::DeadlineAfter(wait);
  ::v1::AllocatableResourcesResponse allocatable;
  grpc::Status allocatable_status;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline);
    allocatable_status = stub->GetAllocatableResources(&ctx, ::v1::AllocatableResourcesRequest(), &allocatable);
  }
  ::v1::ListPodResourcesResponse pods;
  grpc::Status list_status;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline);
    list_status = stub->List(&ctx, ::v1::ListPodResourcesRequest(), &pods);
  }

  std::vector<Check> out;
  const std::string allocatable_source = absl::StrCat("GetAllocatableResources ", socket.string());
  const std::string list_source = absl::StrCat("List ", socket.string());
  constexpr char kKubeletFix[] =
      "Check the kubelet on this node (`systemctl status kubelet`); GetAllocatableResources needs Kubernetes "
      ">= 1.23 (GA in 1.28).";

  const std::map<std::string, node::ServedDevices> served = node::ByResource(*node.served);
  // Which resource each of our devices belongs to, to find our GPUs under another name.
  std::map<std::string, std::string> resource_of;
  for (const node::ServedDevice& device : *node.served) resource_of[device.id] = device.resource_name;

  if (!allocatable_status.ok()) {
    out.push_back(MakeCheck("kubelet.allocatable", Layer::kKubelet, "node", Result::kFail,
                            "the kubelet's pod-resources API does not answer GetAllocatableResources",
                            {{allocatable_source, cluster::RpcError(allocatable_status)}}, kKubeletFix));
  } else {
    DevicesByResource held;
    AddDevices(allocatable.devices(), &held);
    for (const auto& [name, devices] : served) {
      std::set<std::string> healthy;
      for (const node::ServedDevice& device : devices) {
        if (device.healthy) healthy.insert(device.id);
      }
      const std::set<std::string>& kubelet = held[name];
      std::vector<Evidence> evidence = {{allocatable_source, absl::StrCat(name, ": ", DeviceList(kubelet))},
                                        {"plugin's healthy set (sysfs)", DeviceList(healthy)}};
      if (kubelet == healthy) {
        out.push_back(MakeCheck("kubelet.allocatable", Layer::kKubelet, name, Result::kPass,
                                absl::StrCat("the kubelet can allocate exactly the ", healthy.size(), " healthy ",
                                             node.workload == Workload::kVmVgpu ? "vGPUs" : "GPUs"),
                                std::move(evidence)));
        continue;
      }
      std::string message;
      std::string fix;
      if (kubelet.empty()) {
        message = absl::StrCat("the kubelet holds no allocatable ", name,
                               " (the plugin is not registered, or the kubelet restarted and it did not register "
                               "again)");
        fix = absl::StrCat("Restart the agent on this node (delete its pod) so it registers ", name,
                           " again; if that does not help, its log shows the Register error.");
      } else {
        std::vector<std::string> wrong;
        std::set<std::string> missing, extra;
        std::set_difference(healthy.begin(), healthy.end(), kubelet.begin(), kubelet.end(),
                            std::inserter(missing, missing.end()));
        std::set_difference(kubelet.begin(), kubelet.end(), healthy.begin(), healthy.end(),
                            std::inserter(extra, extra.end()));
        if (!missing.empty()) wrong.push_back(absl::StrCat("not allocatable: ", absl::StrJoin(missing, ",")));
        if (!extra.empty()) wrong.push_back(absl::StrCat("allocatable but not healthy here: ", absl::StrJoin(extra, ",")));
        message = absl::StrCat("the kubelet's view of ", name, " is stale: ", absl::StrJoin(wrong, "; "));
        fix = absl::StrCat("Restart the agent on this node (delete its pod): its new ListAndWatch stream gives the "
                           "kubelet the current list of ", name, ".");
      }
      out.push_back(MakeCheck("kubelet.allocatable", Layer::kKubelet, name, Result::kFail, std::move(message),
                              std::move(evidence), std::move(fix)));
    }
    // Our GPUs allocatable under a name we do not advertise: a second plugin, or an old registration.
    for (const auto& [name, ids] : held) {
      if (served.contains(name)) continue;
      std::set<std::string> ours;
      for (const auto& id : ids) {
        if (resource_of.count(id) != 0) ours.insert(id);
      }
      if (ours.empty()) continue;
      out.push_back(MakeCheck(
          "kubelet.allocatable", Layer::kKubelet, name, Result::kFail,
          absl::StrCat("the kubelet also offers this node's GPUs as ", name, ": ", absl::StrJoin(ours, ","),
                       " (two VMs can be given one GPU)"),
          {{allocatable_source, absl::StrCat(name, ": ", DeviceList(ids))}},
          absl::StrCat("Stop the other device plugin serving ", name,
                       " on this node (see plugin.duplicate_provider), e.g. `kubectl label node <node> "
                       "nvidia.com/gpu.deploy.sandbox-device-plugin=false`.")));
    }
  }

  if (!list_status.ok()) {
    out.push_back(MakeCheck("kubelet.in_use", Layer::kKubelet, "node", Result::kFail,
                            "the kubelet's pod-resources API does not answer List",
                            {{list_source, cluster::RpcError(list_status)}}, kKubeletFix));
    return out;
  }
  std::map<std::string, std::vector<PodUse>> uses;  // resource -> pods
  for (const auto& pod : pods.pod_resources()) {
    for (const auto& container : pod.containers()) {
      DevicesByResource held;
      AddDevices(container.devices(), &held);
      for (auto& [name, ids] : held) {
        if (!served.contains(name)) continue;
        uses[name].push_back({absl::StrCat(pod.namespace_(), "/", pod.name(), " ", container.name()), ids});
      }
    }
  }
  for (const auto& [name, devices] : served) {
    const std::vector<PodUse>& used = uses[name];
    std::set<std::string> in_use;
    for (const auto& use : used) in_use.insert(use.ids.begin(), use.ids.end());
    std::vector<std::string> lost;  // held by a pod, but no longer healthy here
    for (const auto& id : in_use) {
      auto device = std::find_if(devices.begin(), devices.end(),
                                 [&](const node::ServedDevice& d) { return d.id == id; });
      if (device == devices.end()) {
        lost.push_back(absl::StrCat(id, " (gone)"));
      } else if (!device->healthy) {
        lost.push_back(absl::StrCat(id, " (", device->unhealthy_reason, ")"));
      }
    }
    std::vector<Evidence> evidence = {{list_source, absl::StrCat(name, ": ", UseText(used))}};
    if (!lost.empty()) {
      out.push_back(MakeCheck(
          "kubelet.in_use", Layer::kKubelet, name, Result::kWarn,
          absl::StrCat("pods hold GPUs that are not healthy here now: ", absl::StrJoin(lost, ",")),
          std::move(evidence),
          "Check the VMs of those pods: their GPU lost its vfio binding or went away; restart the VM once the "
          "device is back on vfio-pci."));
      continue;
    }
    out.push_back(MakeCheck("kubelet.in_use", Layer::kKubelet, name, Result::kPass,
                            absl::StrFormat("%d of %d in use", in_use.size(), devices.size()),
                            std::move(evidence)));
  }
  return out;
}

}  // namespace vfio_agent::validation
