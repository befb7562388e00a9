// Test support ("support/holding_process.h"): a real child process that holds a file open until destroyed,
// standing in for a VM on /dev/vfio/<group> or a CUDA application on /dev/nvidia0.
#pragma once

#include <sys/types.h>

#include <filesystem>

namespace vfio_agent::testing {

class HoldingProcess {
 public:
  // Forks a child that opens `path` read-only and waits; aborts the test binary if the child cannot open it.
  explicit HoldingProcess(const std::filesystem::path& path);
  ~HoldingProcess();  // SIGKILL and reap
  HoldingProcess(const HoldingProcess&) = delete;
  HoldingProcess& operator=(const HoldingProcess&) = delete;

  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
};

}  // namespace vfio_agent::testing
