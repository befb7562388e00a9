#include "bind_policy.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/binding/binder.h"
#include "vfio_gpu_agent/common/fs.h"
#include "vfio_gpu_agent/pci/vfio_health.h"

namespace vfio_agent::dra::internal {
namespace {

std::string DriverText(const std::string& driver) { return driver.empty() ? "no driver" : driver; }

}  // namespace

void MoveTracker::OnMoveEnded(std::function<void()> ended) {
  std::lock_guard lock(mu_);
  ended_ = std::move(ended);
}

uint64_t MoveTracker::Begin(std::set<std::string> bdfs) {
  std::lock_guard lock(mu_);
  const uint64_t id = next_++;
  moves_[id] = {.bdfs = std::move(bdfs), .start = Clock::now(), .end = std::nullopt};
  return id;
}

void MoveTracker::End(uint64_t id) {
  std::function<void()> ended;
  {
    std::lock_guard lock(mu_);
    auto it = moves_.find(id);
    if (it == moves_.end()) return;
    it->second.end = Clock::now();
    ended = ended_;
  }
  if (ended) ended();
}

bool MoveTracker::Overlaps(const std::string& bdf, Clock::time_point from, Clock::time_point to) const {
  std::lock_guard lock(mu_);
  for (const auto& [id, move] : moves_) {
    if (move.start <= to && (!move.end || *move.end >= from) && move.bdfs.contains(bdf)) return true;
  }
  return false;
}

void MoveTracker::ForgetEndedBefore(Clock::time_point before) {
  std::lock_guard lock(mu_);
  std::erase_if(moves_, [&](const auto& entry) { return entry.second.end && *entry.second.end < before; });
}

MoveScope::MoveScope(MoveTracker* tracker, const HostPaths& paths, const std::vector<std::string>& bdfs)
    : tracker_(tracker) {
  if (tracker_ == nullptr) return;
  // The whole group moves with each function: its other GPUs are half-moved as well.
  std::set<std::string> moving(bdfs.begin(), bdfs.end());
  for (const std::string& bdf : bdfs) {
    const std::optional<int> group = IommuGroupOf(paths, bdf);
    if (!group) continue;
    absl::StatusOr<std::vector<std::string>> members =
        fs::ListDir(paths.IommuGroups() / std::to_string(*group) / "devices");
    if (members.ok()) moving.insert(members->begin(), members->end());
  }
  id_ = tracker_->Begin(std::move(moving));
}

MoveScope::~MoveScope() {
  if (tracker_ != nullptr) tracker_->End(id_);
}

absl::StatusOr<RecordedDrivers> BindOnPrepare::Bind(const std::vector<std::string>& bdfs, absl::Time call_start) const {
  if (bdfs.empty()) return RecordedDrivers{};  // a claim with no whole GPU (vGPUs) binds nothing
  // Ends when the answer is known, after a failed bind's return as well.
  const MoveScope moving(moves_, paths_, bdfs);
  binding::BinderOptions options{.paths = paths_, .policy = policy_, .write_timeout = kWriteTimeout};
  options.targets = binding::Targets::Devices(bdfs);
  options.deadline = call_start + kBindBudget;
  const absl::Time restore_deadline = call_start + kCallBudget;
  absl::StatusOr<binding::BindReport> report = binding::Bind(options);
  if (!report.ok()) return report.status();  // nothing was written
  RecordedDrivers moved;    // on vfio-pci now
  RecordedDrivers touched;  // written to but not moved (override set, or a write the kernel still holds)
  std::vector<std::string> failures;
  {
    std::lock_guard lock(abandoned_mu_);
    for (const binding::DeviceResult& device : report->devices) {
      if (device.outcome == binding::Outcome::kBound) {
        auto abandoned = abandoned_.find(device.bdf);
        // On no driver because an unbind we gave up on completed later: the host's driver is the one it had.
        const bool completed_late = abandoned != abandoned_.end() && device.driver_before.empty();
        moved[device.bdf] = completed_late ? abandoned->second : device.driver_before;
        if (completed_late) {
          spdlog::info("DRA bind {}: on no driver since an abandoned unbind completed; recorded as {}", device.bdf,
                       abandoned->second);
        }
        if (abandoned != abandoned_.end()) abandoned_.erase(abandoned);
      } else if (device.outcome == binding::Outcome::kFailed || device.outcome == binding::Outcome::kBlocked) {
        failures.push_back(absl::StrCat(device.bdf, " ", binding::OutcomeName(device.outcome), ": ", device.reason));
        if (!device.steps.empty()) touched[device.bdf] = device.driver_before;
        // A write abandoned to the kernel (kBlocked): it may still take the function off its driver.
        if (device.failure == binding::Failure::kWriteDeadline && !device.driver_before.empty()) {
          abandoned_.try_emplace(device.bdf, device.driver_before);
        }
      }
    }
  }
  if (report->ok()) return moved;

  // Nothing half-bound: what moved goes back first, then what was only touched gets its override cleared.
  std::string answer = absl::StrCat("binding to vfio-pci did not finish: ", absl::StrJoin(failures, "; "));
  const absl::Status returned = Return(moved, restore_deadline);
  const absl::Status cleared = Return(touched, restore_deadline);
  std::vector<std::string> now;
  for (const RecordedDrivers* drivers : {&moved, &touched}) {
    for (const auto& [bdf, before] : *drivers) {
      absl::StatusOr<std::string> driver = fs::ReadLinkBasename(paths_.PciDevice(bdf) / "driver");
      now.push_back(absl::StrCat(bdf, " on ", DriverText(driver.ok() ? *driver : ""), " (was ", DriverText(before), ")"));
    }
  }
  if (moved.empty() && touched.empty()) {
    absl::StrAppend(&answer, "; nothing was written");
  } else if (returned.ok() && cleared.ok()) {
    absl::StrAppend(&answer, "; every function written to is back on its driver");
  } else {
    for (const absl::Status& status : {returned, cleared}) {
      if (!status.ok()) absl::StrAppend(&answer, "; ", status.message());
    }
  }
  if (!now.empty()) absl::StrAppend(&answer, ": ", absl::StrJoin(now, ", "));
  return absl::UnavailableError(answer);
}

absl::Status BindOnPrepare::Return(const RecordedDrivers& drivers, absl::Time deadline) const {
  binding::UnbindOptions options{.paths = paths_, .policy = policy_, .write_timeout = kWriteTimeout};
  options.targets = binding::Targets::Devices({});  // only the functions of return_to
  options.deadline = deadline;
  for (const auto& [bdf, driver] : drivers) {
    // A function unplugged meanwhile has nowhere to go back to; its return is done.
    if (fs::Exists(paths_.PciDevice(bdf))) {
      options.return_to[bdf] = driver;
    } else {
      spdlog::info("DRA return {} to {}: gone from sysfs", bdf, DriverText(driver));
    }
  }
  if (options.return_to.empty()) return absl::OkStatus();
  std::vector<std::string> returning;
  for (const auto& [bdf, driver] : options.return_to) returning.push_back(bdf);
  const MoveScope moving(moves_, paths_, returning);
  absl::StatusOr<binding::BindReport> report = binding::Unbind(options);
  if (!report.ok()) return report.status();
  std::vector<std::string> left;
  for (const binding::DeviceResult& device : report->devices) {
    if (device.outcome != binding::Outcome::kRestored && device.outcome != binding::Outcome::kNotBound) {
      left.push_back(absl::StrCat(device.bdf, " ", binding::OutcomeName(device.outcome), ": ", device.reason));
    }
  }
  if (left.empty()) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("not returned to its driver: ", absl::StrJoin(left, "; ")));
}

std::optional<int> IommuGroupOf(const HostPaths& paths, const std::string& bdf) {
  absl::StatusOr<std::string> group = fs::ReadLinkBasename(paths.PciDevice(bdf) / "iommu_group");
  int id = 0;
  if (!group.ok() || !absl::SimpleAtoi(*group, &id)) return std::nullopt;
  return id;
}

}  // namespace vfio_agent::dra::internal
