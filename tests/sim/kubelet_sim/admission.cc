// Pod admission as the kubelet's device manager does it (reference section 3 item 8, R14/R19): a port of
// devicesToAllocate with a single-NUMA-node hint standing in for the topology manager, then Allocate with
// exactly one container request.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kubelet_sim_impl.h"

namespace vfio_agent::kubeletsim {
namespace {

std::vector<std::string> Shuffled(std::vector<std::string> ids, std::mt19937_64& rng) {
  std::shuffle(ids.begin(), ids.end(), rng);
  return ids;
}

bool OnNode(const std::vector<int64_t>& nodes, int64_t node) {
  return std::find(nodes.begin(), nodes.end(), node) != nodes.end();
}

}  // namespace

absl::StatusOr<AdmittedPod> KubeletSim::Impl::Admit(const PodSpec& pod) {
  std::lock_guard admit(admit_mu_);
  for (const auto& [resource, count] : pod.limits) {
    if (count < 0) return absl::InvalidArgumentError(absl::StrCat("pod ", pod.name, ": negative limit for ", resource));
  }
  {
    std::lock_guard lock(mu_);
    if (pods_.count(pod.name) != 0) return absl::AlreadyExistsError(absl::StrCat("pod ", pod.name, " already admitted"));
  }
  AdmittedPod admitted;
  admitted.name = pod.name;
  admitted.pod_namespace = pod.pod_namespace;
  admitted.container = pod.container;
  for (const auto& [resource, count] : pod.limits) {
    if (count == 0) continue;
    if (auto status = AllocateResource(resource, count, admitted); !status.ok()) {
      std::lock_guard lock(mu_);
      for (const auto& [res, ids] : admitted.devices) {
        for (const auto& id : ids) allocated_[res].erase(id);
      }
      RecordLocked("error", resource, absl::StrCat("admission of ", pod.name, " failed: ", status.message()));
      return status;
    }
  }
  std::lock_guard lock(mu_);
  pods_[pod.name] = admitted;
  return admitted;
}

absl::Status KubeletSim::Impl::AllocateResource(const std::string& resource, int64_t count, AdmittedPod& pod) {
  auto chosen = DevicesToAllocate(resource, count, pod);
  if (!chosen.ok()) return chosen.status();
  std::shared_ptr<PluginClient> client;
  {
    std::lock_guard lock(mu_);
    allocated_[resource].insert(chosen->begin(), chosen->end());
    client = resources_[resource].client;
    // Recorded before the RPC so that a failure below frees them again.
    pod.devices[resource] = *chosen;
    std::sort(pod.devices[resource].begin(), pod.devices[resource].end());
  }
  if (!client) return absl::UnavailableError(absl::StrFormat("endpoint %s has been stopped", resource));

  // The kubelet sends the IDs in set (random) order.
  ::v1beta1::AllocateRequest request;
  auto* container = request.add_container_requests();
  for (const auto& id : Shuffled(*chosen, rng_)) container->add_devices_ids(id);
  pod.allocate_requests[resource] = request;

  ::v1beta1::AllocateResponse response;
  grpc::ClientContext ctx;
  ctx.set_deadline(GrpcDeadline(options_.rpc_watchdog));
  const auto started = Clock::now();
  const grpc::Status status = client->stub->Allocate(&ctx, request, &response);
  const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - started).count();
  Record("allocate", resource,
         absl::StrFormat("pod=%s ids=%s responses=%d status=%s latency_us=%d", pod.name,
                         absl::StrJoin(request.container_requests(0).devices_ids(), ","),
                         response.container_responses_size(), status.ok() ? "OK" : GoRpcError(status), micros));
  if (!status.ok()) return absl::InternalError(GoRpcError(status));
  if (response.container_responses_size() == 0) {
    return absl::InternalError(
        absl::StrCat("no containers return in allocation response ", response.ShortDebugString()));
  }
  pod.responses[resource] = response.container_responses(0);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> KubeletSim::Impl::DevicesToAllocate(const std::string& resource,
                                                                            int64_t count, AdmittedPod& pod) {
  std::vector<std::string> available;
  std::map<std::string, std::vector<int64_t>> topology;
  std::shared_ptr<PluginClient> client;
  {
    std::lock_guard lock(mu_);
    ExpireGraceLocked();
    auto it = resources_.find(resource);
    if (it == resources_.end() || it->second.removed) {
      return absl::FailedPreconditionError(absl::StrCat("cannot allocate unregistered device ", resource));
    }
    const auto& entry = it->second;
    if (entry.healthy.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("no healthy devices present; cannot allocate unhealthy devices ", resource));
    }
    const auto& taken = allocated_[resource];
    for (const auto& id : entry.healthy) {
      if (taken.count(id) == 0) available.push_back(id);
    }
    if (static_cast<int64_t>(available.size()) < count) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("requested number of devices unavailable for %s. Requested: %d, Available: %d",
                          resource, count, available.size()));
    }
    topology = entry.topology;
    client = entry.client;
  }

  // Topology hint: the lowest NUMA node that alone can hold the request, as the best-effort topology
  // manager picks among equally narrow hints; none when the resource carries no topology.
  std::optional<int64_t> hint;
  const bool topology_aware = std::any_of(topology.begin(), topology.end(),
                                          [](const auto& kv) { return !kv.second.empty(); });
  if (topology_aware) {
    for (int node : options_.numa_nodes) {
      const auto on_node = std::count_if(available.begin(), available.end(),
                                         [&](const std::string& id) { return OnNode(topology[id], node); });
      if (on_node >= count) {
        hint = node;
        break;
      }
    }
  }
  std::vector<std::string> aligned, unaligned, no_affinity;
  for (const auto& id : available) {
    const auto& nodes = topology[id];
    if (!hint || nodes.empty()) {
      no_affinity.push_back(id);
    } else {
      (OnNode(nodes, *hint) ? aligned : unaligned).push_back(id);
    }
  }
  aligned = Shuffled(std::move(aligned), rng_);
  unaligned = Shuffled(std::move(unaligned), rng_);
  no_affinity = Shuffled(std::move(no_affinity), rng_);

  std::vector<std::string> chosen;
  int64_t needed = count;
  auto take_from = [&](const std::vector<std::string>& from) {
    for (const auto& id : from) {
      if (needed == 0) break;
      if (std::find(chosen.begin(), chosen.end(), id) != chosen.end()) continue;
      chosen.push_back(id);
      --needed;
    }
    return needed == 0;
  };
  auto keep_candidates = [](const std::vector<std::string>& preferred, const std::vector<std::string>& set) {
    std::vector<std::string> out;
    for (const auto& id : preferred) {
      if (std::find(set.begin(), set.end(), id) != set.end()) out.push_back(id);
    }
    return out;
  };

  // R19 case A: the aligned devices outnumber the need, so the plugin picks among them.
  if (needed < static_cast<int64_t>(aligned.size())) {
    auto preferred = CallPreferred(client, resource, aligned, chosen, count, pod);
    if (!preferred.ok()) return preferred.status();
    if (take_from(keep_candidates(*preferred, aligned)) || take_from(aligned)) return chosen;
    return absl::InternalError(absl::StrFormat(
        "unexpectedly allocated less resources than required. Requested: %d, Got: %d", count, count - needed));
  }
  // Case B: take every aligned device, then let the plugin choose the rest from all free devices.
  if (take_from(aligned)) return chosen;
  auto preferred = CallPreferred(client, resource, available, chosen, count, pod);
  if (!preferred.ok()) return preferred.status();
  if (take_from(keep_candidates(*preferred, available)) || take_from(unaligned) || take_from(no_affinity)) {
    return chosen;
  }
  return absl::InternalError(absl::StrFormat(
      "unexpectedly allocated less resources than required. Requested: %d, Got: %d", count, count - needed));
}

absl::StatusOr<std::vector<std::string>> KubeletSim::Impl::CallPreferred(
    const std::shared_ptr<PluginClient>& client, const std::string& resource,
    const std::vector<std::string>& available, const std::vector<std::string>& must_include, int64_t size,
    AdmittedPod& pod) {
  // Only the options of the current registration count (R5, R19).
  if (!client || !client->options.get_preferred_allocation_available()) return std::vector<std::string>{};
  ::v1beta1::PreferredAllocationRequest request;
  auto* container = request.add_container_requests();
  std::vector<std::string> candidates = available;
  for (const auto& id : must_include) {
    if (std::find(candidates.begin(), candidates.end(), id) == candidates.end()) candidates.push_back(id);
  }
  for (const auto& id : Shuffled(candidates, rng_)) container->add_available_deviceids(id);
  for (const auto& id : Shuffled(must_include, rng_)) container->add_must_include_deviceids(id);
  container->set_allocation_size(static_cast<int32_t>(size));
  pod.preferred_requests[resource] = request;

  ::v1beta1::PreferredAllocationResponse response;
  grpc::ClientContext ctx;
  ctx.set_deadline(GrpcDeadline(options_.rpc_watchdog));
  const grpc::Status status = client->stub->GetPreferredAllocation(&ctx, request, &response);
  std::vector<std::string> ids;
  if (status.ok() && response.container_responses_size() > 0) {
    ids.assign(response.container_responses(0).deviceids().begin(), response.container_responses(0).deviceids().end());
  }
  Record("preferred", resource,
         absl::StrFormat("pod=%s available=%d must_include=%d size=%d answer=%s status=%s", pod.name,
                         container->available_deviceids_size(), container->must_include_deviceids_size(), size,
                         absl::StrJoin(ids, ","), status.ok() ? "OK" : GoRpcError(status)));
  if (!status.ok()) {
    return absl::InternalError(
        absl::StrCat("device plugin GetPreferredAllocation rpc failed with err: ", GoRpcError(status)));
  }
  pod.preferred_calls_result[resource] = ids;
  return ids;
}

void KubeletSim::Impl::Release(const std::string& pod_name) {
  std::lock_guard lock(mu_);
  auto it = pods_.find(pod_name);
  if (it == pods_.end()) return;
  for (const auto& [resource, ids] : it->second.devices) {
    for (const auto& id : ids) allocated_[resource].erase(id);
  }
  pods_.erase(it);
}

std::vector<AdmittedPod> KubeletSim::Impl::Pods() const {
  std::lock_guard lock(mu_);
  std::vector<AdmittedPod> out;
  for (const auto& [name, pod] : pods_) out.push_back(pod);
  return out;
}

}  // namespace vfio_agent::kubeletsim
