// Runs the sysfs-sim binary for a test: started on a node file, stopped (and unmounted) on destruction.
//
//   auto sim = vfio_agent::sim::SimProcess::Start(vfio_agent::sim::NodeFile("a10x2-nvidia.json"), tmp_dir);
//   ASSERT_TRUE(sim.ok()) << sim.status();
//   HostPaths paths{.sysfs_root = (*sim)->sysfs_root(), .dev_root = (*sim)->dev_root()};
//   ASSERT_TRUE((*sim)->Control("unbind-delay 0000:3b:00.0 -1").ok());
//   EXPECT_THAT((*sim)->Log(), testing::Contains("bind 0000:3b:00.0 vfio-pci"));
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace vfio_agent::sim {

// The built sysfs-sim binary and the directory of shipped node descriptions (tests/sim/nodes).
std::filesystem::path SysfsSimBinary();
std::filesystem::path NodesDir();
std::filesystem::path NodeFile(absl::string_view name);  // NodesDir() / name

class SimProcess {
 public:
  // Starts `sysfs-sim --node node_file --root root_dir` and waits for its READY line.
  static absl::StatusOr<std::unique_ptr<SimProcess>> Start(
      const std::filesystem::path& node_file, const std::filesystem::path& root_dir,
      std::chrono::milliseconds ready_timeout = std::chrono::seconds(10));

  SimProcess(const SimProcess&) = delete;
  SimProcess& operator=(const SimProcess&) = delete;
  // SIGTERM, wait (5 s, then SIGKILL), and a lazy unmount if the mount is still there.
  ~SimProcess();

  const std::filesystem::path& root() const { return root_; }
  std::filesystem::path sysfs_root() const { return root_ / "sys"; }
  std::filesystem::path dev_root() const { return root_ / "dev"; }
  std::filesystem::path proc_root() const { return root_ / "proc"; }  // cmdline and cpuinfo only
  pid_t pid() const { return pid_; }

  // One command, one write(2) to <root>/sys/.sim/control; the write's errno becomes the status.
  absl::Status Control(absl::string_view command) const;
  // <root>/sys/.sim/log, one entry per line.
  std::vector<std::string> Log() const;

  // Stops the simulator now; returns its exit status (0 on a clean SIGTERM shutdown).
  absl::StatusOr<int> Stop();

 private:
  SimProcess(pid_t pid, std::filesystem::path root) : pid_(pid), root_(std::move(root)) {}

  pid_t pid_;
  std::filesystem::path root_;
};

}  // namespace vfio_agent::sim
