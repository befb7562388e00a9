#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "vfio_gpu_agent/cli/commands.h"
#include "vfio_gpu_agent/common/fs.h"
#include "vfio_gpu_agent/validation/validate.h"

namespace vfio_agent::cli {

std::vector<FlagSpec> ValidateFlags() {
  return {
      {"status-dir", "DIR", "write the GPU Operator's status files (workload-type, vfio-pci-ready) there", ""},
      {"kubevirt-cr", "FILE", "KubeVirt CR as YAML or JSON (e.g. `kubectl get kubevirt -A -o yaml`)", ""},
      {"pod-resources-socket", "PATH", "the kubelet's pod-resources socket",
       "/var/lib/kubelet/pod-resources/kubelet.sock"},
      {"layers", "LIST", "comma-separated: platform, devices, plugin, kubelet, kubevirt, or all", "all"},
      {"rpc-timeout", "MS", "bound on each plugin and pod-resources exchange, in milliseconds", "2000"},
  };
}

int RunValidate(const std::vector<std::string>& args, std::ostream& out) {
  ParsedCommand cmd;
  if (auto exit = ParseCommand(
          "validate",
          "Checks every link of the GPU passthrough chain: platform (IOMMU, interrupt remapping, vfio), devices (driver,\n"
          "IOMMU group, BARs, power, reset, SR-IOV, NVSwitch, MMIO window), plugin sockets, the kubelet's view and the\n"
          "KubeVirt CR; names the evidence and the fix of each broken link. Read-only except --status-dir.\n"
          "Exit 0 when no check failed (warnings allowed), 1 when one did, 2 usage, 3 the host could not be read.",
          ValidateFlags(), args, out, &cmd)) {
    return *exit;
  }
  auto usage = [](absl::string_view message) {
    std::cerr << "vfio-gpu-agent validate: " << message << "\n";
    return kExitUsage;
  };
  validation::ValidateOptions options;
  options.paths = cmd.common.paths;
  options.paths.pod_resources_socket = cmd.flags.Get("pod-resources-socket", options.paths.pod_resources_socket.string());
  options.policy = cmd.common.policy;
  options.resource_domain = cmd.common.resource_domain;
  options.name_overrides = cmd.common.name_overrides;
  auto layers = validation::ParseLayers(cmd.flags.Get("layers", "all"));
  if (!layers.ok()) return usage(absl::StrCat("--layers: ", layers.status().message()));
  options.layers = *layers;
  if (cmd.flags.Has("status-dir")) options.status_dir = cmd.flags.Get("status-dir");
  const std::string timeout = cmd.flags.Get("rpc-timeout", "2000");
  int ms = 0;
  if (!absl::SimpleAtoi(timeout, &ms) || ms <= 0) return usage("--rpc-timeout must be a positive number of milliseconds");
  options.rpc_wait = std::chrono::milliseconds(ms);
  if (cmd.flags.Has("kubevirt-cr")) {
    auto text = fs::ReadTrimmed(cmd.flags.Get("kubevirt-cr"));
    if (!text.ok()) return usage(absl::StrCat("--kubevirt-cr: ", text.status().message()));
    options.kubevirt_cr = *std::move(text);
  }
  // Names come from pinned entries and overrides first; pci.ids is parsed only if a GPU needs it.
  auto db = LazyNameDatabase(cmd.common);
  options.pci_ids = db.get();
  auto report = validation::Validate(options);
  if (!report.ok()) {
    if (absl::IsInvalidArgument(report.status())) return usage(report.status().message());
    std::cerr << "vfio-gpu-agent validate: " << report.status().message() << "\n";
    return kExitError;
  }
  out << (cmd.common.json ? validation::FormatValidateJson(*report) : validation::FormatValidateText(*report));
  return report->ok() ? kExitOk : kExitNotReady;
}

}  // namespace vfio_agent::cli
