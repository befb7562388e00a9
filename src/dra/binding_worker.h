// --binding-conditions: the claim watcher and condition writer beside the kubelet services. The watch (its own
// thread, kube::ResourceClaimWatch) hands each change of this node's labelled claims to the worker ("dra-binding"),
// which owns the queue: for an allocated claim whose results of our pool carry our binding condition, and whose
// status has neither our condition nor our failure condition True, it runs ClaimPreparer::PreBind (the code Prepare
// uses, under the driver's call lock) and applies the claim's status.devices[] entries; for a claim deallocated,
// reallocated elsewhere or deleted before the kubelet prepared it, it undoes the pre-bind (ClaimPreparer::Forget:
// GPUs back on their recorded drivers, partition released), also for records a restart left.
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "claims.h"
#include "vfio_gpu_agent/dra/driver.h"
#include "vfio_gpu_agent/kube/resource_claims.h"

namespace vfio_agent::dra::internal {

// The devices of `claim` this driver must make ready first: its results of our driver and pool whose binding
// conditions include ours.
std::vector<const kube::AllocationResult*> ResultsToBind(const kube::ResourceClaim& claim, const std::string& driver,
                                                         const std::string& pool);

// Whether our condition or our failure condition is True for every one of `results` in the claim's status.
bool Answered(const kube::ResourceClaim& claim, const std::vector<const kube::AllocationResult*>& results,
              const std::string& driver);

class BindingWorker {
 public:
  // `claims` and `serialize` (the lock of Prepare/Unprepare) are the driver's and outlive the worker.
  BindingWorker(const DriverOptions& options, ClaimPreparer& claims, std::mutex& serialize);
  ~BindingWorker();  // Stop()
  BindingWorker(const BindingWorker&) = delete;
  BindingWorker& operator=(const BindingWorker&) = delete;

  void Start();
  // Ends the watch, then the worker (a PreBind under way finishes first).
  void Stop();

 private:
  struct Work {
    std::string namespace_name;
    std::string name;
    std::string uid;
    std::optional<kube::ResourceClaim> claim;  // nullopt: gone from the watch (deleted, or unlabelled)
  };

  void Listed(std::vector<kube::ResourceClaim> claims);
  void Changed(const kube::ResourceClaim& claim, bool gone);
  void Queue(Work work);
  void Loop();
  // True when done (false: retried in a second, e.g. the status write failed).
  bool Handle(const Work& work);
  bool Bind(const kube::ResourceClaim& claim, const std::vector<const kube::AllocationResult*>& results);
  bool Undo(const Work& work, const std::string& why);

  const DriverOptions& options_;
  ClaimPreparer& claims_;
  std::mutex& serialize_;
  const std::string condition_;
  const std::string failure_;

  std::mutex mu_;  // queue_, seen_, stopping_
  std::condition_variable cv_;
  std::map<std::string, Work> queue_;  // by UID: the latest state only
  std::map<std::string, absl::Time> seen_;  // UID -> when its allocation was first seen (the wait's start)
  bool stopping_ = false;
  std::unique_ptr<kube::ResourceClaimWatch> watch_;  // its thread calls Listed/Changed
  std::thread thread_;
};

}  // namespace vfio_agent::dra::internal
