// Serves a Kernel's sysfs snapshot through the FUSE low-level API.
#pragma once

#define FUSE_USE_VERSION 314
#include <fuse3/fuse_lowlevel.h>

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernel.h"

namespace vfio_agent::sim {

// Per-open state (file content snapshot, directory listing).
struct Handle {
  virtual ~Handle() = default;
};

class FuseFs {
 public:
  explicit FuseFs(Kernel& kernel);

  static const fuse_lowlevel_ops& Ops();

  Kernel& kernel() { return kernel_; }
  // Inode numbers are per path and never reused, so the kernel's dentry cache can not mix up a removed
  // device with its rescanned successor.
  fuse_ino_t Inode(const std::string& path);
  bool PathOf(fuse_ino_t ino, std::string& path);
  struct stat Stat(const Entry& entry, fuse_ino_t ino) const;

  // Open handles are owned here, not by the kernel: RELEASE is asynchronous and may never arrive when
  // the sim stops.
  uint64_t Adopt(std::unique_ptr<Handle> handle);
  void Drop(uint64_t fh);

 private:
  Kernel& kernel_;
  std::mutex mu_;
  std::unordered_map<std::string, fuse_ino_t> inodes_;
  std::vector<std::string> paths_;  // index = inode number
  std::unordered_map<uint64_t, std::unique_ptr<Handle>> handles_;
  struct timespec started_{};
};

}  // namespace vfio_agent::sim
