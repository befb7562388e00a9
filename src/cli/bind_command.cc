#include <charconv>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "vfio_gpu_agent/binding/binder.h"
#include "vfio_gpu_agent/cli/commands.h"
#include "vfio_gpu_agent/cli/inspect.h"
#include "vfio_gpu_agent/pci/inventory.h"

namespace vfio_agent::cli {
namespace {

std::vector<FlagSpec> UnbindFlagSpecs() {
  return {
      {"device", "BDF", "give back only this function", "", true},
      {"group", "N", "give back every vfio-bound member of this IOMMU group", "", true},
      {"all", "", "give back every selected function on a vfio driver", "off"},
      {"force", "", "unbind even when a process (a running VM) holds /dev/vfio/<group>", "off"},
      {"write-timeout", "DURATION", "deadline of each sysfs write", "5s"},
  };
}

absl::StatusOr<absl::Duration> DurationFlag(const FlagValues& flags, std::string_view name, std::string_view fallback) {
  std::string text = flags.Get(name, fallback);
  absl::Duration d;
  if (!absl::ParseDuration(text, &d) || d <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("--", std::string(name), " \"", text, "\" is not a positive duration (e.g. 5s, 500ms)"));
  }
  return d;
}

absl::StatusOr<std::vector<std::string>> BdfFlags(const FlagValues& flags) {
  std::vector<std::string> bdfs;
  for (const auto& text : flags.All("device")) {
    auto bdf = pci::CanonicalBdf(text);
    if (!bdf.ok()) return bdf.status();
    bdfs.push_back(*bdf);
  }
  return bdfs;
}

absl::StatusOr<int> IntFlag(const FlagValues& flags, std::string_view name, std::string_view fallback) {
  std::string text = flags.Get(name, fallback);
  int value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() || value < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--", std::string(name), " \"", text, "\" is not a non-negative integer"));
  }
  return value;
}

int PrintReport(const absl::StatusOr<binding::BindReport>& report, const CommonOptions& common, std::string_view name,
                std::ostream& out) {
  if (!report.ok()) {
    std::cerr << "vfio-gpu-agent " << name << ": " << report.status().message() << "\n";
    return kExitError;
  }
  out << (common.json ? binding::BindReportToJson(*report) : binding::FormatBindReport(*report));
  return report->ok() ? kExitOk : kExitNotReady;
}

// --workload vm-vgpu: the GPUs belong to nvidia, the vGPU manager; moving one to vfio-pci would take its vGPUs off
// it. Nothing is written: the answer is what the node serves instead (exit 0, so a script running `bind` on every
// node in its own mode goes on).
int BindNothingOnVgpuNode(const ParsedCommand& cmd, std::ostream& out) {
  auto db = LoadNameDatabase(cmd.common);
  auto report = BuildInspectReport(cmd.common, db.get(), VgpuCatalogFile(cmd.flags));
  if (!report.ok()) {
    std::cerr << "vfio-gpu-agent bind: " << report.status().message() << "\n";
    return kExitError;
  }
  if (cmd.common.json) {
    out << FormatInspectJson(*report);
    return kExitOk;
  }
  out << "bind: nothing to bind on a vm-vgpu node: every GPU stays on nvidia, the vGPU manager (binding one to "
         "vfio-pci would take its vGPUs away); nothing was written\n"
      << FormatVgpusText(*report) << "\n" << report->summary() << "\n";
  return kExitOk;
}

int Usage(std::string_view name, const absl::Status& status) {
  std::cerr << "vfio-gpu-agent " << name << ": " << status.message() << "\n";
  return kExitUsage;
}

}  // namespace

std::vector<FlagSpec> BindFlags() {
  return {
      {"dry-run", "", "print the plan, write nothing", "off"},
      {"device", "BDF", "bind only this function's IOMMU group", "every selected device", true},
      {"write-timeout", "DURATION", "deadline of each sysfs write (e.g. 5s, 500ms)", "5s"},
      {"devnode-wait", "DURATION", "how long to wait for /dev/vfio/<group> after a bind", "2s"},
      {"parallelism", "N", "IOMMU groups handled at once (0 = all)", "0"},
      {"kernel-release", "RELEASE", "kernel release for modules.alias and module loading", "uname -r"},
      {kStateDirFlag, "DIR",
       "--workload vm-vgpu: the agent's state dir, whose vgpu-catalog.txt names the vGPUs listed (read only)",
       "/var/lib/vfio-gpu-agent"},
  };
}

absl::StatusOr<binding::BinderOptions> BinderOptionsFromFlags(const ParsedCommand& cmd) {
  binding::BinderOptions options;
  options.paths = cmd.common.paths;
  options.policy = cmd.common.policy;
  options.dry_run = cmd.flags.GetBool("dry-run");
  auto timeout = DurationFlag(cmd.flags, "write-timeout", "5s");
  if (!timeout.ok()) return timeout.status();
  options.write_timeout = *timeout;
  auto wait = DurationFlag(cmd.flags, "devnode-wait", "2s");
  if (!wait.ok()) return wait.status();
  options.devnode_wait = *wait;
  auto bdfs = BdfFlags(cmd.flags);
  if (!bdfs.ok()) return bdfs.status();
  options.targets = bdfs->empty() ? binding::Targets::EverySelected() : binding::Targets::Devices(*std::move(bdfs));
  auto parallelism = IntFlag(cmd.flags, "parallelism", "0");
  if (!parallelism.ok()) return parallelism.status();
  options.parallelism = *parallelism;
  options.kernel_release = cmd.flags.Get("kernel-release");
  return options;
}

int RunBind(const std::vector<std::string>& args, std::ostream& out) {
  ParsedCommand cmd;
  if (auto exit = ParseCommand("bind",
                               "Moves every selected GPU, with every NVIDIA function of its IOMMU group, to vfio-pci (or\n"
                               "the device's vfio variant driver) and verifies it. Devices already on vfio are left\n"
                               "untouched. Exit 0 when every selected device ends on its vfio driver, 1 otherwise.\n"
                               "With --workload vm-vgpu it binds nothing (the GPUs stay on nvidia, the vGPU manager):\n"
                               "it says so, lists the vGPUs the node serves and exits 0.",
                               BindFlags(), args, out, &cmd)) {
    return *exit;
  }
  if (cmd.common.workload == Workload::kVmVgpu) return BindNothingOnVgpuNode(cmd, out);
  auto options = BinderOptionsFromFlags(cmd);
  if (!options.ok()) return Usage("bind", options.status());
  return PrintReport(binding::Bind(*options), cmd.common, "bind", out);
}

int RunUnbind(const std::vector<std::string>& args, std::ostream& out) {
  ParsedCommand cmd;
  if (auto exit = ParseCommand("unbind",
                               "Gives functions back to their host driver: clears driver_override, unbinds from vfio and\n"
                               "reprobes. Only when asked: name --device, --group or --all. Refuses a group a process\n"
                               "(a running VM) holds open, naming it, unless --force.",
                               UnbindFlagSpecs(), args, out, &cmd)) {
    return *exit;
  }
  binding::UnbindOptions options;
  options.paths = cmd.common.paths;
  options.policy = cmd.common.policy;
  options.force = cmd.flags.GetBool("force");
  auto timeout = DurationFlag(cmd.flags, "write-timeout", "5s");
  if (!timeout.ok()) return Usage("unbind", timeout.status());
  options.write_timeout = *timeout;
  auto bdfs = BdfFlags(cmd.flags);
  if (!bdfs.ok()) return Usage("unbind", bdfs.status());
  for (const auto& text : cmd.flags.All("group")) {
    int group = 0;
    auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), group);
    if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() || group < 0) {
      return Usage("unbind", absl::InvalidArgumentError(absl::StrCat("--group \"", text, "\" is not a group number")));
    }
    options.groups.push_back(group);
  }
  const bool all = cmd.flags.GetBool("all");
  if (bdfs->empty() && options.groups.empty() && !all) {
    return Usage("unbind", absl::InvalidArgumentError("name what to give back: --device BDF, --group N or --all"));
  }
  // --device and --group narrow --all, as they always did.
  const bool every = all && bdfs->empty() && options.groups.empty();
  options.targets = every ? binding::Targets::EverySelected() : binding::Targets::Devices(*std::move(bdfs));
  return PrintReport(binding::Unbind(options), cmd.common, "unbind", out);
}

}  // namespace vfio_agent::cli
