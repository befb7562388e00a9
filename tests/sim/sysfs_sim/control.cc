// The control file: what an external actor (the admin, a hot-unplug, a stuck driver) does to the node while
// the code under test runs. Not recorded in the sim log, which shows only writes to kernel attributes.
#include <algorithm>
#include <cerrno>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "kernel.h"

namespace vfio_agent::sim {

int Kernel::Control(std::unique_lock<std::mutex>& /*lock*/, absl::string_view command) {
  std::vector<std::string> args = absl::StrSplit(command, absl::ByAnyChar(" \t\n"), absl::SkipEmpty());
  if (args.empty()) return EINVAL;
  const std::string& verb = args[0];
  if (verb == "rescan" && args.size() == 1) {
    RescanAll();
    return 0;
  }
  if (verb == "log-drop" && args.size() == 2) {
    size_t lines = 0;
    if (!absl::SimpleAtoi(args[1], &lines)) return EINVAL;
    log_.erase(log_.begin(), log_.begin() + static_cast<std::ptrdiff_t>(std::min(lines, log_.size())));
    return 0;
  }
  if (args.size() < 2) return EINVAL;
  DeviceState* dev = state_.Find(args[1]);
  if (!dev) return EINVAL;
  if (verb == "release" && args.size() == 2) {
    ++dev->releases;
    wake_.notify_all();
    return 0;
  }
  if (verb == "remove" && args.size() == 2) {
    if (!dev->present) return EINVAL;
    RemoveDevice(*dev);
    return 0;
  }
  if (args.size() != 3) return EINVAL;
  const std::string& value = args[2];
  if (verb == "unbind-delay") {
    int ms = 0;
    if (!absl::SimpleAtoi(value, &ms) || ms < -1) return EINVAL;
    dev->unbind_delay_ms = ms;
    return 0;
  }
  if (verb == "bind-errno") {
    auto err = ErrnoFromName(value);
    if (!err) return EINVAL;
    dev->bind_errno = *err;
    return 0;
  }
  if (verb == "power-state" && (value == "D0" || value == "D3hot" || value == "D3cold")) {
    dev->power_state = value;
    return 0;
  }
  if (verb == "dead" && (value == "0" || value == "1")) {
    dev->dead = value == "1";
    return 0;
  }
  if (verb == "set-driver") {
    if (!dev->present) return EINVAL;
    if (value == "none") {
      Detach(*dev);
      return 0;
    }
    if (!state_.HasDriver(value)) return EINVAL;
    if (IsVfioDriver(value) && (!state_.iommu || dev->spec.iommu_group < 0)) return EINVAL;
    Detach(*dev);
    Attach(value, *dev);
    wake_.notify_all();
    return 0;
  }
  return EINVAL;
}

}  // namespace vfio_agent::sim
