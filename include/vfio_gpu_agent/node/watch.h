// What tells the node's scanners that the node changed, as plain file descriptors for one poll(2) loop: inotify on
// the dev root and its vfio/ (a GPU lost, unbound or back takes or brings its group node; /dev/iommu) and on the
// kubelet directory, the libudev PCI and mdev monitor, and an eventfd for wake-ups from other threads. One
// implementation for the device plugin's loop, the DRA driver's and `run`'s.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"

struct udev;
struct udev_monitor;

namespace vfio_agent::node {

class DirWatcher {
 public:
  DirWatcher() = default;
  ~DirWatcher();
  DirWatcher(const DirWatcher&) = delete;
  DirWatcher& operator=(const DirWatcher&) = delete;

  absl::Status Open();
  int fd() const { return fd_; }
  // (Re-)adds the watches whose directory exists now and is not watched yet; cheap when nothing changed,
  // so the loop calls it on every turn (a recreated directory loses its watch). An empty `kubelet_dir` is not
  // watched (the DRA driver's loop does not follow the device plugins' directory).
  void Refresh(const std::filesystem::path& kubelet_dir, const std::filesystem::path& dev_root);
  // Every directory is watched: changes wake the loop, no stat poll is needed.
  bool complete() const { return (kubelet_wd_ >= 0 || !kubelet_) && dev_wd_ >= 0 && vfio_wd_ >= 0; }
  struct Drained {
    bool kubelet_dir = false;  // anything in the kubelet directory changed
    bool devices = false;      // vfio group nodes, /dev/vfio or /dev/iommu changed
  };
  Drained Drain();

 private:
  int fd_ = -1;
  int kubelet_wd_ = -1, dev_wd_ = -1, vfio_wd_ = -1;
  bool kubelet_ = false;
};

class UdevMonitor {
 public:
  UdevMonitor() = default;
  ~UdevMonitor();
  UdevMonitor(const UdevMonitor&) = delete;
  UdevMonitor& operator=(const UdevMonitor&) = delete;

  absl::Status Open();  // kernel uevents of the pci and mdev subsystems (add, remove, bind, unbind)
  int fd() const;       // -1 when not open
  // True when at least one event arrived; the BDFs (sysnames) of the devices concerned go to `bdfs`.
  bool Drain(std::vector<std::string>* bdfs = nullptr);

 private:
  struct udev* udev_ = nullptr;
  struct udev_monitor* monitor_ = nullptr;
};

class Wakeup {
 public:
  Wakeup();
  ~Wakeup();
  Wakeup(const Wakeup&) = delete;
  Wakeup& operator=(const Wakeup&) = delete;
  int fd() const { return fd_; }
  void Notify();  // async-signal-safe
  void Drain();

 private:
  int fd_ = -1;
};

}  // namespace vfio_agent::node
