#include <charconv>
#include <iostream>

#include "vfio_gpu_agent/cli/commands.h"
#include "vfio_gpu_agent/plugin/agent.h"

namespace vfio_agent::cli {

std::vector<FlagSpec> ServeFlags() {
  return {
      {"kubelet-socket", "PATH", "the kubelet's registration socket", "<kubelet-dir>/kubelet.sock"},
      {"rescan-interval", "MS", "safety-net rescan of sysfs, in milliseconds", "60000"},
      {"udev", "", "watch udev PCI events (--no-udev on a simulated sysfs)", "on"},
      {"cdi", "", "also return CDI device names and write CDI specs", "off"},
      {"cdi-dir", "DIR", "where CDI specs are written", "/var/run/cdi"},
  };
}

absl::StatusOr<plugin::ServeOptions> ServeOptionsFromFlags(const ParsedCommand& cmd,
                                                           const names::PciIdsDatabase* db) {
  plugin::ServeOptions options;
  options.paths = cmd.common.paths;
  options.policy = cmd.common.policy;
  options.domain = cmd.common.resource_domain;
  options.overrides = cmd.common.name_overrides;
  options.pci_ids = db;
  options.kubelet_socket = cmd.flags.Get("kubelet-socket");
  std::string interval = cmd.flags.Get("rescan-interval", "60000");
  int ms = 0;
  auto [ptr, ec] = std::from_chars(interval.data(), interval.data() + interval.size(), ms);
  if (ec != std::errc() || ptr != interval.data() + interval.size() || ms < 10) {
    return absl::InvalidArgumentError("--rescan-interval must be a whole number of milliseconds, at least 10");
  }
  options.rescan_interval = std::chrono::milliseconds(ms);
  options.udev = cmd.flags.Get("udev", "true") == "true";
  options.cdi = cmd.flags.GetBool("cdi");
  options.cdi_dir = cmd.flags.Get("cdi-dir", "/var/run/cdi");
  return options;
}

int RunServe(const std::vector<std::string>& args, std::ostream& out) {
  ParsedCommand cmd;
  if (auto exit = ParseCommand("serve",
                               "Advertises every vfio-bound GPU to the kubelet (Device Plugin API v1beta1), one resource\n"
                               "per name, and keeps the device list live. Runs until SIGTERM; never unbinds anything.",
                               ServeFlags(), args, out, &cmd)) {
    return *exit;
  }
  auto db = LazyNameDatabase(cmd.common);
  auto options = ServeOptionsFromFlags(cmd, db.get());
  if (!options.ok()) {
    std::cerr << "vfio-gpu-agent serve: " << options.status().message() << "\n";
    return kExitUsage;
  }
  if (auto status = plugin::Serve(*options); !status.ok()) {
    std::cerr << "vfio-gpu-agent serve: " << status.message() << "\n";
    return kExitError;
  }
  return kExitOk;
}

}  // namespace vfio_agent::cli
