// Layer 2: every selected function and every IOMMU group holding one. Reads sysfs attributes that never wake a
// device; config space (the vendor id) only of functions whose power_state is known and not D3cold.
#include <algorithm>
#include <cstdio>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "check_builder.h"
#include "vfio_gpu_agent/binding/holders.h"
#include "vfio_gpu_agent/common/fs.h"
#include "vfio_gpu_agent/pci/vfio_health.h"
#include "vfio_gpu_agent/validation/check.h"

namespace vfio_agent::validation {
namespace {

using internal::CheckBuilder;
using internal::IsCharDevice;
using internal::ReadForEvidence;

constexpr Layer kDeviceLayer = Layer::kDevices;
constexpr uint64_t kResourceMem64 = 0x00100000;  // IORESOURCE_MEM_64
constexpr uint64_t kGiB = uint64_t{1} << 30;
// OVMF's fixed 64-bit PCI MMIO window before it was sized from the guest's physical address bits.
constexpr uint64_t kClassicOvmfWindow = 32 * kGiB;

struct Bar {
  int index = 0;
  uint64_t start = 0, size = 0, flags = 0;
};

// BARs 0-5 from `resource` ("start end flags" per line, hex); lines with no size are absent BARs.
std::vector<Bar> ReadBars(const std::filesystem::path& resource) {
  std::vector<Bar> bars;
  auto text = fs::ReadTrimmed(resource);
  if (!text.ok()) return bars;
  int index = 0;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    if (index > 5) break;
    std::vector<absl::string_view> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
    uint64_t start = 0, end = 0, flags = 0;
    if (fields.size() == 3 && absl::SimpleHexAtoi(fields[0], &start) && absl::SimpleHexAtoi(fields[1], &end) &&
        absl::SimpleHexAtoi(fields[2], &flags) && flags != 0 && end > start) {
      bars.push_back({index, start, end - start + 1, flags});
    }
    ++index;
  }
  return bars;
}

std::string Size(uint64_t bytes) {
  if (bytes >= kGiB) return absl::StrFormat("%g GiB", static_cast<double>(bytes) / kGiB);
  return absl::StrFormat("%g MiB", static_cast<double>(bytes) / (1 << 20));
}

bool IsBridgeByHeader(const pci::Function& fn) {
  const int type = fn.header_type & 0x7f;
  return type == 1 || type == 2;
}

std::string Describe(const pci::Function& fn) {
  return absl::StrCat(fn.bdf, " ", fn.VendorDevice(), " class ", fn.ClassHex(), " on ",
                      fn.driver.empty() ? "(no driver)" : fn.driver);
}

bool BindOnPrepare(const NodeView& node) { return node.bind_on_prepare != nullptr; }

// --bind-on-prepare: the prepared claim (checkpoint) holding any of `bdfs`, which make up one IOMMU group: a claim
// holds its devices' whole groups. "" when none does, or when the checkpoint could not be read (device.claims).
std::string ClaimHolding(const NodeView& node, const std::vector<pci::Member>& group, const std::string& bdf) {
  if (!BindOnPrepare(node) || !node.bind_on_prepare->ok()) return "";
  for (const dra::CheckpointedClaim& claim : (*node.bind_on_prepare)->claims) {
    for (const std::string& held : claim.bdfs) {
      if (held == bdf || std::any_of(group.begin(), group.end(), [&](const pci::Member& m) { return m.bdf == held; })) {
        return claim.ref;
      }
    }
  }
  return "";
}

std::string ClaimHolding(const NodeView& node, const pci::Function& fn) {
  const pci::GroupAssessment* group = node.selection->GroupOf(fn);
  return ClaimHolding(node, group != nullptr ? group->members : std::vector<pci::Member>{}, fn.bdf);
}

// --bind-on-prepare: which claims the checkpoint holds, i.e. which groups layer 2 wants on a vfio driver.
Check PreparedClaims(const NodeView& node) {
  const absl::StatusOr<dra::CheckpointRead>& read = *node.bind_on_prepare;
  CheckBuilder check("device.claims", kDeviceLayer, "node");
  if (!read.ok()) {
    check.Saw("the DRA driver's checkpoint", std::string(read.status().message()));
    return check.Warn("the checkpoint of prepared claims cannot be read: a GPU a claim holds but that left vfio-pci "
                      "is not found",
                      "give validate the agent's --kubelet-plugins-dir, --dra-driver-name and --proc-root");
  }
  std::vector<std::string> held;
  for (const dra::CheckpointedClaim& claim : read->claims) {
    held.push_back(absl::StrCat(claim.ref, ": ", absl::StrJoin(claim.bdfs, ",")));
  }
  check.Saw(read->dir.string(), held.empty() ? "no prepared claim" : absl::StrJoin(held, "; "));
  if (!read->other_boot.empty()) {
    check.Saw("of another boot (the agent discards them at its start)", absl::StrJoin(read->other_boot, ","));
  }
  const std::string message = absl::StrCat(
      "--bind-on-prepare: ", read->claims.size(),
      " prepared claim(s); only their IOMMU groups belong on vfio-pci, the other GPUs stay on their host drivers "
      "until a claim's Prepare binds them");
  if (!read->unreadable.empty()) {
    check.Saw("unreadable", absl::StrJoin(read->unreadable, "; "));
    return check.Warn(absl::StrCat(message, "; ", read->unreadable.size(), " checkpoint file(s) unreadable, so the "
                                   "groups of those claims are judged as no claim's"),
                      "the agent logs them at its start (\"DRA checkpoint\"); a file no agent wrote does not belong "
                      "there");
  }
  return check.Pass(message);
}

std::vector<std::string> NvidiaHolderNames(const NodeView& node, CheckBuilder& check,
                                           std::optional<std::vector<binding::Holder>>& nvidia_holders) {
  if (!nvidia_holders) nvidia_holders = binding::NvidiaHolders(node.paths);
  std::vector<std::string> holders;
  for (const binding::Holder& holder : *nvidia_holders) holders.push_back(holder.ToString());
  check.Saw(absl::StrCat((node.paths.proc_root / "*/fd").string(), ", ",
                         (node.paths.sysfs_root / "module/nvidia*").string()),
            holders.empty() ? "nothing holds /dev/nvidia*" : absl::StrJoin(holders, "; "));
  return holders;
}

// --bind-on-prepare, a GPU no prepared claim holds: its host driver (or none) is where it belongs until a claim's
// Prepare binds it, and a vfio driver is where a GPU on vfio at the agent's start stays. What would make that bind
// fail now is said: processes holding nvidia (the Prepare names them and fails the claim after its bind budget).
Check DeviceDriverUntilPrepare(const NodeView& node, const pci::Function& fn, CheckBuilder& check,
                               std::optional<std::vector<binding::Holder>>& nvidia_holders) {
  if (pci::IsVfioDriver(fn.driver)) {
    return check.Pass(absl::StrCat("on ", fn.driver, ", held by no prepared claim (on vfio when the agent started: "
                                                     "it stays there)"));
  }
  const std::string on = fn.driver.empty() ? "no driver" : absl::StrCat("on ", fn.driver);
  if (fn.driver == "nvidia") {
    if (std::vector<std::string> holders = NvidiaHolderNames(node, check, nvidia_holders); !holders.empty()) {
      return check.Warn(absl::StrCat(on, " until a claim's Prepare binds it, but ", absl::StrJoin(holders, "; "),
                                     " keep nvidia from letting go: a claim's Prepare would fail, naming them"),
                        absl::StrCat("stop them before a VM claims this GPU (nvidia-persistenced, DCGM and CUDA "
                                     "processes), or bind it now: vfio-gpu-agent bind --device ", fn.bdf));
    }
  }
  return check.Pass(absl::StrCat(on, " until a claim's Prepare binds its IOMMU group (--bind-on-prepare)"));
}

// `nvidia_holders`: what keeps the nvidia driver busy (binding::NvidiaHolders), read once per run and only when a
// selected function is on nvidia.
Check DeviceDriver(const NodeView& node, const pci::Function& fn,
                   std::optional<std::vector<binding::Holder>>& nvidia_holders) {
  CheckBuilder check("device.driver", kDeviceLayer, fn.bdf);
  check.Saw((node.paths.PciDevice(fn.bdf) / "driver").string(), fn.driver.empty() ? "(none)" : fn.driver)
      .Saw((node.paths.PciDevice(fn.bdf) / "driver_override").string(),
           fn.driver_override.empty() ? "(null)" : fn.driver_override);
  const std::string claim = ClaimHolding(node, fn);
  if (BindOnPrepare(node)) {
    if (claim.empty()) return DeviceDriverUntilPrepare(node, fn, check, nvidia_holders);
    check.Saw(node.bind_on_prepare->value().dir.string(), absl::StrCat("held by claim ", claim));
  }
  if (pci::IsVfioDriver(fn.driver)) {
    return check.Pass(absl::StrCat("on ", fn.driver, claim.empty() ? "" : absl::StrCat(" for claim ", claim)));
  }
  std::string fix = absl::StrCat("vfio-gpu-agent bind --device ", fn.bdf, " (moves its whole IOMMU group to vfio-pci)");
  if (!claim.empty()) {
    fix = absl::StrCat("restart the claim's VM (the next Prepare binds its groups again), or ", fix);
  }
  if (fn.driver == "nvidia") {
    std::vector<std::string> holders = NvidiaHolderNames(node, check, nvidia_holders);
    absl::StrAppend(&fix, holders.empty() ? "" : absl::StrCat("; first stop ", absl::StrJoin(holders, "; ")),
                    " (nvidia-persistenced, DCGM and CUDA processes keep the driver from letting go)");
  } else if (fn.driver == "nouveau" || fn.driver == "nvidiafb") {
    absl::StrAppend(&fix, "; blacklist ", fn.driver, " (/etc/modprobe.d) so it cannot take the GPU at boot");
  }
  const std::string on = fn.driver.empty() ? "no driver" : absl::StrCat("on ", fn.driver);
  if (!claim.empty()) {
    return check.Fail(absl::StrCat(on, " though prepared claim ", claim,
                                   " holds it: its VM cannot open the group (not on vfio-pci or a vfio variant driver)"),
                      fix);
  }
  return check.Fail(absl::StrCat(on, ", not on vfio-pci or a vfio variant driver: KubeVirt cannot pass it through"),
                    fix);
}

Check SriovMode(const NodeView& node, const pci::Function& fn) {
  CheckBuilder check("device.sriov_mode", kDeviceLayer, fn.bdf);
  const std::filesystem::path dir = node.paths.PciDevice(fn.bdf);
  const std::string numvfs = ReadForEvidence(dir / "sriov_numvfs");
  const std::filesystem::path mdev = node.paths.sysfs_root / "class/mdev_bus" / fn.bdf;
  const std::filesystem::path vgpu_type = dir / "nvidia/current_vgpu_type";
  check.Saw((dir / "sriov_numvfs").string(), numvfs);
  int vfs = 0;
  const bool has_vfs = absl::SimpleAtoi(numvfs, &vfs) && vfs > 0;
  const bool on_mdev = fs::Exists(mdev);
  check.Saw(mdev.string(), on_mdev ? "present" : "(absent)");
  const std::string vgpu = fs::ReadTrimmed(vgpu_type).value_or("0");
  const bool vgpu_active = vgpu != "0" && !vgpu.empty();
  if (vgpu_active) check.Saw(vgpu_type.string(), vgpu);
  if (!has_vfs && !on_mdev && !vgpu_active) return check.Pass("whole-GPU passthrough mode (no VFs, mdev or vGPU type)");
  std::vector<std::string> modes;
  if (has_vfs) modes.push_back(absl::StrCat(vfs, " SR-IOV VFs enabled"));
  if (on_mdev) modes.push_back("registered as an mdev parent");
  if (vgpu_active) modes.push_back(absl::StrCat("vGPU type ", vgpu, " set"));
  return check.Fail(
      absl::StrCat(absl::StrJoin(modes, ", "), ": vGPU/SR-IOV and whole-GPU passthrough do not mix on one node"),
      absl::StrCat("One mode per node: echo 0 > ", (dir / "sriov_numvfs").string(),
                   " and stop the vGPU manager (nvidia-vgpu-mgr / sriov-manage -d), or label the node for vGPU "
                   "(nvidia.com/gpu.workload.config=vm-vgpu) and do not run this agent there"));
}

Check Bars(const NodeView& node, const pci::Function& fn) {
  CheckBuilder check("device.bars", kDeviceLayer, fn.bdf);
  const std::filesystem::path resource = node.paths.PciDevice(fn.bdf) / "resource";
  const std::vector<Bar> bars = ReadBars(resource);
  std::vector<std::string> seen, unassigned;
  for (const Bar& bar : bars) {
    const bool assigned = bar.start != 0;
    seen.push_back(absl::StrCat("BAR", bar.index, " ", Size(bar.size), assigned ? "" : " @ 0 (unassigned)"));
    if (!assigned) unassigned.push_back(absl::StrCat("BAR", bar.index, " (", Size(bar.size), ")"));
  }
  check.Saw(resource.string(), seen.empty() ? "(no memory BARs)" : absl::StrJoin(seen, ", "));
  if (unassigned.empty()) return check.Pass(absl::StrCat(bars.size(), " BARs assigned"));
  return check.Fail(absl::StrCat("not assigned by the firmware or kernel: ", absl::StrJoin(unassigned, ", "),
                                 " (dmesg: \"BAR n: failed to assign\")"),
                    "Enable \"Above 4G Decoding\" (and Resizable BAR / a larger MMIOH window) in the BIOS, or boot "
                    "with pci=realloc; then reboot");
}

Check PowerState(const NodeView& node, const pci::Function& fn) {
  CheckBuilder check("device.power_state", kDeviceLayer, fn.bdf);
  const std::filesystem::path dir = node.paths.PciDevice(fn.bdf);
  const std::string state = internal::ReadPowerState(node.paths, fn.bdf);
  check.Saw((dir / "power_state").string(), state.empty() ? "(absent)" : state);
  if (state.empty()) return check.Pass("power_state not exposed by this kernel; config space left alone");
  if (state == "D3cold" && BindOnPrepare(node) && !pci::IsVfioDriver(fn.driver)) {
    // As the driver judges it: runtime PM of the host driver parks an idle GPU; vfio-pci's bind wakes it.
    return check.Pass(absl::StrCat("D3cold under ", fn.driver.empty() ? "no driver" : fn.driver,
                                   "'s power management until a claim's Prepare binds it; config space not read"));
  }
  if (state == "D3cold") {
    const std::filesystem::path idle_d3 = node.paths.sysfs_root / "module/vfio_pci/parameters/disable_idle_d3";
    check.Saw((dir / "d3cold_allowed").string(), ReadForEvidence(dir / "d3cold_allowed"))
        .Saw(idle_d3.string(), ReadForEvidence(idle_d3));
    return check.Warn(
        "in D3cold (powered off); config space not read, since a read would wake it. VM start can fail with "
        "\"Unable to change power state from D3cold to D0\"",
        absl::StrCat("options vfio_pci disable_idle_d3=1 (/etc/modprobe.d) and echo 0 > ", (dir / "d3cold_allowed").string(),
                     "; a GPU that stays in D3cold needs a node reboot"));
  }
  auto vendor = pci::ReadConfigVendor(node.paths, fn.bdf);
  check.Saw((dir / "config").string(), vendor.ok() ? absl::StrFormat("vendor %04x", *vendor)
                                                   : absl::StrCat("(unreadable: ", vendor.status().message(), ")"));
  if (!vendor.ok()) {
    return check.Warn(absl::StrCat(state, "; config space unreadable"),
                      "Check dmesg for PCIe errors on this device; a reboot usually clears it");
  }
  if (*vendor == 0xffff) {
    return check.Fail(absl::StrCat(state, " but config space reads 0xffff: the device is off the bus"),
                      "Reboot the node (a cold boot if it persists); if it recurs after VMs stop, set "
                      "options vfio_pci disable_idle_d3=1");
  }
  return check.Pass(state);
}

Check ResetMethod(const NodeView& node, const pci::Function& fn) {
  CheckBuilder check("device.reset_method", kDeviceLayer, fn.bdf);
  const std::filesystem::path dir = node.paths.PciDevice(fn.bdf);
  auto methods = fs::ReadTrimmed(dir / "reset_method");
  check.Saw((dir / "reset_method").string(), methods.ok() ? (methods->empty() ? "(empty)" : *methods) : "(absent)");
  if (methods.ok() && !methods->empty()) return check.Pass(absl::StrCat("reset by ", *methods));
  // Kernels before 5.15 have no reset_method; there `reset` alone says a method exists.
  const bool reset = fs::Exists(dir / "reset");
  check.Saw((dir / "reset").string(), reset ? "present" : "(absent)");
  if (!methods.ok() && reset) return check.Pass("resettable (kernel without reset_method)");
  return check.Warn("no reset method: the device cannot be reset between VMs and may carry state or hang the next VM",
                    "Give its whole IOMMU group to one VM and do not hand it to another VM without a node reboot; a "
                    "slot of its own (secondary bus reset) or newer GPU firmware (FLR) adds a method");
}

// Every member other than the selected functions themselves (device.driver judges those): a companion or a
// foreign endpoint on a host driver keeps VFIO from opening the group.
Check GroupViable(const NodeView& node, const pci::GroupAssessment& group) {
  CheckBuilder check("group.viable", kDeviceLayer, absl::StrCat("group ", group.id));
  const std::filesystem::path dir = node.paths.IommuGroups() / std::to_string(group.id) / "devices";
  std::vector<std::string> members, companions, foreign;
  for (const pci::Member& member : group.members) {
    const pci::Function* fn = node.inventory->Find(member.bdf);
    if (fn == nullptr) {
      members.push_back(absl::StrCat(member.bdf, " (unreadable)"));
      foreign.push_back(absl::StrCat(member.bdf, " (attributes unreadable)"));
      continue;
    }
    members.push_back(Describe(*fn));
    if (member.role == pci::Role::kGpu || member.role == pci::Role::kNvSwitch) continue;
    if (IsBridgeByHeader(*fn) || pci::IsViableDriver(fn->driver)) continue;
    (member.role == pci::Role::kCompanion ? companions : foreign).push_back(Describe(*fn));
  }
  check.Saw(dir.string(), absl::StrJoin(members, "; "));
  // --bind-on-prepare: a group no claim holds is bound by the next claim's Prepare, companions included.
  const bool until_prepare = BindOnPrepare(node) && ClaimHolding(node, group.members, "").empty();
  if (!foreign.empty()) {
    return check.Fail(
        absl::StrCat("not viable: foreign endpoint ", absl::StrJoin(foreign, ", "),
                     " shares the group (no ACS isolation between them); VFIO refuses the group",
                     until_prepare ? ", so a claim's Prepare refuses its GPUs" : ""),
        "Move the GPU to a slot whose root port isolates it (ACS), enable ACS in the BIOS if offered, or pass the "
        "foreign device through too (unbind it from its driver); never use pcie_acs_override on a multi-tenant node");
  }
  if (!companions.empty() && until_prepare) {
    return check.Pass(absl::StrCat("companion ", absl::StrJoin(companions, ", "),
                                   " on a host driver until a claim's Prepare binds the group with its GPU; no foreign "
                                   "endpoint"));
  }
  if (!companions.empty()) {
    return check.Fail(absl::StrCat("not viable: companion ", absl::StrJoin(companions, ", "), " is on a host driver"),
                      "vfio-gpu-agent bind (it moves the companions, e.g. the GPU's audio or USB-C functions, with the "
                      "GPU)");
  }
  return check.Pass(absl::StrCat("every other endpoint of the ", group.members.size(),
                                 "-member group is on a vfio driver, pci-stub or none (bridges by header type)"));
}

Check GroupDevnode(const NodeView& node, const pci::GroupAssessment& group) {
  CheckBuilder check("group.devnode", kDeviceLayer, absl::StrCat("group ", group.id));
  std::vector<const pci::Function*> on_vfio;
  for (const pci::Member& member : group.members) {
    const pci::Function* fn = node.inventory->Find(member.bdf);
    if (fn != nullptr && pci::IsVfioDriver(fn->driver)) on_vfio.push_back(fn);
  }
  if (on_vfio.empty()) return check.Skip("no member on a vfio driver yet (see device.driver)");
  const std::filesystem::path group_node = node.paths.VfioDir() / std::to_string(group.id);
  const bool group_ok = IsCharDevice(group_node);
  check.Saw(group_node.string(), group_ok ? "character device" : fs::Exists(group_node) ? "not a character device" : "(absent)");
  if (group_ok) return check.Pass(absl::StrCat(group_node.string(), " is a character device"));
  // A cdev-only (iommufd) host has no group nodes; every vfio member then needs its vfio/devices/vfioN.
  const bool iommufd = IsCharDevice(node.paths.dev_root / "iommu");
  bool cdevs_ok = iommufd;
  for (const pci::Function* fn : on_vfio) {
    for (const std::string& cdev : fn->vfio_cdevs) {
      const std::filesystem::path path = node.paths.VfioDir() / "devices" / cdev;
      const bool ok = IsCharDevice(path);
      check.Saw(path.string(), ok ? "character device" : "(absent)");
      cdevs_ok &= ok;
    }
    cdevs_ok &= !fn->vfio_cdevs.empty();
  }
  if (cdevs_ok) return check.Pass("no group node, but iommufd and every member's vfio cdev are present");
  return check.Fail(
      absl::StrCat(group_node.string(), " is missing though a member is on a vfio driver: VMs cannot open the group"),
      "In a container, mount the host's /dev (hostPath /dev, not a copy); on the host check devtmpfs and udev rules "
      "for /dev/vfio; rebinding (vfio-gpu-agent unbind --group N, then bind) recreates it");
}

// driver_override set but no driver: a bind that stopped halfway (crash, timeout) and left the function unusable.
std::vector<Check> StrandedOverrides(const NodeView& node) {
  std::vector<Check> checks;
  std::vector<std::string> functions = node.selection->gpus;
  functions.insert(functions.end(), node.selection->companions.begin(), node.selection->companions.end());
  std::sort(functions.begin(), functions.end());
  for (const std::string& bdf : functions) {
    const pci::Function* fn = node.inventory->Find(bdf);
    if (fn == nullptr || fn->driver_override.empty() || !fn->driver.empty()) continue;
    CheckBuilder check("device.stranded_override", kDeviceLayer, bdf);
    check.Saw((node.paths.PciDevice(bdf) / "driver_override").string(), fn->driver_override)
        .Saw((node.paths.PciDevice(bdf) / "driver").string(), "(none)");
    checks.push_back(check.Fail(
        absl::StrCat("driver_override=", fn->driver_override, " but no driver: a bind stopped halfway"),
        absl::StrCat("vfio-gpu-agent bind --device ", bdf, " (or echo ", bdf, " > ",
                     (node.paths.sysfs_root / "bus/pci/drivers_probe").string(), ")")));
  }
  if (checks.empty()) {
    checks.push_back(CheckBuilder("device.stranded_override", kDeviceLayer, "node")
                         .Saw("driver_override of the selected functions and companions",
                              absl::StrCat(functions.size(), " read, none stranded"))
                         .Pass("no driver_override left without a driver"));
  }
  return checks;
}

bool IsNvSwitch(const pci::Function& fn) {
  return fn.vendor_id == pci::kVendorNvidia && (fn.class_code >> 8) == (pci::kClassBridgeOther >> 8);
}

// Fabric Manager's process, for the shared-NVSwitch model (switches on the host's nvidia driver).
std::string FindFabricManager(const std::filesystem::path& proc_root) {
  auto entries = fs::ListDir(proc_root);
  if (!entries.ok()) return "";
  for (const std::string& pid : *entries) {
    if (pid.empty() || !absl::ascii_isdigit(static_cast<unsigned char>(pid[0]))) continue;
    if (fs::ReadTrimmed(proc_root / pid / "comm").value_or("") == "nv-fabricmanage") return pid;
  }
  return "";
}

std::string OnDriver(const pci::Function& fn) {
  return absl::StrCat(fn.bdf, " on ", fn.driver.empty() ? "(no driver)" : fn.driver);
}

// With --nvswitches the switches are selected: the node is in full passthrough (FABRIC_MODE=0), one VM gets the
// whole board and runs Fabric Manager itself.
bool FullPassthrough(const NodeView& node) {
  return std::any_of(node.selection->gpus.begin(), node.selection->gpus.end(),
                     [&](const std::string& bdf) { return node.selection->RoleOf(bdf) == pci::Role::kNvSwitch; });
}

// Full passthrough: the guest's Fabric Manager brings NVLink up only with every GPU and every switch of the board,
// so one function left on a host driver breaks the mode for the whole board, not only for itself.
Check BoardOnVfio(const NodeView& node, CheckBuilder& check, const std::vector<std::string>& switches,
                  const std::vector<std::string>& switches_off) {
  std::vector<std::string> gpus, gpus_off;
  for (const std::string& bdf : node.selection->gpus) {
    if (node.selection->RoleOf(bdf) != pci::Role::kGpu) continue;
    const pci::Function* fn = node.inventory->Find(bdf);
    if (fn == nullptr) continue;  // device.driver reports it unreadable
    gpus.push_back(OnDriver(*fn));
    if (!pci::IsVfioDriver(fn->driver)) gpus_off.push_back(OnDriver(*fn));
  }
  check.Saw("selected GPUs", gpus.empty() ? "(none)" : absl::StrJoin(gpus, ", "));
  if (gpus_off.empty() && switches_off.empty()) {
    return check.Pass(absl::StrCat("full passthrough: ", gpus.size(), " GPUs and ", switches.size(),
                                   " NVSwitches on vfio, for one VM that runs Fabric Manager itself"));
  }
  std::vector<std::string> off = gpus_off;
  off.insert(off.end(), switches_off.begin(), switches_off.end());
  return check.Fail(
      absl::StrCat("full passthrough (--nvswitches) needs the whole board on vfio, but ", gpus_off.size(), " of ",
                   gpus.size(), " GPUs and ", switches_off.size(), " of ", switches.size(),
                   " NVSwitches are not (", absl::StrJoin(off, ", "),
                   "): the guest's Fabric Manager cannot bring NVLink up (cuInit error 802)"),
      "vfio-gpu-agent bind --nvswitches (first stop what holds them on the host: nv-fabricmanager, "
      "nvidia-persistenced, DCGM; device.driver names the holders of each), then give one VM every GPU and "
      "NVSwitch");
}

Check NvSwitchPassthrough(const NodeView& node) {
  CheckBuilder check("nvswitch.passthrough", kDeviceLayer, "node");
  std::vector<std::string> switches, not_passed;
  for (const pci::Function& fn : node.inventory->functions()) {
    if (!IsNvSwitch(fn)) continue;
    switches.push_back(OnDriver(fn));
    if (!pci::IsVfioDriver(fn.driver)) not_passed.push_back(OnDriver(fn));
  }
  check.Saw("NVSwitch functions (10de, class 0680)", switches.empty() ? "(none)" : absl::StrJoin(switches, ", "));
  if (switches.empty()) return check.Pass("no NVSwitch on this node");
  if (FullPassthrough(node)) return BoardOnVfio(node, check, switches, not_passed);
  if (not_passed.empty()) {
    return check.Pass(absl::StrCat(switches.size(), " NVSwitches on vfio: full passthrough of GPUs and switches"));
  }
  const std::string fm = FindFabricManager(node.paths.proc_root);
  check.Saw((node.paths.proc_root / "*/comm").string(), fm.empty() ? "no nv-fabricmanager" : "nv-fabricmanager pid " + fm);
  if (!fm.empty()) return check.Pass("shared-NVSwitch model: the switches stay on the host with Fabric Manager running");
  return check.Warn(
      absl::StrCat(not_passed.size(), " of ", switches.size(),
                   " NVSwitches are neither passed through nor managed by a running Fabric Manager: NVLink in the "
                   "guests will not come up (cuInit error 802)"),
      "Either pass the switches through with the GPUs (vfio-gpu-agent bind --nvswitches, and give one VM all GPUs "
      "and switches), or run Fabric Manager (nv-fabricmanager) on the host, shared-NVSwitch mode, and activate a "
      "partition before the VM starts");
}

// Full passthrough only. A Fabric Manager on the node holds the switches (/dev/nvidia-nvswitch*), so they cannot
// move to vfio-pci, and with them on vfio-pci it has nothing to manage: only the guest's may run.
Check FabricManagerOffNode(const NodeView& node) {
  CheckBuilder check("nvswitch.fabric_manager", kDeviceLayer, "node");
  const std::string fm = FindFabricManager(node.paths.proc_root);
  check.Saw((node.paths.proc_root / "*/comm").string(), fm.empty() ? "no nv-fabricmanager" : "nv-fabricmanager pid " + fm);
  if (fm.empty()) return check.Pass("no Fabric Manager on the node: it runs in the guest that gets the board");
  return check.Fail(
      absl::StrCat("Fabric Manager (nv-fabricmanager, pid ", fm,
                   ") runs on the node, but with --nvswitches the NVSwitches go to a VM whose own Fabric Manager "
                   "manages them"),
      "Stop and disable Fabric Manager on the node (systemctl disable --now nvidia-fabricmanager); for the "
      "shared-NVSwitch model, where it stays on the node, run the agent without --nvswitches instead");
}

int PhysicalAddressBits(const std::filesystem::path& cpuinfo) {
  auto text = fs::ReadTrimmed(cpuinfo);
  if (!text.ok()) return 0;
  const size_t at = text->find("address sizes");
  if (at == std::string::npos) return 0;
  int bits = 0;
  std::sscanf(text->c_str() + text->find(':', at) + 1, "%d", &bits);
  return bits;
}

Check MmioWindow(const NodeView& node) {
  CheckBuilder check("device.mmio_window", kDeviceLayer, "node");
  uint64_t total = 0;
  int gpus = 0;
  for (const std::string& bdf : node.selection->gpus) {
    if (node.selection->RoleOf(bdf) != pci::Role::kGpu) continue;
    ++gpus;
    for (const Bar& bar : ReadBars(node.paths.PciDevice(bdf) / "resource")) {
      if (bar.flags & kResourceMem64) total += bar.size;
    }
  }
  if (gpus == 0) return check.Skip("no selected GPU");
  const std::filesystem::path cpuinfo = node.paths.proc_root / "cpuinfo";
  const int bits = PhysicalAddressBits(cpuinfo);
  check.Saw("64-bit BARs of the selected GPUs", absl::StrCat(Size(total), " over ", gpus, " GPUs"))
      .Saw(cpuinfo.string(), bits > 0 ? absl::StrCat("address sizes: ", bits, " bits physical") : "(no address sizes)");
  if (bits <= 0) return check.Skip(absl::StrCat("no \"address sizes\" in ", cpuinfo.string()));
  if (total <= kClassicOvmfWindow) return check.Pass(absl::StrCat(Size(total), " of 64-bit BARs fit any guest's MMIO window"));
  // A current OVMF gives the 64-bit MMIO window the upper half of the guest's physical address space.
  const uint64_t window = bits >= 64 ? UINT64_MAX : (uint64_t{1} << (bits - 1));
  const std::string fix =
      "In the VirtualMachine: spec.domain.cpu.model: host-passthrough (the guest gets the host's physical address "
      "bits) with a current OVMF, which sizes the 64-bit MMIO window from them; older firmware needs the window set "
      "explicitly (fw_cfg opt/ovmf/X-PciMmio64Mb, e.g. through a KubeVirt hook sidecar). Otherwise give each VM "
      "fewer GPUs";
  if (total > window) {
    return check.Warn(absl::StrCat(Size(total), " of 64-bit BARs exceed half of the ", bits,
                                   "-bit physical address space (", Size(window),
                                   "): a VM with all these GPUs cannot map them (guest: \"BAR0 is 0M @ 0x0\")"),
                      fix);
  }
  return check.Pass(absl::StrCat(Size(total), " of 64-bit BARs fit a ", bits,
                                 "-bit guest with a host-passthrough CPU; more than OVMF's classic 32 GiB window, so "
                                 "VMs with several GPUs need host-passthrough and a current OVMF"));
}

}  // namespace

std::vector<Check> DeviceChecks(const NodeView& node) {
  std::vector<Check> checks;
  if (BindOnPrepare(node)) checks.push_back(PreparedClaims(node));
  std::optional<std::vector<binding::Holder>> nvidia_holders;
  for (const std::string& bdf : node.selection->gpus) {
    const pci::Function* fn = node.inventory->Find(bdf);
    if (fn == nullptr) {
      checks.push_back(CheckBuilder("device.driver", kDeviceLayer, bdf).Fail(
          "attributes unreadable (see `vfio-gpu-agent inspect` scan errors)", "Check dmesg for this device"));
      continue;
    }
    checks.push_back(DeviceDriver(node, *fn, nvidia_holders));
    checks.push_back(SriovMode(node, *fn));
    checks.push_back(Bars(node, *fn));
    checks.push_back(PowerState(node, *fn));
    checks.push_back(ResetMethod(node, *fn));
  }
  for (const std::string& bdf : node.selection->unisolated) {
    checks.push_back(CheckBuilder("group.viable", kDeviceLayer, bdf)
                         .Saw((node.paths.PciDevice(bdf) / "iommu_group").string(), "(absent)")
                         .Skip("no IOMMU group (see iommu.enabled)"));
  }
  for (const pci::GroupAssessment& group : node.selection->groups) {
    checks.push_back(GroupViable(node, group));
    checks.push_back(GroupDevnode(node, group));
  }
  for (Check& check : StrandedOverrides(node)) checks.push_back(std::move(check));
  checks.push_back(NvSwitchPassthrough(node));
  if (FullPassthrough(node)) checks.push_back(FabricManagerOffNode(node));
  checks.push_back(MmioWindow(node));
  return checks;
}

}  // namespace vfio_agent::validation
