// --bind-on-prepare: the claim's IOMMU groups are bound to vfio-pci in Prepare and returned to their recorded
// drivers in Unprepare, all within deadlines the kubelet's 45 s per call leaves room for.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "vfio_gpu_agent/common/host_paths.h"
#include "vfio_gpu_agent/pci/inventory.h"
#include "vfio_gpu_agent/pci/selection.h"

namespace vfio_agent::dra::internal {

// Functions a claim moved onto vfio-pci, BDF -> the driver each had before ("" = none): what Unprepare restores.
// A function that was on a vfio driver already is never in it, so it stays there.
using RecordedDrivers = std::map<std::string, std::string>;

// The kubelet gives a Prepare or Unprepare call 45 s. A call's binding work (every claim in it) ends by
// kBindBudget after the call starts, and whatever a failed bind moved is back on its driver by kCallBudget: 15 s
// are left for the claim GETs (10 s each at most, from the first claim on) and the reply. A write the kernel
// keeps blocked (nvidia's unbind while a process holds the GPU) waits at most kWriteTimeout, so the holder is
// named well inside the budget even on a group of four functions.
inline constexpr absl::Duration kBindBudget = absl::Seconds(22);
inline constexpr absl::Duration kCallBudget = absl::Seconds(30);
inline constexpr absl::Duration kWriteTimeout = absl::Seconds(5);

// The functions the driver is moving between drivers now or moved lately, each move with when it started and ended.
// A scan taken during a move can see a GPU half-moved (the kernel makes the `driver` link before the probe that
// creates /dev/vfio/<group>, and on unbind removes the node before the link), which is not the GPU's health: the
// driver keeps the health it had before for every scan that overlapped a move of it, and the first scan that
// started after the move ended decides (Driver::Impl::Take). Thread-safe: moves come from the kubelet's calls, the
// binding worker and Load; the driver's loop asks.
class MoveTracker {
 public:
  using Clock = std::chrono::steady_clock;

  // Called on the mover's thread after each move ended (recorded), so that a scan that starts after it is made.
  void OnMoveEnded(std::function<void()> ended);
  // A move of `bdfs` starts now; the id is End's.
  uint64_t Begin(std::set<std::string> bdfs);
  void End(uint64_t id);
  // Whether a move of `bdf` (ongoing, or ended) overlapped [from, to].
  bool Overlaps(const std::string& bdf, Clock::time_point from, Clock::time_point to) const;
  // Drops the moves that ended before `before` (no scan to come started before it).
  void ForgetEndedBefore(Clock::time_point before);

 private:
  struct Move {
    std::set<std::string> bdfs;
    Clock::time_point start;
    std::optional<Clock::time_point> end;
  };
  mutable std::mutex mu_;
  std::map<uint64_t, Move> moves_;
  uint64_t next_ = 1;
  std::function<void()> ended_;
};

// A move of the whole IOMMU groups of `bdfs` in `tracker` (may be null: nothing recorded) for the scope's life.
class MoveScope {
 public:
  MoveScope(MoveTracker* tracker, const HostPaths& paths, const std::vector<std::string>& bdfs);
  ~MoveScope();
  MoveScope(const MoveScope&) = delete;
  MoveScope& operator=(const MoveScope&) = delete;

 private:
  MoveTracker* const tracker_;
  uint64_t id_ = 0;
};

class BindOnPrepare {
 public:
  // `moves` (not owned, may be null): where each Bind and Return records its move.
  BindOnPrepare(HostPaths paths, pci::SelectionPolicy policy, MoveTracker* moves = nullptr)
      : paths_(std::move(paths)), policy_(std::move(policy)), moves_(moves) {}

  // Binds the whole IOMMU groups of `bdfs` to vfio-pci, no write after kBindBudget from `call_start`. On success
  // the functions moved and their drivers before. On failure every function the bind touched is returned to its
  // driver (by kCallBudget from `call_start`) before the answer, which names each failure with its holders
  // (process and pid) and where each function is now.
  absl::StatusOr<RecordedDrivers> Bind(const std::vector<std::string>& bdfs, absl::Time call_start) const;

  // Returns each function to its recorded driver. An error (a VM still holds the group, a write the kernel keeps
  // blocked) names the functions not returned; a retry returns them, the others are no-ops.
  absl::Status Return(const RecordedDrivers& drivers, absl::Time deadline) const;

 private:
  HostPaths paths_;
  pci::SelectionPolicy policy_;
  MoveTracker* const moves_;
  // Functions whose unbind a failed Bind abandoned while the kernel still held it (nvidia's unbind waits for the
  // GPU's holder), BDF -> the driver they had. The kernel completes that write when the holder lets go: the
  // function is then on no driver through no choice of the host's, and the next Bind records the driver kept here
  // instead, so that Unprepare returns the GPU to nvidia and not to nothing.
  mutable std::mutex abandoned_mu_;
  mutable std::map<std::string, std::string> abandoned_;
};

// The IOMMU group of a function (its iommu_group link); nullopt without one, or when the function is gone.
std::optional<int> IommuGroupOf(const HostPaths& paths, const std::string& bdf);

}  // namespace vfio_agent::dra::internal
