// Binding in `run`: which GPUs are due (their group off vfio, not backing off, not waiting for a VM), the bind,
// and the per-device backoff (first_backoff doubling to max_backoff; a uevent for the device resets it).
#include "daemon_impl.h"

namespace vfio_agent::daemon {

std::set<int> Daemon::Impl::AllowedGroups(const pci::Inventory& inventory) const {
  std::set<int> groups;
  for (const std::string& bdf : options_.bind.targets.bdfs()) {
    const pci::Function* fn = inventory.Find(bdf);
    if (fn != nullptr && fn->iommu_group) groups.insert(*fn->iommu_group);
  }
  return groups;
}

bool Daemon::Impl::BackingOff(const std::string& bdf, Clock::time_point now) const {
  auto it = backoff_.find(bdf);
  return it != backoff_.end() && now < it->second.next;
}

milliseconds Daemon::Impl::BackOff(const std::string& bdf) {
  Backoff& backoff = backoff_[bdf];
  backoff.delay = backoff.delay.count() == 0 ? options_.first_backoff : std::min(backoff.delay * 2, options_.max_backoff);
  backoff.next = Clock::now() + backoff.delay;
  return backoff.delay;
}

bool Daemon::Impl::BindDue(const pci::Inventory& inventory, const pci::Selection& selection) {
  const Clock::time_point now = Clock::now();
  std::vector<std::string> managed = selection.gpus;
  managed.insert(managed.end(), selection.companions.begin(), selection.companions.end());
  const std::set<int> allowed_groups = AllowedGroups(inventory);
  std::set<int> due_groups;
  for (const std::string& bdf : managed) {
    const pci::Function* fn = inventory.Find(bdf);
    if (fn == nullptr || pci::IsVfioDriver(fn->driver) || !fn->iommu_group || mode_held_.contains(bdf)) continue;
    if (!options_.bind.targets.every_selected() && !allowed_groups.contains(*fn->iommu_group)) continue;
    if (!BackingOff(bdf, now)) due_groups.insert(*fn->iommu_group);
  }
  if (due_groups.empty()) return false;
  std::vector<std::string> due;
  for (const std::string& bdf : selection.gpus) {
    const pci::Function* fn = inventory.Find(bdf);
    if (fn != nullptr && fn->iommu_group && due_groups.contains(*fn->iommu_group) && !mode_held_.contains(bdf)) {
      due.push_back(bdf);
    }
  }
  if (due.empty()) return false;
  binding::BinderOptions options = options_.bind;
  options.targets = binding::Targets::Devices(due);
  absl::StatusOr<binding::BindReport> report = binding::Bind(options);
  if (!report.ok()) {
    // The host changed between the scan and the bind (a device removed): the next pass sees it.
    spdlog::warn("reconcile: bind of {}: {}", absl::StrJoin(due, ","), report.status().ToString());
    return true;
  }
  std::vector<std::string> bound;
  for (const binding::DeviceResult& result : report->devices) {
    metrics_.CountBind(binding::OutcomeName(result.outcome));
    switch (result.outcome) {
      case binding::Outcome::kBound:
        bound.push_back(result.bdf);
        [[fallthrough]];
      case binding::Outcome::kAlreadyBound:
        backoff_.erase(result.bdf);
        bind_failures_.erase(result.bdf);
        break;
      case binding::Outcome::kFailed:
      case binding::Outcome::kBlocked: {
        const milliseconds delay = BackOff(result.bdf);
        metrics_.CountBindFailure(FailureLabel(result));
        const std::string note = absl::StrCat(result.bdf, " ", binding::OutcomeName(result.outcome), ": ", result.reason);
        bind_failures_[result.bdf] = note;
        spdlog::warn("reconcile: {}; retrying in {} ms", note, delay.count());
        // BindBlocked names who holds the GPU; anything else is a failure of the bind itself.
        Event(kube::EventType::kWarning, result.holders.empty() ? "BindFailed" : "BindBlocked", "Binding", note);
        break;
      }
      default:
        break;
    }
  }
  if (!bound.empty()) {
    // Advertised at once: the pass scans again after its binds and the frontend is handed that state.
    spdlog::info("reconcile: bound {} to vfio: {}", bound.size(), absl::StrJoin(bound, ","));
    Event(kube::EventType::kNormal, "GPUsBound", "Binding",
          absl::StrCat("bound ", bound.size(), " functions to vfio: ", absl::StrJoin(bound, ",")));
  }
  return true;
}

}  // namespace vfio_agent::daemon
