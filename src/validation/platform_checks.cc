// Layer 1: firmware, kernel and modules. Reads sysfs, dev and proc only; no device's config space.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "check_builder.h"
#include "vfio_gpu_agent/common/fs.h"
#include "vfio_gpu_agent/validation/check.h"

namespace vfio_agent::validation {
namespace {

using internal::CheckBuilder;
using internal::IsCharDevice;
using internal::ReadForEvidence;

constexpr Layer kPlatformLayer = Layer::kPlatform;
constexpr uint64_t kEcapInterruptRemapping = 1u << 3;  // VT-d spec, Extended Capability Register bit 3 (IR)

std::vector<std::string> ListOrEmpty(const std::filesystem::path& dir) {
  auto entries = fs::ListDir(dir);
  return entries.ok() ? *std::move(entries) : std::vector<std::string>{};
}

std::string ListText(const std::vector<std::string>& items) {
  return items.empty() ? "(empty)" : absl::StrJoin(items, " ");
}

// Everything the platform checks share: read once.
struct Platform {
  std::filesystem::path groups_dir, units_dir, tables_dir, cmdline_path;
  std::vector<std::string> groups, units;
  std::string table;    // "DMAR", "IVRS" or "" when the firmware exposes neither
  std::string cmdline;  // "" when unreadable
  std::vector<std::string> iommu_args;  // intel_iommu=, amd_iommu=, iommu=, intremap= tokens of the cmdline
  bool amd = false;

  bool Has(std::string_view arg) const {
    return std::find(iommu_args.begin(), iommu_args.end(), arg) != iommu_args.end();
  }
};

Platform ReadPlatform(const HostPaths& paths) {
  Platform p;
  p.groups_dir = paths.IommuGroups();
  p.units_dir = paths.sysfs_root / "class/iommu";
  p.tables_dir = paths.sysfs_root / "firmware/acpi/tables";
  p.cmdline_path = paths.proc_root / "cmdline";
  p.groups = ListOrEmpty(p.groups_dir);
  p.units = ListOrEmpty(p.units_dir);
  for (const char* table : {"DMAR", "IVRS"}) {
    if (fs::Exists(p.tables_dir / table)) p.table = table;
  }
  p.cmdline = fs::ReadTrimmed(p.cmdline_path).value_or("");
  for (absl::string_view token : absl::StrSplit(p.cmdline, ' ', absl::SkipEmpty())) {
    for (const char* key : {"intel_iommu=", "amd_iommu=", "iommu=", "intremap="}) {
      if (absl::StartsWith(token, key)) p.iommu_args.emplace_back(token.data(), token.size());
    }
  }
  if (p.table.empty()) {
    p.amd = absl::StrContains(fs::ReadTrimmed(paths.proc_root / "cpuinfo").value_or(""), "AuthenticAMD");
  } else {
    p.amd = p.table == "IVRS";
  }
  return p;
}

Check IommuEnabled(const Platform& p) {
  CheckBuilder check("iommu.enabled", kPlatformLayer, "node");
  check.Saw(p.groups_dir.string(), absl::StrCat(p.groups.size(), " groups"))
      .Saw(p.units_dir.string(), ListText(p.units))
      .Saw((p.tables_dir / (p.amd ? "IVRS" : "DMAR")).string(), p.table.empty() ? "(absent)" : "present")
      .Saw(p.cmdline_path.string(), p.iommu_args.empty() ? "(no iommu parameters)" : absl::StrJoin(p.iommu_args, " "));
  if (!p.groups.empty()) {
    return check.Pass(absl::StrCat("IOMMU on: ", p.groups.size(), " groups, units ", ListText(p.units)));
  }
  const std::string kernel_args = p.amd ? "amd_iommu=on iommu=pt" : "intel_iommu=on iommu=pt";
  const std::string where = "(GRUB_CMDLINE_LINUX in /etc/default/grub, then update-grub; Talos: "
                            "machine.install.extraKernelArgs) and reboot";
  if (p.table.empty()) {
    return check.Fail(
        absl::StrCat("IOMMU off: no IOMMU groups, and the firmware exposes no ", p.amd ? "IVRS" : "DMAR",
                     " table (the IOMMU is disabled in the BIOS; in a VM, the hypervisor offers no vIOMMU)"),
        absl::StrCat("Enable ", p.amd ? "AMD-Vi / IOMMU (SVM and IOMMU)" : "VT-d (Intel Virtualization for Directed I/O)",
                     " in the BIOS/UEFI setup; then add ", kernel_args, " to the kernel command line ", where));
  }
  const std::string off_arg = p.amd ? "amd_iommu=off" : "intel_iommu=off";
  if (p.Has(off_arg) || p.Has("iommu=off")) {
    return check.Fail(absl::StrCat("IOMMU off: the firmware has a ", p.table, " table but the kernel command line says ",
                                   p.Has(off_arg) ? off_arg : "iommu=off"),
                      absl::StrCat("Replace it with ", kernel_args, " on the kernel command line ", where));
  }
  return check.Fail(absl::StrCat("IOMMU off: the firmware has a ", p.table,
                                 " table but the kernel created no IOMMU groups"),
                    absl::StrCat("Add ", kernel_args, " to the kernel command line ", where));
}

Check InterruptRemapping(const HostPaths& paths, const Platform& p) {
  CheckBuilder check("iommu.interrupt_remapping", kPlatformLayer, "node");
  if (p.groups.empty()) return check.Skip("the IOMMU is off (see iommu.enabled)");
  const std::filesystem::path unsafe_path = paths.sysfs_root / "module/vfio_iommu_type1/parameters/allow_unsafe_interrupts";
  const std::string unsafe_text = ReadForEvidence(unsafe_path);
  const bool unsafe = unsafe_text == "Y" || unsafe_text == "1";
  std::vector<std::string> without_ir;
  int intel_units = 0;
  for (const std::string& unit : p.units) {
    const std::filesystem::path ecap_path = p.units_dir / unit / "intel-iommu/ecap";
    auto ecap_text = fs::ReadTrimmed(ecap_path);
    if (!ecap_text.ok()) continue;
    ++intel_units;
    uint64_t ecap = 0;
    const bool parsed = absl::SimpleHexAtoi(*ecap_text, &ecap);
    const bool ir = parsed && (ecap & kEcapInterruptRemapping) != 0;
    check.Saw(ecap_path.string(), absl::StrCat(*ecap_text, ir ? " (IR bit 3 set)" : " (IR bit 3 clear)"));
    if (!ir) without_ir.push_back(unit);
  }
  check.Saw(unsafe_path.string(), unsafe_text);
  const bool disabled_on_cmdline = p.Has("intremap=off") || p.Has("intremap=no");
  if (disabled_on_cmdline) check.Saw(p.cmdline_path.string(), "intremap=off");
  if (without_ir.empty() && !disabled_on_cmdline) {
    if (intel_units > 0) return check.Pass(absl::StrCat("interrupt remapping on every VT-d unit (", intel_units, ")"));
    return check.Pass(p.amd ? "AMD-Vi remaps interrupts (no VT-d ecap to read)"
                            : "no VT-d unit to read; the IOMMU driver provides interrupt remapping");
  }
  const std::string what = disabled_on_cmdline ? "interrupt remapping is disabled on the kernel command line (intremap=off)"
                                               : absl::StrCat("no interrupt remapping on ", absl::StrJoin(without_ir, " "));
  const std::string bios_fix = absl::StrCat(disabled_on_cmdline ? "Remove intremap=off from the kernel command line; " : "",
                                            "enable x2APIC and interrupt remapping in the BIOS (part of the VT-d setting)");
  if (unsafe) {
    return check.Warn(absl::StrCat(what, "; VFIO works only because allow_unsafe_interrupts=Y (a guest can forge MSIs)"),
                      absl::StrCat(bios_fix, ", then drop the vfio_iommu_type1 allow_unsafe_interrupts option"));
  }
  return check.Fail(
      absl::StrCat(what, ": vfio_iommu_type1 refuses to attach groups (\"No interrupt remapping support\", EPERM)"),
      absl::StrCat(bios_fix, ". Trusted single-tenant hosts only: options vfio_iommu_type1 allow_unsafe_interrupts=1"));
}

Check VfioModules(const HostPaths& paths) {
  CheckBuilder check("vfio.modules", kPlatformLayer, "node");
  const std::filesystem::path modules = paths.sysfs_root / "module";
  std::vector<std::string> missing;
  auto loaded = [&](const std::string& name) {
    const bool present = fs::Exists(modules / name);
    check.Saw((modules / name).string(), present ? "loaded" : "(absent)");
    return present;
  };
  if (!loaded("vfio")) missing.push_back("vfio");
  // Built-in vfio-pci shows as the driver directory.
  if (!loaded("vfio_pci") && !fs::Exists(paths.PciDriver("vfio-pci"))) missing.push_back("vfio_pci");
  // iommufd's compat container replaces vfio_iommu_type1 on kernels built that way.
  if (!loaded("vfio_iommu_type1") && !fs::Exists(modules / "iommufd")) missing.push_back("vfio_iommu_type1");
  if (missing.empty()) return check.Pass("vfio, vfio_pci and an IOMMU backend are loaded");
  return check.Fail(
      absl::StrCat("not loaded: ", absl::StrJoin(missing, ", ")),
      absl::StrCat("modprobe -a vfio vfio_pci vfio_iommu_type1, and load them at boot: /etc/modules-load.d/vfio.conf "
                   "(Talos: machine.kernel.modules: vfio_pci, vfio_iommu_type1)"));
}

Check ContainerNode(const HostPaths& paths) {
  CheckBuilder check("vfio.container_node", kPlatformLayer, "node");
  const std::filesystem::path node = paths.VfioDir() / "vfio";
  const bool exists = fs::Exists(node);
  const bool chr = IsCharDevice(node);
  check.Saw(node.string(), chr ? "character device" : exists ? "not a character device" : "(absent)");
  if (chr) return check.Pass(absl::StrCat(node.string(), " is a character device"));
  const std::string fix = absl::StrCat(
      "modprobe vfio; in a container mount the host's /dev (hostPath /dev) so that ", node.string(),
      " is the kernel's node");
  if (exists) return check.Fail(absl::StrCat(node.string(), " exists but is not a character device"), fix);
  return check.Fail(absl::StrCat(node.string(), " is missing: VMs cannot open VFIO containers"), fix);
}

Check Iommufd(const HostPaths& paths) {
  CheckBuilder check("iommufd", kPlatformLayer, "node");
  const std::filesystem::path node = paths.dev_root / "iommu";
  const bool exists = fs::Exists(node);
  check.Saw(node.string(), IsCharDevice(node) ? "character device" : exists ? "not a character device" : "(absent)");
  if (!exists) return check.Pass("no /dev/iommu: VMs use the VFIO container and group nodes");
  if (!IsCharDevice(node)) {
    return check.Fail(absl::StrCat(node.string(), " exists but is not a character device"),
                      "Mount the host's /dev in the agent's container; remove the stray file");
  }
  return check.Pass("iommufd available: Allocate also hands out /dev/iommu and /dev/vfio/devices/vfioN");
}

Check Lockdown(const HostPaths& paths) {
  CheckBuilder check("kernel.lockdown", kPlatformLayer, "node");
  const std::filesystem::path path = paths.sysfs_root / "kernel/security/lockdown";
  auto text = fs::ReadTrimmed(path);
  check.Saw(path.string(), text.ok() ? *text : "(absent)");
  if (!text.ok()) return check.Pass("no lockdown LSM");
  std::string mode = "none";
  if (auto open = text->find('['); open != std::string::npos) {
    mode = text->substr(open + 1, text->find(']', open) - open - 1);
  }
  if (mode == "none") return check.Pass("lockdown: none");
  return check.Pass(absl::StrCat("lockdown: ", mode,
                                 " (Secure Boot): VFIO is unaffected; host NVIDIA modules, e.g. for Fabric Manager, "
                                 "must be signed"));
}

// Noted, not judged: which GPU is on which driver is device.driver's call. nouveau and nvidiafb are worth a
// warning on a passthrough node though: they take GPUs at boot (and nvidiafb the console) before anyone binds.
Check HostDrivers(const NodeView& node) {
  CheckBuilder check("host_drivers", kPlatformLayer, "node");
  std::vector<std::string> loaded, boot_grabbers;
  for (const char* module : {"nvidia", "nouveau", "nvidiafb"}) {
    if (!fs::Exists(node.paths.sysfs_root / "module" / module)) continue;
    loaded.push_back(module);
    if (std::string_view(module) != "nvidia") boot_grabbers.push_back(module);
  }
  check.Saw((node.paths.sysfs_root / "module/{nvidia,nouveau,nvidiafb}").string(), ListText(loaded));
  std::vector<std::string> owned;
  std::vector<std::string> passable = node.selection->gpus;
  passable.insert(passable.end(), node.selection->companions.begin(), node.selection->companions.end());
  for (const std::string& bdf : passable) {
    const pci::Function* fn = node.inventory->Find(bdf);
    if (fn != nullptr && std::find(loaded.begin(), loaded.end(), fn->driver) != loaded.end()) {
      owned.push_back(absl::StrCat(bdf, " (", fn->driver, ")"));
    }
  }
  if (!owned.empty()) check.Saw("driver links of the selected functions", absl::StrJoin(owned, " "));
  const std::string owns = owned.empty() ? "they own no selected function"
                                         : absl::StrCat("they own ", absl::StrJoin(owned, ", "), " (see device.driver)");
  if (loaded.empty()) return check.Pass("no host GPU driver loaded (nvidia, nouveau, nvidiafb)");
  if (boot_grabbers.empty()) return check.Pass(absl::StrCat("loaded: ", absl::StrJoin(loaded, " "), "; ", owns));
  return check.Warn(absl::StrCat("loaded: ", absl::StrJoin(loaded, " "), "; ", absl::StrJoin(boot_grabbers, " and "),
                                 " take GPUs at boot before vfio-pci can; ", owns),
                    "Blacklist them on passthrough nodes: /etc/modprobe.d/vfio-gpu.conf with `blacklist nouveau`, "
                    "`blacklist nvidiafb`, `options nouveau modeset=0`, then rebuild the initramfs and reboot");
}

}  // namespace

std::vector<Check> PlatformChecks(const NodeView& node) {
  const Platform platform = ReadPlatform(node.paths);
  return {IommuEnabled(platform),   InterruptRemapping(node.paths, platform), VfioModules(node.paths),
          ContainerNode(node.paths), Iommufd(node.paths),                      Lockdown(node.paths),
          HostDrivers(node)};
}

}  // namespace vfio_agent::validation
