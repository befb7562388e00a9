#include "device_watch.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "vfio_gpu_agent/common/fs.h"

namespace vfio_agent::dra::internal {
namespace {

constexpr uint32_t kMask = IN_CREATE | IN_DELETE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE_SELF;

}  // namespace

DeviceWatch::~DeviceWatch() {
  if (inotify_fd_ >= 0) ::close(inotify_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

absl::Status DeviceWatch::Open(const std::filesystem::path& dev_root) {
  dev_root_ = dev_root;
  inotify_fd_ = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  if (inotify_fd_ < 0) return fs::ErrnoStatus(errno, "inotify_init1", dev_root);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) return fs::ErrnoStatus(errno, "eventfd", dev_root);
  if (inotify_add_watch(inotify_fd_, dev_root.c_str(), kMask) < 0) {
    return fs::ErrnoStatus(errno, "inotify_add_watch", dev_root);
  }
  WatchVfio();
  return absl::OkStatus();
}

void DeviceWatch::WatchVfio() {
  if (vfio_wd_ >= 0) return;
  vfio_wd_ = inotify_add_watch(inotify_fd_, (dev_root_ / "vfio").c_str(), kMask);
}

void DeviceWatch::Wake() {
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);
}

DeviceWatch::Woken DeviceWatch::Wait(std::chrono::steady_clock::time_point until) {
  Woken woken;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
  const int timeout_ms = until == std::chrono::steady_clock::time_point::max()
                             ? -1
                             : static_cast<int>(std::clamp<int64_t>(left.count() + 1, 0, INT32_MAX));
  pollfd fds[2] = {{inotify_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
  if (::poll(fds, 2, timeout_ms) <= 0) return woken;
  if (fds[1].revents != 0) {
    uint64_t count = 0;
    (void)!::read(wake_fd_, &count, sizeof count);
  }
  if (fds[0].revents != 0) {
    alignas(inotify_event) char buffer[4096];
    ssize_t n = 0;
    while ((n = ::read(inotify_fd_, buffer, sizeof buffer)) > 0) {
      for (ssize_t offset = 0; offset < n;) {
        const auto* event = reinterpret_cast<const inotify_event*>(buffer + offset);
        offset += static_cast<ssize_t>(sizeof(inotify_event) + event->len);
        if (event->wd == vfio_wd_) {
          woken.devices = true;
          if ((event->mask & (IN_DELETE_SELF | IN_IGNORED)) != 0) vfio_wd_ = -1;
        } else if (event->len > 0 && (std::string_view(event->name) == "vfio" ||
                                      std::string_view(event->name) == "iommu")) {
          woken.devices = true;
        }
      }
    }
  }
  WatchVfio();
  return woken;
}

}  // namespace vfio_agent::dra::internal
