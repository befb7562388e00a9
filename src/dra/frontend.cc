// dra::MakeFrontend: the DRA driver behind node::Frontend. The driver applies the node's health rules to the same
// scan as the daemon, so what it serves is the daemon's expectation with the driver's own differences: Fabric
// Manager's rule, and under --bind-on-prepare the health of a GPU a claim would bind.
#include "vfio_gpu_agent/dra/frontend.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/dra/checkpoint.h"

namespace vfio_agent::dra {
namespace {

class DriverFrontend final : public node::Frontend {
 public:
  explicit DriverFrontend(DriverOptions options) : options_(options), driver_(std::move(options)) {}

  absl::Status Start() override { return driver_.Start(); }
  void Stop() override { driver_.Stop(); }

  node::FrontendReadiness Readiness(const node::ReadinessQuery& query) override {
    node::FrontendReadiness out;
    const std::vector<GpuDevice> devices = driver_.Devices();
    if (query.vgpus) {
      const auto healthy = std::count_if(devices.begin(), devices.end(), [](const auto& d) { return d.healthy(); });
      if (devices.empty()) {
        out.nothing_served = true;
        out.summary = "no vGPU on this node (none created yet); nothing to publish";
        return out;
      }
      const auto unhealthy = static_cast<std::ptrdiff_t>(devices.size()) - healthy;
      out.summary = absl::StrCat(healthy, " vGPUs healthy and published as DRA devices",
                                 unhealthy == 0 ? "" : absl::StrCat("; ", unhealthy, " unhealthy"));
      out.failing = Serving();
      return out;
    }
    std::map<std::string, const GpuDevice*> published;
    for (const GpuDevice& device : devices) published[device.bdf] = &device;
    // The device plugin's Fabric Manager rule applies to what the driver publishes: a GPU FM does not vouch for is
    // expected Unhealthy (dra.healthy), not a driver lagging behind (dra.published).
    const node::ServedDevices expected = WithFabric(query.expected);
    std::vector<std::string> behind, unhealthy;
    for (const std::string& bdf : query.required) {
      auto it = published.find(bdf);
      const bool healthy_here = std::any_of(expected.begin(), expected.end(), [&](const node::ServedDevice& device) {
        return device.id == bdf && device.healthy;
      });
      if (it == published.end() || (!it->second->healthy() && healthy_here)) {
        behind.push_back(bdf);
      } else if (!it->second->healthy()) {
        unhealthy.push_back(absl::StrCat(bdf, " (", it->second->unhealthy_reason, ")"));
      }
    }
    if (!unhealthy.empty()) {
      out.failing = {.id = "dra.healthy", .reason = "DeviceUnhealthy",
                     .message = absl::StrCat("dra.healthy: ", absl::StrJoin(unhealthy, "; "))};
    } else if (!behind.empty()) {
      out.failing = {.id = "dra.published", .reason = "DeviceNotAdvertised",
                     .message = absl::StrCat("dra.published: bound but not published healthy yet: ",
                                             absl::StrJoin(behind, ","))};
    } else {
      out.failing = Serving();
    }
    return out;
  }

  node::ServedDevices Served(const node::ServedDevices& expected) const override {
    node::ServedDevices served = WithFabric(expected);
    if (options_.bind_on_prepare) {
      // A GPU on its host driver is healthy under this policy (a claim binds it): the driver's own health, or every
      // claim's bind and return would read as DeviceRecovered and DeviceLost.
      std::map<std::string, GpuDevice> published;
      for (GpuDevice& device : driver_.Devices()) published[device.bdf] = std::move(device);
      for (node::ServedDevice& device : served) {
        if (auto it = published.find(device.id); it != published.end()) {
          device.healthy = it->second.healthy();
          device.unhealthy_reason = it->second.unhealthy_reason;
        }
      }
    }
    return served;
  }

  bool BindsOnDemand() const override { return options_.bind_on_prepare; }
  absl::Status Supports(Workload workload) const override {
    DriverOptions asked = options_;
    asked.workload = workload;
    return ValidateModes(asked);
  }
  // The driver's published devices and prepared claims are of one mode.
  std::optional<std::string> LiveSwitchRefusal(Workload current) const override {
    return absl::StrCat("the DRA driver serves the mode it started in (", WorkloadName(current),
                        ") until the agent restarts");
  }
  // A prepared claim's vGPU is the VM's from Prepare on, though virt-launcher opens its group only once its image is
  // pulled: the checkpoint says which.
  absl::StatusOr<std::map<std::string, std::string>> HeldVgpus() const override {
    absl::StatusOr<CheckpointRead> checkpoint = ReadCheckpoint(options_);
    if (!checkpoint.ok()) {
      return absl::Status(checkpoint.status().code(),
                          absl::StrCat("the DRA checkpoint cannot be read (", checkpoint.status().message(), ")"));
    }
    std::map<std::string, std::string> held;
    for (const CheckpointedClaim& claim : checkpoint->claims) {
      for (const std::string& uuid : claim.mdev_uuids) held[uuid] = "DRA claim " + claim.ref;
      for (const std::string& vf : claim.vgpu_vfs) held[vf] = "DRA claim " + claim.ref;
    }
    for (const std::string& unreadable : checkpoint->unreadable) {
      spdlog::warn("vGPU config: DRA checkpoint file {} unreadable: its claim's vGPUs are not known held", unreadable);
    }
    return held;
  }

  // Each claim's DeviceClass picks the VFIO nodes: the KubeVirt release decides nothing here.
  bool FollowsKubevirtRelease() const override { return false; }
  void SetKubevirtRelease(const std::optional<kube::KubevirtRelease>& /*release*/) override {}
  std::optional<fabric::FabricStatus> Fabric() const override { return driver_.Fabric(); }

 private:
  // `devices` with Fabric Manager's rule: a healthy GPU FM does not vouch for is unhealthy, with FM's reason.
  node::ServedDevices WithFabric(node::ServedDevices devices) const {
    for (node::ServedDevice& device : devices) {
      if (!device.healthy) continue;
      std::string reason = driver_.FabricUnusable(device.id);
      if (reason.empty()) continue;
      device.healthy = false;
      device.unhealthy_reason = std::move(reason);
    }
    return devices;
  }
  // The driver registered with the kubelet and its slices written; nullopt when both hold.
  std::optional<node::FrontendCheck> Serving() const {
    if (const RegistrationStatus registration = driver_.Registration(); !registration.registered) {
      return node::FrontendCheck{
          .id = "dra.registered", .reason = "NotRegistered",
          .message = absl::StrCat("dra.registered: the kubelet has not accepted DRA driver ", options_.driver_name,
                                  registration.error.empty() ? "" : ": " + registration.error)};
    }
    if (const std::string error = driver_.SliceError(); !error.empty()) {
      return node::FrontendCheck{.id = "dra.slices", .reason = "SlicesNotPublished",
                                 .message = absl::StrCat("dra.slices: ", error)};
    }
    return std::nullopt;
  }

  const DriverOptions options_;
  Driver driver_;
};

}  // namespace

std::unique_ptr<node::Frontend> MakeFrontend(DriverOptions options) {
  return std::make_unique<DriverFrontend>(std::move(options));
}

}  // namespace vfio_agent::dra
