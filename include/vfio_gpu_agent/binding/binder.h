// `bind` and `unbind`: move selected functions (whole IOMMU groups) onto their vfio driver and back.
// Groups run in parallel, members of a group in order; every sysfs write has a deadline and a write the
// kernel keeps blocked is abandoned on its thread and reported. Nothing is retried silently: every
// step taken is listed in the device's result.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "vfio_gpu_agent/binding/failure.h"
#include "vfio_gpu_agent/binding/holders.h"
#include "vfio_gpu_agent/common/host_paths.h"
#include "vfio_gpu_agent/pci/selection.h"

namespace vfio_agent::binding {

// Which functions a bind or an unbind touches. Never implied by an empty list: a default Targets touches nothing,
// and "every selected device" is asked for by name, so a caller whose list of BDFs came out empty (a DRA claim of
// vGPUs, a filter that matched nothing) can never move every GPU of the node.
class Targets {
 public:
  Targets() = default;  // nothing
  static Targets EverySelected() {
    Targets targets;
    targets.every_selected_ = true;
    return targets;
  }
  static Targets Devices(std::vector<std::string> bdfs) {
    Targets targets;
    targets.bdfs_ = std::move(bdfs);
    return targets;
  }
  bool every_selected() const { return every_selected_; }
  const std::vector<std::string>& bdfs() const { return bdfs_; }  // with !every_selected()
  bool none() const { return !every_selected_ && bdfs_.empty(); }

 private:
  bool every_selected_ = false;
  std::vector<std::string> bdfs_;
};

struct BinderOptions {
  HostPaths paths;
  pci::SelectionPolicy policy;  // policy.include_nvswitches is the --nvswitches switch
  absl::Duration write_timeout = absl::Seconds(5);
  absl::Duration devnode_wait = absl::Seconds(2);  // for /dev/vfio/<group> to appear after a bind
  bool dry_run = false;
  Targets targets;  // Devices(): their whole IOMMU groups are bound
  int parallelism = 0;            // groups processed at once; 0 = one worker per group
  std::string kernel_release;     // for modules.alias and module loading; "" = uname -r
  // No write starts after it and none waits past it (each waits the earlier of write_timeout and this), nor
  // does the wait for /dev/vfio/<group>: a caller with its own deadline (a DRA Prepare) gets its answer in time.
  absl::Time deadline = absl::InfiniteFuture();
};

struct UnbindOptions {
  HostPaths paths;
  pci::SelectionPolicy policy;
  absl::Duration write_timeout = absl::Seconds(5);
  Targets targets;          // Devices(): just these functions; EverySelected(): every managed function
  std::vector<int> groups;  // IOMMU groups (every member on a vfio driver)
  bool force = false;             // unbind even when /dev/vfio/<group> is open
  int parallelism = 0;
  // Functions to return to a named driver instead of whatever the host reprobes: BDF -> driver, "" = leave it
  // without a driver. Each is a target like those of `targets`. The override is set to that driver (so nothing else can take
  // the function in between), the vfio driver unbound, the function bound to it and verified, and the override
  // cleared again, so a later reprobe is the host's normal one. driver_override is not read with return_to (its
  // read waits on a device lock a blocked write may hold): these functions are always written.
  std::map<std::string, std::string> return_to;
  absl::Time deadline = absl::InfiniteFuture();  // as BinderOptions::deadline
};

enum class Outcome {
  kBound,         // moved to the target driver and verified
  kAlreadyBound,  // was on a vfio driver; no writes
  kWouldBind,     // dry run
  kBlocked,       // not attempted or abandoned: IOMMU group, foreign device, deadline, earlier failure
  kFailed,        // attempted and the device is not on its target
  kRestored,      // unbind: off vfio, reprobed (or on its return_to driver)
  kNotBound,      // unbind: was not on a vfio driver (or already on its return_to driver); nothing to do
  kRefused,       // unbind: the group is open by a process (and no --force)
};
const char* OutcomeName(Outcome outcome);  // "bound", "already bound", ...

struct DeviceResult {
  std::string bdf;
  std::string vendor_device;
  pci::Role role = pci::Role::kGpu;
  std::optional<int> iommu_group;
  std::string driver_before;  // "" = unbound
  std::string target_driver;  // bind: the vfio driver; unbind: the return_to driver, else "" (whatever the host reprobes)
  std::string driver_after;
  Outcome outcome = Outcome::kFailed;
  Failure failure = Failure::kNone;  // bind, with kFailed or kBlocked
  std::string reason;
  std::vector<std::string> steps;  // every sysfs write and its result, in order
  std::vector<Holder> holders;     // who keeps the device busy (bind from nvidia, unbind of an open group)
  absl::Duration elapsed;
};

struct BindReport {
  std::string operation;  // "bind" or "unbind"
  bool dry_run = false;
  std::vector<DeviceResult> devices;  // plan order (group id, then BDF)
  std::vector<std::string> notes;     // host-wide facts: no modules.alias, module loaded, ...
  // bind: every device is on its vfio driver (or would be, for a dry run); unbind: none is left on vfio
  // and none was refused.
  bool ok() const;
};

// Scans, plans and binds. An error status only when nothing could be attempted (sysfs unreadable, a BDF of
// `targets` not selected, no target at all); per-device failures are in the report.
absl::StatusOr<BindReport> Bind(const BinderOptions& options);
absl::StatusOr<BindReport> Unbind(const UnbindOptions& options);

// One line per device plus a summary line.
std::string FormatBindReport(const BindReport& report);
// JSON of report/v1/bind.proto (schema "vfio-gpu-agent.bind/v1").
std::string BindReportToJson(const BindReport& report);

}  // namespace vfio_agent::binding
