#include "vfio_gpu_agent/cli/common_options.h"

#include <cstdlib>

#include <charconv>

#include "absl/strings/str_cat.h"

namespace vfio_agent::cli {

std::vector<FlagSpec> CommonFlagSpecs() {
  return {
      {"sysfs-root", "DIR", "root of sysfs", "/sys"},
      {"dev-root", "DIR", "root of the device tree (vfio nodes)", "/dev"},
      {"proc-root", "DIR", "root of procfs (to find processes holding devices)", "/proc"},
      {"kubelet-dir", "DIR", "kubelet device-plugin directory", "/var/lib/kubelet/device-plugins"},
      {"modules-root", "DIR", "kernel modules tree (modules.alias, module loading)", "/lib/modules"},
      {"pci-ids", "FILE", "pci.ids database", "first of /usr/share/misc/pci.ids, /usr/share/hwdata/pci.ids, ..."},
      {"vendor", "HEX", "PCI vendor id to manage", "10de"},
      {"classes", "LIST", "comma-separated hex PCI class prefixes to manage", "0300,0302"},
      {"nvswitches", "", "also manage NVSwitch functions (class 0680)", "off"},
      {"workload", "MODE",
       "vm-passthrough (whole GPUs on vfio-pci) or vm-vgpu (mdev or SR-IOV vGPUs; nothing is bound)",
       "vm-passthrough"},
      {"resource-domain", "DOMAIN", "domain of the extended resource names", "nvidia.com"},
      {"resource-name", "VID:DID=NAME", "resource name override for a device id", "", true},
      {"resource-name-file", "FILE", "file of VID:DID=NAME lines, one override per line", ""},
      {"json", "", "print the report as JSON", "off"},
      {"log-level", "LEVEL", "trace, debug, info, warn or error", "info"},
  };
}

absl::StatusOr<CommonOptions> CommonOptionsFromFlags(const FlagValues& flags) {
  CommonOptions options;
  options.paths.sysfs_root = flags.Get("sysfs-root", "/sys");
  options.paths.dev_root = flags.Get("dev-root", "/dev");
  options.paths.proc_root = flags.Get("proc-root", "/proc");
  options.paths.kubelet_dir = flags.Get("kubelet-dir", "/var/lib/kubelet/device-plugins");
  options.paths.modules_root = flags.Get("modules-root", "/lib/modules");
  options.pci_ids = flags.Get("pci-ids");
  if (flags.Has("pci-ids")) {
    absl::StatusOr<std::unique_ptr<names::PciIdsDatabase>> db = names::LoadPciIds(options.pci_ids);
    if (!db.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--pci-ids ", options.pci_ids.string(), ": ", db.status().message()));
    }
    options.named_pci_ids = *std::move(db);
  }

  std::string vendor = flags.Get("vendor", "10de");
  std::string_view v = vendor;
  if (v.starts_with("0x")) v.remove_prefix(2);
  unsigned vendor_id = 0;
  auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), vendor_id, 16);
  if (v.empty() || v.size() > 4 || ec != std::errc() || ptr != v.data() + v.size()) {
    return absl::InvalidArgumentError(absl::StrCat("--vendor \"", vendor, "\" is not a 4-digit hex PCI vendor id"));
  }
  options.policy.vendor_id = static_cast<uint16_t>(vendor_id);
  if (flags.Has("classes")) {
    auto classes = pci::ParseClassPrefixes(flags.Get("classes"));
    if (!classes.ok()) return classes.status();
    options.policy.classes = *std::move(classes);
  }
  options.policy.include_nvswitches = flags.GetBool("nvswitches");

  absl::StatusOr<Workload> workload = ParseWorkload(flags.Get("workload", "vm-passthrough"));
  if (!workload.ok()) return absl::InvalidArgumentError(absl::StrCat("--workload: ", workload.status().message()));
  options.workload = *workload;

  options.resource_domain = flags.Get("resource-domain", "nvidia.com");
  if (absl::Status domain = names::ValidateResourceDomain(options.resource_domain); !domain.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--resource-domain: ", domain.message()));
  }
  if (flags.Has("resource-name-file")) {
    auto overrides = names::LoadOverrideFile(flags.Get("resource-name-file"));
    if (!overrides.ok()) return overrides.status();
    options.name_overrides = *std::move(overrides);
  }
  // Command-line overrides come after the file so that they win.
  for (const auto& text : flags.All("resource-name")) {
    auto parsed = names::ParseOverride(text);
    if (!parsed.ok()) return parsed.status();
    options.name_overrides.push_back(*std::move(parsed));
  }
  options.json = flags.GetBool("json");
  options.log_level = flags.Get("log-level", "info");
  return options;
}

absl::StatusOr<std::string> NodeName(const FlagValues& flags) {
  std::string name = flags.Get("node-name");
  if (name.empty()) {
    if (const char* downward = std::getenv("NODE_NAME"); downward != nullptr) name = downward;
  }
  if (name.empty()) return absl::NotFoundError("no node name: set NODE_NAME (the downward API) or --node-name");
  return name;
}

std::shared_ptr<names::PciIdsDatabase> LoadNameDatabase(const CommonOptions& options) {
  if (options.named_pci_ids) return options.named_pci_ids;
  return names::LoadPciIdsOrWarn({});
}

std::shared_ptr<names::PciIdsDatabase> LazyNameDatabase(const CommonOptions& options) {
  if (options.named_pci_ids) return options.named_pci_ids;
  return names::LazyPciIds({});
}

}  // namespace vfio_agent::cli
