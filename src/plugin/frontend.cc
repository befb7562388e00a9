// plugin::MakeFrontend: the device plugin behind node::Frontend. What it must show before the node is ready is its
// own snapshot (advertised, healthy) and registration; the kubelet's allocatable set is compared by the daemon, as the
// plugin cannot ask validation (the room above it).
#include "vfio_gpu_agent/plugin/frontend.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace vfio_agent::plugin {
namespace {

class AgentFrontend final : public node::Frontend {
 public:
  explicit AgentFrontend(ServeOptions options)
      : follows_release_(options.vfio_backend == VfioBackendChoice::kAuto), agent_(std::move(options)) {}

  absl::Status Start() override { return agent_.Start(); }
  void Stop() override { agent_.Stop(); }

  node::FrontendReadiness Readiness(const node::ReadinessQuery& query) override {
    // One snapshot for every question, so that the answer is about one list.
    const DeviceSnapshot served = agent_.Snapshot();
    node::FrontendReadiness out;
    out.served = ServedOf(served);
    if (query.vgpus) {
      int healthy = 0, unhealthy = 0;
      for (const auto& [name, resource] : served.resources) {
        for (const PluginDevice& device : resource.devices) ++(device.healthy ? healthy : unhealthy);
      }
      if (healthy + unhealthy == 0) {
        out.nothing_served = true;
        out.summary = "no vGPU on this node (none created yet); nothing to advertise";
        return out;
      }
      out.summary = absl::StrCat(healthy, " vGPUs healthy, registered and allocatable in ", served.resources.size(),
                                 " resources", unhealthy == 0 ? "" : absl::StrCat("; ", unhealthy, " unhealthy"));
    }
    std::vector<std::string> missing, unhealthy;
    for (const std::string& bdf : query.required) {
      const PluginDevice* device = nullptr;
      for (const auto& [name, resource] : served.resources) {
        if ((device = resource.Find(bdf)) != nullptr) break;
      }
      if (device == nullptr) {
        missing.push_back(bdf);
      } else if (!device->healthy) {
        unhealthy.push_back(absl::StrCat(bdf, " (", device->unhealthy_reason, ")"));
      }
    }
    if (!missing.empty()) {
      out.failing = {.id = "plugin.advertised", .reason = "DeviceNotAdvertised",
                     .message = absl::StrCat("plugin.advertised: bound but not advertised yet: ",
                                             absl::StrJoin(missing, ","))};
      return out;
    }
    if (!unhealthy.empty()) {
      out.failing = {.id = "plugin.healthy", .reason = "DeviceUnhealthy",
                     .message = absl::StrCat("plugin.healthy: ", absl::StrJoin(unhealthy, "; "))};
      return out;
    }
    std::vector<std::string> unregistered;
    std::string key;
    for (const ResourceStatus& resource : agent_.Resources()) {
      absl::StrAppend(&key, resource.resource_name, ":", resource.registrations, ";");
      out.registrations[resource.resource_name] = resource.registrations;
      auto it = served.resources.find(resource.resource_name);
      if (it != served.resources.end() && !it->second.devices.empty() && !resource.registered) {
        unregistered.push_back(resource.resource_name);
      }
    }
    if (!unregistered.empty()) {
      out.failing = {.id = "plugin.registered", .reason = "NotRegistered",
                     .message = absl::StrCat("plugin.registered: not registered with the kubelet: ",
                                             absl::StrJoin(unregistered, ","))};
      return out;
    }
    for (const auto& [name, resource] : served.resources) {
      for (const PluginDevice& device : resource.devices) absl::StrAppend(&key, device.id, device.healthy);
    }
    out.allocatable_key = std::move(key);
    return out;
  }

  node::ServedDevices Served(const node::ServedDevices& /*expected*/) const override {
    return ServedOf(agent_.Snapshot());
  }

  bool BindsOnDemand() const override { return false; }
  absl::Status Supports(Workload /*workload*/) const override { return absl::OkStatus(); }
  std::optional<std::string> LiveSwitchRefusal(Workload /*current*/) const override { return std::nullopt; }
  // A pod's vGPU is held once its VM opens the group, which the profile applier sees itself.
  absl::StatusOr<std::map<std::string, std::string>> HeldVgpus() const override {
    return std::map<std::string, std::string>{};
  }

  bool FollowsKubevirtRelease() const override { return follows_release_; }
  void SetKubevirtRelease(const std::optional<kube::KubevirtRelease>& release) override {
    agent_.SetKubevirtRelease(release);
  }
  std::optional<fabric::FabricStatus> Fabric() const override { return agent_.Fabric(); }

 private:
  const bool follows_release_;
  Agent agent_;
};

}  // namespace

std::unique_ptr<node::Frontend> MakeFrontend(ServeOptions options) {
  return std::make_unique<AgentFrontend>(std::move(options));
}

node::ServedDevices ServedOf(const DeviceSnapshot& snapshot) {
  node::ServedDevices out;
  for (const auto& [name, resource] : snapshot.resources) {
    for (const PluginDevice& device : resource.devices) {
      out.push_back({.resource_name = name, .id = device.id, .healthy = device.healthy,
                     .unhealthy_reason = device.unhealthy_reason});
    }
  }
  return out;
}

}  // namespace vfio_agent::plugin
