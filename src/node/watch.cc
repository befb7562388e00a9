#include "vfio_gpu_agent/node/watch.h"

#include <libudev.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/common/fs.h"

namespace vfio_agent::node {
namespace {

constexpr uint32_t kDirEvents =
    IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF | IN_ATTRIB;

int AddWatch(int fd, const std::filesystem::path& dir) {
  if (!fs::Exists(dir)) return -1;
  int wd = ::inotify_add_watch(fd, dir.c_str(), kDirEvents | IN_ONLYDIR);
  if (wd < 0) spdlog::warn("inotify watch {}: {}", dir.string(), std::strerror(errno));
  return wd;
}

}  // namespace

DirWatcher::~DirWatcher() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status DirWatcher::Open() {
  fd_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (fd_ < 0) return fs::ErrnoStatus(errno, "inotify_init1", "");
  return absl::OkStatus();
}

void DirWatcher::Refresh(const std::filesystem::path& kubelet_dir, const std::filesystem::path& dev_root) {
  kubelet_ = !kubelet_dir.empty();
  if (kubelet_ && kubelet_wd_ < 0) kubelet_wd_ = AddWatch(fd_, kubelet_dir);
  if (dev_wd_ < 0) dev_wd_ = AddWatch(fd_, dev_root);
  if (vfio_wd_ < 0) vfio_wd_ = AddWatch(fd_, dev_root / "vfio");
}

DirWatcher::Drained DirWatcher::Drain() {
  Drained drained;
  alignas(inotify_event) char buffer[8192];
  while (true) {
    ssize_t n = ::read(fd_, buffer, sizeof buffer);
    if (n <= 0) break;
    for (char* p = buffer; p < buffer + n;) {
      const auto* event = reinterpret_cast<const inotify_event*>(p);
      p += sizeof(inotify_event) + event->len;
      const bool gone = event->mask & (IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF);
      if (event->wd == kubelet_wd_) {
        drained.kubelet_dir = true;
        if (gone) kubelet_wd_ = -1;
      } else if (event->wd == dev_wd_ || event->wd == vfio_wd_) {
        drained.devices = true;
        if (gone) (event->wd == dev_wd_ ? dev_wd_ : vfio_wd_) = -1;
      }
    }
  }
  return drained;
}

UdevMonitor::~UdevMonitor() {
  if (monitor_ != nullptr) udev_monitor_unref(monitor_);
  if (udev_ != nullptr) udev_unref(udev_);
}

absl::Status UdevMonitor::Open() {
  udev_ = udev_new();
  if (udev_ == nullptr) return absl::UnavailableError("udev_new failed");
  // Kernel uevents arrive without udevd (e.g. in a container); they only trigger a rescan of sysfs.
  monitor_ = udev_monitor_new_from_netlink(udev_, "kernel");
  if (monitor_ == nullptr) return absl::UnavailableError("udev monitor: netlink socket unavailable");
  // mdev: vGPUs created and removed (vm-vgpu); their group nodes also show up in the inotify watch of /dev/vfio.
  if (udev_monitor_filter_add_match_subsystem_devtype(monitor_, "pci", nullptr) < 0 ||
      udev_monitor_filter_add_match_subsystem_devtype(monitor_, "mdev", nullptr) < 0 ||
      udev_monitor_enable_receiving(monitor_) < 0) {
    return absl::UnavailableError("udev monitor: cannot receive pci and mdev events");
  }
  return absl::OkStatus();
}

int UdevMonitor::fd() const { return monitor_ != nullptr ? udev_monitor_get_fd(monitor_) : -1; }

bool UdevMonitor::Drain(std::vector<std::string>* bdfs) {
  bool any = false;
  while (udev_device* device = udev_monitor_receive_device(monitor_)) {
    const char* action = udev_device_get_action(device);
    const char* sysname = udev_device_get_sysname(device);
    spdlog::debug("udev {} {}", action != nullptr ? action : "?", sysname != nullptr ? sysname : "?");
    if (bdfs != nullptr && sysname != nullptr) bdfs->push_back(sysname);
    udev_device_unref(device);
    any = true;
  }
  return any;
}

Wakeup::Wakeup() : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

Wakeup::~Wakeup() {
  if (fd_ >= 0) ::close(fd_);
}

void Wakeup::Notify() {
  uint64_t one = 1;
  (void)!::write(fd_, &one, sizeof one);
}

void Wakeup::Drain() {
  uint64_t value;
  (void)!::read(fd_, &value, sizeof value);
}

}  // namespace vfio_agent::node
