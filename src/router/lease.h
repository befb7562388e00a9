// A coordination.k8s.io/v1 Lease held by one replica, with client-go's leader election rules (leaderelection.go,
// resourcelock/leaselock.go): the holder renews renewTime; a candidate takes the lease over when its holder is
// empty or when the record has not changed for leaseDurationSeconds as this candidate observed it (its own
// clock, never the holder's timestamps, so that clock skew between nodes does not matter); every write carries
// the resourceVersion it read, so two candidates cannot both win (409 for the loser).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace vfio_agent::kube {
class ApiClient;
}

namespace vfio_agent::router {

class LeaseLock {
 public:
  LeaseLock(std::shared_ptr<kube::ApiClient> client, std::string namespace_name, std::string name,
            std::string identity, std::chrono::milliseconds duration, std::chrono::milliseconds timeout);

  // One attempt: create the lease, take it over (free, or expired as observed here) or renew it. True when this
  // replica holds it afterwards, false when another one does (or won a race: 409). Errors name the request and
  // what the server said. Not thread-safe: the election's thread.
  absl::StatusOr<bool> TryAcquireOrRenew();
  // Hands the lease back (holderIdentity empty, leaseDurationSeconds 1, as client-go's ReleaseOnCancel), so that a
  // standby takes over on its next attempt. Only when this replica holds it.
  absl::Status Release();
  const std::string& path() const { return path_; }

 private:
  const std::shared_ptr<kube::ApiClient> client_;
  const std::string namespace_name_;
  const std::string name_;
  const std::string identity_;
  const std::chrono::milliseconds duration_;
  const std::chrono::milliseconds timeout_;
  const std::string path_;  // .../namespaces/<ns>/leases/<name>
  // The record as last read or written, and when this replica first saw it (steady clock).
  std::string observed_version_;
  std::string observed_holder_;
  std::chrono::steady_clock::time_point observed_at_{};
  std::string acquire_time_;  // spec.acquireTime of our own term
  int64_t transitions_ = 0;
  bool held_ = false;
};

}  // namespace vfio_agent::router
