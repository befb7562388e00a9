// The vGPU layer (vm-vgpu nodes, issue 19): the vGPU manager, the SR-IOV VFs, the vGPUs and their profiles, read
// from sysfs and the vGPU discovery only. It stands where layer 2 stands on a passthrough node and backs the GPU
// Operator's `vgpu-manager-ready` and `vgpu-devices-ready`.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "check_builder.h"
#include "vfio_gpu_agent/common/fs.h"
#include "vfio_gpu_agent/validation/check.h"
#include "vfio_gpu_agent/vgpu/config.h"

namespace vfio_agent::validation {
namespace {

using internal::CheckBuilder;
using internal::ReadForEvidence;

constexpr Layer kVgpuLayer = Layer::kVgpu;
// The checks whose failure means the vGPU manager is not ready (`vgpu-manager-ready`).
constexpr const char* kManagerChecks[] = {"vgpu.gpu_driver", "vgpu.manager", "vgpu.framework", "vgpu.vfs_enabled"};

constexpr char kConfigFix[] =
    "Give the agent the profiles: --vgpu-config-file (the ConfigMap, vgpu-device-manager's format) and the node "
    "label nvidia.com/vgpu.config=<config>; `run` applies it and reports nvidia.com/vgpu.config.state.";

// The selected GPUs that are physical functions (a VF is a vGPU's, never a GPU of its own).
std::vector<const pci::Function*> GpuPfs(const NodeView& node) {
  std::vector<const pci::Function*> out;
  for (const std::string& bdf : node.selection->gpus) {
    const pci::Function* fn = node.inventory->Find(bdf);
    if (fn != nullptr && !fn->IsVirtualFunction()) out.push_back(fn);
  }
  return out;
}

bool IsMdevParent(const vgpu::Discovery& discovery, const std::string& bdf) {
  return std::any_of(discovery.parents.begin(), discovery.parents.end(),
                     [&](const vgpu::MdevParent& parent) { return parent.bdf == bdf; });
}

int ReadCount(const std::filesystem::path& path) {
  int value = 0;
  auto text = fs::ReadTrimmed(path);
  return text.ok() && absl::SimpleAtoi(*text, &value) ? value : 0;
}

Check GpuDriver(const NodeView& node, const pci::Function& fn) {
  CheckBuilder check("vgpu.gpu_driver", kVgpuLayer, fn.bdf);
  check.Saw((node.paths.PciDevice(fn.bdf) / "driver").string(), fn.driver.empty() ? "(none)" : fn.driver);
  if (fn.driver == vgpu::kNvidiaDriver) return check.Pass("on nvidia (the vGPU manager)");
  return check.Fail(
      absl::StrCat("on ", fn.driver.empty() ? "no driver" : fn.driver,
                   ": on a vm-vgpu node the vGPU manager (the nvidia driver) must own every GPU"),
      absl::StrCat("Give it back to nvidia: the agent does when the node's nvidia.com/gpu.workload.config label is "
                   "vm-vgpu and no VM holds it; by hand `echo ", fn.bdf, " > /sys/bus/pci/drivers/",
                   fn.driver.empty() ? "<driver>" : fn.driver, "/unbind; echo > /sys/bus/pci/devices/", fn.bdf,
                   "/driver_override; echo ", fn.bdf, " > /sys/bus/pci/drivers/nvidia/bind`."));
}

// mdev parents, or GPUs whose nvidia/ directory lists vGPU types (the vendor-specific VFIO framework): what the
// GPU Operator's validator waits for before `vgpu-manager-ready`.
Check Manager(const NodeView& node, const vgpu::Discovery& discovery) {
  CheckBuilder check("vgpu.manager", kVgpuLayer, "node");
  const std::filesystem::path mdev_bus = node.paths.sysfs_root / "class/mdev_bus";
  std::vector<std::string> parents;
  for (const vgpu::MdevParent& parent : discovery.parents) parents.push_back(parent.bdf);
  check.Saw(mdev_bus.string(), fs::Exists(mdev_bus) ? (parents.empty() ? "(empty)" : absl::StrJoin(parents, " "))
                                                    : "(absent)");
  std::vector<std::string> sriov_cards;
  for (const pci::Function* fn : GpuPfs(node)) {
    const std::filesystem::path types = node.paths.PciDevice(fn->bdf) / "nvidia/creatable_vgpu_types";
    if (fs::Exists(types)) sriov_cards.push_back(fn->bdf);
  }
  check.Saw((node.paths.PciDevices() / "<GPU>/nvidia/creatable_vgpu_types").string(),
            sriov_cards.empty() ? "(on no GPU)" : absl::StrJoin(sriov_cards, " "));
  if (!parents.empty() || !sriov_cards.empty()) {
    std::vector<std::string> what;
    if (!parents.empty()) what.push_back(absl::StrCat(parents.size(), " mdev parent(s)"));
    if (!sriov_cards.empty()) what.push_back(absl::StrCat(sriov_cards.size(), " SR-IOV vGPU card(s)"));
    return check.Pass(absl::StrCat("vGPU manager loaded: ", absl::StrJoin(what, ", ")));
  }
  if (fs::Exists(mdev_bus)) {
    return check.Fail("the mdev bus is there but no GPU is an mdev parent yet",
                      "Ampere cards (A10, A16, A40, A100) offer mdev types on their VFs only: enable them (see "
                      "vgpu.vfs_enabled); otherwise the vGPU manager does not support these GPUs (check "
                      "`nvidia-smi -q` Virtualization Mode and dmesg).");
  }
  return check.Fail(
      "no vGPU manager: no mdev bus and no GPU with nvidia/creatable_vgpu_types (nvidia is the standard driver, or "
      "not loaded)",
      "Install the NVIDIA vGPU manager on this node (GPU Operator: vgpuManager.enabled=true with the node labelled "
      "nvidia.com/gpu.workload.config=vm-vgpu; or the host's vGPU manager package) and reload nvidia.");
}

Check FrameworkCheck(const vgpu::Discovery& discovery) {
  CheckBuilder check("vgpu.framework", kVgpuLayer, "node");
  if (!discovery.framework.ok()) {
    check.Saw("vGPU discovery", std::string(discovery.framework.status().message()));
    return check.Fail(std::string(discovery.framework.status().message()),
                      "Run one framework per node: mdev cards (Pascal..Ampere) and SR-IOV vGPU cards (Ada and newer, "
                      "vGPU 17+) need different vGPU manager releases; move one kind to another node.");
  }
  check.Saw("vGPU discovery", vgpu::FrameworkName(*discovery.framework));
  if (*discovery.framework == vgpu::Framework::kNone) return check.Skip("no vGPU framework yet (see vgpu.manager)");
  return check.Pass(absl::StrCat("one framework: ", vgpu::FrameworkName(*discovery.framework)));
}

// SR-IOV capable GPUs that are not mdev parents themselves (Ampere mdev cards, SR-IOV vGPU cards): the GPU
// Operator's validator counts the manager ready only once every VF of every such PF is enabled.
std::vector<Check> VfsEnabled(const NodeView& node, const vgpu::Discovery& discovery) {
  std::vector<Check> out;
  for (const pci::Function* fn : GpuPfs(node)) {
    if (fn->driver != vgpu::kNvidiaDriver || IsMdevParent(discovery, fn->bdf)) continue;
    const std::filesystem::path dir = node.paths.PciDevice(fn->bdf);
    const int total = ReadCount(dir / "sriov_totalvfs");
    if (total <= 0) continue;
    const int enabled = ReadCount(dir / "sriov_numvfs");
    CheckBuilder check("vgpu.vfs_enabled", kVgpuLayer, fn->bdf);
    check.Saw((dir / "sriov_numvfs").string(), ReadForEvidence(dir / "sriov_numvfs"))
        .Saw((dir / "sriov_totalvfs").string(), ReadForEvidence(dir / "sriov_totalvfs"));
    if (enabled == total) {
      out.push_back(check.Pass(absl::StrCat("all ", total, " VFs enabled")));
      continue;
    }
    out.push_back(check.Fail(
        absl::StrCat(enabled, " of ", total, " VFs enabled: this card's vGPUs live on its VFs"),
        absl::StrCat("`/usr/lib/nvidia/sriov-manage -e ", fn->bdf,
                     "` (the GPU Operator's vGPU manager does it at start; VFs do not survive a reboot); the agent "
                     "enables them when its --vgpu-config-file asks for vGPUs on this GPU.")));
  }
  if (out.empty()) {
    out.push_back(CheckBuilder("vgpu.vfs_enabled", kVgpuLayer, "node")
                      .Saw((node.paths.PciDevices() / "<GPU>/sriov_totalvfs").string(), "(no SR-IOV vGPU card)")
                      .Pass("no card needs VFs (the mdev parents are the GPUs themselves)"));
  }
  return out;
}

// "2x T4-1Q, 1x T4-2Q", or "(no vGPU)".
std::string TypeCounts(const std::map<std::string, int>& counts) {
  std::vector<std::string> parts;
  parts.reserve(counts.size());
  for (const auto& [type, count] : counts) parts.push_back(absl::StrCat(count, "x ", type));
  return parts.empty() ? "(no vGPU)" : absl::StrJoin(parts, ", ");
}

std::vector<Check> Devices(const NodeView& node, const vgpu::Discovery& discovery) {
  std::vector<Check> out;
  for (const vgpu::DeviceError& error : discovery.errors) {
    out.push_back(CheckBuilder("vgpu.readable", kVgpuLayer, error.device.empty() ? "node" : error.device)
                      .Saw(error.path.string(), std::string(error.status.message()))
                      .Fail(absl::StrCat("unreadable, so not advertised: ", error.status.message()),
                            "Check dmesg for this device; when the path is the catalog file, remove it (the agent "
                            "writes a new one from what the cards list)."));
  }
  for (const vgpu::UnresolvedVgpu& vf : discovery.unresolved) {
    out.push_back(CheckBuilder("vgpu.names", kVgpuLayer, vf.bdf)
                      .Saw((node.paths.PciDevice(vf.bdf) / "nvidia/current_vgpu_type").string(),
                           absl::StrCat(vf.type_id))
                      .Fail(absl::StrCat("vGPU type ", vf.type_id, " has no known name, so it is not advertised: ",
                                         vf.reason),
                            absl::StrCat("Keep the agent's state dir on a hostPath (<state-dir>/vgpu-catalog.txt "
                                         "remembers what full cards no longer list), or free a vGPU of card ",
                                         vf.pf_bdf, " so it lists its types again; never rename it by hand.")));
  }
  std::map<std::string, int> by_type;
  for (const vgpu::Mdev& mdev : discovery.mdevs) ++by_type[mdev.type_name];
  for (const vgpu::SriovVgpu& vf : discovery.vgpus) ++by_type[vf.type_name];
  CheckBuilder check("vgpu.devices", kVgpuLayer, "node");
  check.Saw((node.paths.sysfs_root / "bus/mdev/devices").string(), absl::StrCat(discovery.mdevs.size(), " mdev(s)"))
      .Saw((node.paths.PciDevices() / "<VF>/nvidia/current_vgpu_type").string(),
           absl::StrCat(discovery.vgpus.size(), " VF(s) with a type"));
  if (by_type.empty()) {
    out.push_back(check.Fail("no vGPU exists on this node, so nothing is advertised",
                             absl::StrCat(kConfigFix, " By hand: mdev: write a UUID to <parent>/mdev_supported_types/"
                                                      "<type>/create; SR-IOV: write an id of the VF's "
                                                      "nvidia/creatable_vgpu_types to its nvidia/current_vgpu_type.")));
  } else {
    out.push_back(check.Pass(absl::StrCat("vGPUs: ", TypeCounts(by_type))));
  }
  return out;
}

// What exists on one GPU, by short type name (the config's keys): its own mdevs (Turing), those of its VFs
// (Ampere), its SR-IOV vGPUs. VFs whose type has no name are left out (vgpu.names reports them).
std::vector<vgpu::ExistingVgpu> ExistingOn(const NodeView& node, const vgpu::Discovery& discovery,
                                           const std::string& gpu) {
  auto on_gpu = [&](const std::string& bdf) {
    if (bdf == gpu) return true;
    const pci::Function* fn = node.inventory->Find(bdf);
    return fn != nullptr && fn->physfn == gpu;
  };
  std::vector<vgpu::ExistingVgpu> out;
  for (const vgpu::Mdev& mdev : discovery.mdevs) {
    if (on_gpu(mdev.parent_bdf)) out.push_back({.id = mdev.uuid, .type = vgpu::ShortTypeName(mdev.type_name)});
  }
  for (const vgpu::SriovVgpu& vf : discovery.vgpus) {
    if (vf.pf_bdf == gpu) out.push_back({.id = vf.bdf, .type = vgpu::ShortTypeName(vf.type_name)});
  }
  return out;
}

std::vector<Check> Profiles(const NodeView& node, const VgpuView& view) {
  if (!view.desired) {
    return {CheckBuilder("vgpu.profiles", kVgpuLayer, "node")
                .Skip("not checked: no profiles config given (--vgpu-config-file FILE --vgpu-config NAME)")};
  }
  if (!view.desired->ok()) {
    return {CheckBuilder("vgpu.profiles", kVgpuLayer, "node")
                .Saw(view.config_source, std::string(view.desired->status().message()))
                .Fail(absl::StrCat("the profiles config cannot be applied: ", view.desired->status().message()),
                      "Fix the config (vgpu-device-manager's format: version: v1, vgpu-configs: {<name>: [{devices, "
                      "vgpu-devices}]}) or the node label nvidia.com/vgpu.config naming it.")};
  }
  std::vector<Check> out;
  for (const auto& [gpu, desired] : **view.desired) {
    std::vector<vgpu::ExistingVgpu> existing = ExistingOn(node, *view.discovery, gpu);
    std::map<std::string, int> have;
    for (const vgpu::ExistingVgpu& v : existing) ++have[v.type];
    const vgpu::GpuChange change = vgpu::PlanGpu(existing, desired);
    CheckBuilder check("vgpu.profiles", kVgpuLayer, gpu);
    check.Saw(view.config_source, TypeCounts(desired)).Saw("vGPUs on this GPU (sysfs)", TypeCounts(have));
    if (change.empty()) {
      out.push_back(check.Pass(absl::StrCat("holds what the config asks: ", TypeCounts(desired))));
      continue;
    }
    std::vector<std::string> differences;
    if (!change.remove.empty()) differences.push_back(absl::StrCat("to remove ", absl::StrJoin(change.remove, ",")));
    if (!change.create.empty()) differences.push_back(absl::StrCat("to create ", TypeCounts(change.create)));
    out.push_back(check.Fail(
        absl::StrCat("differs from the config: ", absl::StrJoin(differences, "; ")),
        "The agent (`run` with --vgpu-config-file) changes only the difference; nvidia.com/vgpu.config.state and the "
        "node's events say why it did not (a vGPU a running VM holds waits until the VM ends; a full card cannot "
        "take more)."));
  }
  if (out.empty()) {
    out.push_back(CheckBuilder("vgpu.profiles", kVgpuLayer, "node")
                      .Saw(view.config_source, "no entry matches a GPU of this node")
                      .Warn("the config asks nothing of this node's GPUs", kConfigFix));
  }
  return out;
}

}  // namespace

std::vector<vgpu::ConfigGpu> ConfigGpus(const pci::Inventory& inventory) {
  std::vector<vgpu::ConfigGpu> out;
  for (const pci::Function& fn : inventory.functions()) {
    const bool gpu_class = fn.class_code >> 8 == pci::kClassVgaController >> 8 || fn.class_code >> 8 == pci::kClass3dController >> 8;
    if (fn.vendor_id != pci::kVendorNvidia || !gpu_class || fn.IsVirtualFunction()) continue;
    out.push_back({.index = static_cast<int>(out.size()), .bdf = fn.bdf, .vendor_id = fn.vendor_id,
                   .device_id = fn.device_id});
  }
  return out;
}

std::vector<Check> VgpuChecks(const NodeView& node) {
  if (node.workload != Workload::kVmVgpu || node.vgpu == nullptr || node.vgpu->discovery == nullptr) {
    return {CheckBuilder("vgpu.manager", kVgpuLayer, "node")
                .Skip(absl::StrCat("not checked: a ", WorkloadName(node.workload),
                                   " node (--workload vm-vgpu checks a vGPU node)"))};
  }
  const vgpu::Discovery& discovery = *node.vgpu->discovery;
  std::vector<Check> out;
  for (const pci::Function* fn : GpuPfs(node)) out.push_back(GpuDriver(node, *fn));
  out.push_back(Manager(node, discovery));
  out.push_back(FrameworkCheck(discovery));
  for (Check& check : VfsEnabled(node, discovery)) out.push_back(std::move(check));
  for (Check& check : Devices(node, discovery)) out.push_back(std::move(check));
  for (Check& check : Profiles(node, *node.vgpu)) out.push_back(std::move(check));
  return out;
}

bool VgpuManagerReady(const std::vector<Check>& checks) {
  return std::none_of(checks.begin(), checks.end(), [](const Check& c) {
    if (c.result != Result::kFail) return false;
    if (c.layer == Layer::kPlatform) return true;
    return c.layer == kVgpuLayer && std::find(std::begin(kManagerChecks), std::end(kManagerChecks), c.id) !=
                                    std::end(kManagerChecks);
  });
}

bool VgpuDevicesReady(const std::vector<Check>& checks) {
  return std::none_of(checks.begin(), checks.end(), [](const Check& c) {
    return c.result == Result::kFail && (c.layer == Layer::kPlatform || c.layer == kVgpuLayer);
  });
}

}  // namespace vfio_agent::validation
