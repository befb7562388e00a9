// The simulated kernel: the PCI core's bind/unbind/probe/remove/rescan rules, driver_override, the fault
// injector and the control commands. Thread-safe; an unbind with an injected delay blocks only its caller.
#pragma once

#include <condition_variable>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/status.h"
#include "node_spec.h"
#include "state.h"
#include "tree.h"

namespace vfio_agent::sim {

class Kernel {
 public:
  // `proc_root`, when given, receives the procfs files of the node (WriteProcFiles) at Start.
  Kernel(NodeSpec node, std::filesystem::path dev_root, std::filesystem::path proc_root = {});

  // Creates the dev tree (and the proc files) for the initial state.
  absl::Status Start();

  std::shared_ptr<const Tree> Snapshot() const;
  std::string LogText() const;

  // A write(2) to a file whose entry has `attr`/`key`. Returns 0 or the errno the kernel would return.
  int Write(Attr attr, const std::string& key, absl::string_view data);

  // A reader opened <dev>/config: a device in D3cold goes to D0 (logged as "wake <BDF>").
  void WakeForConfigRead(const std::string& bdf);

  // Wakes every blocked unbind (they fail with EINTR) and makes later delays immediate.
  void Shutdown();

 private:
  int Bind(const std::string& driver, absl::string_view data);
  int Unbind(std::unique_lock<std::mutex>& lock, const std::string& driver, absl::string_view data);
  int DriversProbe(absl::string_view data);
  int DriverOverride(const std::string& bdf, absl::string_view data);
  int Remove(const std::string& bdf, absl::string_view data);
  int Rescan(absl::string_view data);
  int NewId(const std::string& driver, absl::string_view data, bool add);
  int Control(std::unique_lock<std::mutex>& lock, absl::string_view command);
  int SriovNumvfs(const std::string& bdf, absl::string_view data);
  int EnableVfs(DeviceState& pf, int count);
  int MdevCreate(const std::string& key, absl::string_view data);
  int MdevRemove(const std::string& uuid, absl::string_view data);
  int CurrentVgpuType(const std::string& bdf, absl::string_view data);
  // A process holds <dev_root>/vfio/<group> open (a running VM), found through /proc/<pid>/fd.
  bool GroupOpen(int group) const;
  int LowestFreeVfioIndex(const DeviceState& dev) const;

  bool Matches(const std::string& driver, const DeviceState& dev) const;
  int Probe(const std::string& driver, DeviceState& dev);  // 0 bound, else errno
  void Attach(const std::string& driver, DeviceState& dev);
  void Detach(DeviceState& dev);
  void RemoveDevice(DeviceState& dev);
  void RescanAll();
  void Log(std::string line);
  void Publish();  // rebuilds the snapshot and the dev tree; call after every change

  mutable std::mutex mu_;
  std::condition_variable wake_;
  KernelState state_;
  std::filesystem::path dev_root_;
  std::filesystem::path proc_root_;
  std::shared_ptr<const Tree> snapshot_;
  std::vector<std::string> log_;
  bool shutdown_ = false;
};

}  // namespace vfio_agent::sim
