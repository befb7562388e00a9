#include "binding_worker.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/common/thread_name.h"

namespace vfio_agent::dra {

std::string BindingConditionType(std::string_view driver) {
  return absl::StrCat(std::string(driver), "/", std::string(kBindingConditionName));
}
std::string BindingFailureConditionType(std::string_view driver) {
  return absl::StrCat(std::string(driver), "/", std::string(kBindingFailureConditionName));
}

}  // namespace vfio_agent::dra

namespace vfio_agent::dra::internal {
namespace {

constexpr size_t kMaxConditionMessage = 1024;  // a condition message may hold 32 KiB; a reason for a human is short

std::string Ref(const std::string& namespace_name, const std::string& name, const std::string& uid) {
  return absl::StrCat("claim ", namespace_name, "/", name, " (", uid, ")");
}

bool ConditionTrue(const kube::DeviceStatus& status, const std::string& type) {
  return std::any_of(status.conditions.begin(), status.conditions.end(),
                     [&](const kube::DeviceCondition& c) { return c.type == type && c.status == "True"; });
}

std::string Rfc3339Now() { return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone()); }

}  // namespace

std::vector<const kube::AllocationResult*> ResultsToBind(const kube::ResourceClaim& claim, const std::string& driver,
                                                         const std::string& pool) {
  std::vector<const kube::AllocationResult*> results;
  if (!claim.allocated || claim.deleting) return results;
  const std::string condition = BindingConditionType(driver);
  for (const kube::AllocationResult& result : claim.results) {
    if (result.driver == driver && result.pool == pool &&
        std::find(result.binding_conditions.begin(), result.binding_conditions.end(), condition) !=
            result.binding_conditions.end()) {
      results.push_back(&result);
    }
  }
  return results;
}

bool Answered(const kube::ResourceClaim& claim, const std::vector<const kube::AllocationResult*>& results,
              const std::string& driver) {
  const std::string condition = BindingConditionType(driver);
  const std::string failure = BindingFailureConditionType(driver);
  for (const kube::AllocationResult* result : results) {
    auto it = std::find_if(claim.device_statuses.begin(), claim.device_statuses.end(), [&](const kube::DeviceStatus& s) {
      return s.driver == result->driver && s.pool == result->pool && s.device == result->device;
    });
    if (it == claim.device_statuses.end() || !(ConditionTrue(*it, condition) || ConditionTrue(*it, failure))) {
      return false;
    }
  }
  return true;
}

BindingWorker::BindingWorker(const DriverOptions& options, ClaimPreparer& claims, std::mutex& serialize)
    : options_(options),
      claims_(claims),
      serialize_(serialize),
      condition_(BindingConditionType(options.driver_name)),
      failure_(BindingFailureConditionType(options.driver_name)) {}

BindingWorker::~BindingWorker() { Stop(); }

void BindingWorker::Start() {
  thread_ = std::thread([this] { Loop(); });
  watch_ = options_.watch_claims({.listed = [this](std::vector<kube::ResourceClaim> claims) { Listed(std::move(claims)); },
                                  .changed = [this](const kube::ResourceClaim& claim, bool gone) {
                                    Changed(claim, gone);
                                  }});
}

void BindingWorker::Stop() {
  watch_.reset();  // joins the watch's thread: no Listed/Changed after this
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void BindingWorker::Listed(std::vector<kube::ResourceClaim> claims) {
  // The whole selection: a pre-bound record whose claim is not in it was deleted or unlabelled meanwhile (or
  // while the agent was down), and is looked at too.
  std::set<std::string> listed;
  for (kube::ResourceClaim& claim : claims) {
    listed.insert(claim.uid);
    Queue({.namespace_name = claim.namespace_name, .name = claim.name, .uid = claim.uid, .claim = std::move(claim)});
  }
  std::vector<PreparedClaim> prepared;
  {
    std::lock_guard lock(serialize_);
    prepared = claims_.Prepared();
  }
  for (const PreparedClaim& record : prepared) {
    if (record.prebound && !listed.contains(record.uid)) {
      Queue({.namespace_name = record.namespace_name, .name = record.name, .uid = record.uid});
    }
  }
}

void BindingWorker::Changed(const kube::ResourceClaim& claim, bool gone) {
  Work work{.namespace_name = claim.namespace_name, .name = claim.name, .uid = claim.uid};
  if (!gone) work.claim = claim;
  Queue(std::move(work));
}

void BindingWorker::Queue(Work work) {
  {
    std::lock_guard lock(mu_);
    if (work.claim && !ResultsToBind(*work.claim, options_.driver_name, options_.node_name).empty()) {
      seen_.try_emplace(work.uid, absl::Now());
    }
    queue_[work.uid] = std::move(work);
  }
  cv_.notify_all();
}

void BindingWorker::Loop() {
  NameThisThread("dra-binding");
  std::unique_lock lock(mu_);
  std::map<std::string, Work> retry;
  while (!stopping_) {
    if (queue_.empty()) {
      // Retries wait a second, unless newer news of the claim arrives first.
      if (retry.empty()) {
        cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      } else if (!cv_.wait_for(lock, std::chrono::seconds(1), [this] { return stopping_ || !queue_.empty(); })) {
        for (auto& [uid, work] : retry) queue_.try_emplace(uid, std::move(work));
        retry.clear();
      }
      continue;
    }
    Work work = std::move(queue_.begin()->second);
    queue_.erase(queue_.begin());
    retry.erase(work.uid);
    lock.unlock();
    const bool done = Handle(work);
    lock.lock();
    if (!done && !queue_.contains(work.uid)) retry[work.uid] = std::move(work);
  }
}

bool BindingWorker::Handle(const Work& work) {
  if (work.claim) {
    const std::vector<const kube::AllocationResult*> results =
        ResultsToBind(*work.claim, options_.driver_name, options_.node_name);
    if (!results.empty()) {
      if (Answered(*work.claim, results, options_.driver_name)) {
        std::lock_guard lock(mu_);
        seen_.erase(work.uid);
        return true;
      }
      return Bind(*work.claim, results);
    }
  }
  {
    std::lock_guard lock(mu_);
    seen_.erase(work.uid);
  }
  bool prebound = false;
  {
    std::lock_guard lock(serialize_);
    prebound = claims_.PreBound(work.uid);
  }
  if (!prebound) return true;
  if (!work.claim) {
    // Gone from the selection: deleted, or only its label went. The claim itself says which.
    if (options_.get_claim) {
      absl::StatusOr<kube::ResourceClaim> current = options_.get_claim(work.namespace_name, work.name);
      if (current.ok() && current->uid == work.uid &&
          !ResultsToBind(*current, options_.driver_name, options_.node_name).empty()) {
        return true;  // still allocated here: kept for the kubelet's Prepare
      }
      if (!current.ok() && current.status().code() != absl::StatusCode::kNotFound) return false;  // asked again
    }
    return Undo(work, "deleted");
  }
  return Undo(work, work.claim->allocated ? "allocated elsewhere" : "deallocated");
}

bool BindingWorker::Undo(const Work& work, const std::string& why) {
  const std::string ref = Ref(work.namespace_name, work.name, work.uid);
  absl::Status forgotten;
  {
    std::lock_guard lock(serialize_);
    // Prepared by the kubelet meanwhile: the kubelet's Unprepare owns it now.
    if (!claims_.PreBound(work.uid)) return true;
    forgotten = claims_.Forget(work.uid);
  }
  if (!forgotten.ok()) {
    spdlog::error("DRA binding: {} {} before Prepare: {}; retried", ref, why, std::string(forgotten.message()));
    return false;
  }
  spdlog::info("DRA binding: {} {} before Prepare: its GPUs are back on their drivers, its partition released", ref,
               why);
  return true;
}

bool BindingWorker::Bind(const kube::ResourceClaim& claim, const std::vector<const kube::AllocationResult*>& results) {
  const std::string ref = Ref(claim.namespace_name, claim.name, claim.uid);
  absl::StatusOr<std::string> done;
  {
    std::lock_guard lock(serialize_);
    done = claims_.PreBind(claim, absl::Now());
  }
  std::vector<kube::DeviceStatus> statuses;
  const std::string now = Rfc3339Now();
  for (const kube::AllocationResult* result : results) {
    kube::DeviceCondition condition{.last_transition_time = now, .observed_generation = claim.generation};
    if (done.ok()) {
      condition.type = condition_;
      condition.status = "True";
      condition.reason = "Ready";
      condition.message = *done;
    } else {
      condition.type = failure_;
      condition.status = "True";
      condition.reason = "BindFailed";
      condition.message = std::string(done.status().message()).substr(0, kMaxConditionMessage);
    }
    statuses.push_back(
        {.driver = result->driver, .pool = result->pool, .device = result->device, .conditions = {condition}});
  }
  const absl::Status written = options_.write_claim_status(claim, statuses);
  if (!written.ok()) {
    spdlog::warn("DRA binding: {}: writing its status.devices: {}", ref, std::string(written.message()));
    // Replaced or deleted meanwhile: its own event follows and undoes the pre-bind.
    return written.code() == absl::StatusCode::kAborted || written.code() == absl::StatusCode::kNotFound;
  }
  BindingOutcome outcome{.namespace_name = claim.namespace_name, .name = claim.name, .uid = claim.uid,
                         .ok = done.ok(), .message = done.ok() ? *done : std::string(done.status().message())};
  {
    std::lock_guard lock(mu_);
    if (auto it = seen_.find(claim.uid); it != seen_.end()) {
      outcome.waited = absl::ToChronoNanoseconds(absl::Now() - it->second);
      seen_.erase(it);
    }
  }
  if (done.ok()) {
    spdlog::info("DRA binding: {} ready after {} ms: {}", ref,
                 std::chrono::duration_cast<std::chrono::milliseconds>(outcome.waited).count(), *done);
  } else {
    spdlog::warn("DRA binding: {} failed after {} ms, the scheduler will place its pod again: {}", ref,
                 std::chrono::duration_cast<std::chrono::milliseconds>(outcome.waited).count(),
                 std::string(done.status().message()));
  }
  if (options_.on_binding) options_.on_binding(outcome);
  return true;
}

}  // namespace vfio_agent::dra::internal
