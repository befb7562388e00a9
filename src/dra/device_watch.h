// What wakes the DRA driver's device loop: inotify on <dev_root> and <dev_root>/vfio (a GPU lost, unbound or back
// takes or brings its group node), and wake-ups from other threads (a registration, Stop).
#pragma once

#include <chrono>
#include <filesystem>

#include "absl/status/status.h"

namespace vfio_agent::dra::internal {

class DeviceWatch {
 public:
  DeviceWatch() = default;
  ~DeviceWatch();
  DeviceWatch(const DeviceWatch&) = delete;
  DeviceWatch& operator=(const DeviceWatch&) = delete;

  absl::Status Open(const std::filesystem::path& dev_root);
  // Any thread: the current or next Wait returns at once.
  void Wake();

  struct Woken {
    bool devices = false;  // something under <dev_root>/vfio (or vfio/ itself, or /dev/iommu) changed
  };
  // Blocks until an event, a Wake or `until`. A <dev_root>/vfio created after Open is watched from then on.
  Woken Wait(std::chrono::steady_clock::time_point until);

 private:
  void WatchVfio();

  std::filesystem::path dev_root_;
  int inotify_fd_ = -1;
  int wake_fd_ = -1;
  int vfio_wd_ = -1;
};

}  // namespace vfio_agent::dra::internal
