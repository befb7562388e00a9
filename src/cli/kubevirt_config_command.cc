// `kubevirt-config`: the permittedHostDevices entries KubeVirt needs for this node's GPUs (or for given ids).
#include <charconv>
#include <iostream>
#include <set>

#include "absl/strings/str_cat.h"
#include "vfio_gpu_agent/cli/commands.h"
#include "vfio_gpu_agent/dra/driver.h"
#include "vfio_gpu_agent/fabric/fm_client.h"
#include "vfio_gpu_agent/pci/inventory.h"
#include "vfio_gpu_agent/pci/selection.h"
#include "vfio_gpu_agent/plugin/devices.h"
#include "vfio_gpu_agent/validation/dra_config.h"
#include "vfio_gpu_agent/validation/check.h"
#include "vfio_gpu_agent/validation/kubevirt_config.h"

namespace vfio_agent::cli {
namespace {

std::vector<FlagSpec> KubevirtConfigFlagSpecs() {
  std::vector<FlagSpec> specs = {
      {"ids", "VID:DID,...", "these device ids instead of the host's selected GPUs (the host is not read)", "", true},
      {"format", "F", "cozystack (platform values, only entries missing from the default table), kubevirt-patch "
                      "(merge patch for a plain KubeVirt CR, every entry) or dra (DeviceClasses, ResourceClaimTemplates "
                      "and VM snippets for a DRA node); --workload vm-vgpu: kubevirt-patch or dra",
       "cozystack; kubevirt-patch with --workload vm-vgpu"},
      {"dra-driver-name", "NAME", "with --format dra: the DRA driver name the node's agent runs with",
       std::string(dra::kDefaultDriverName)},
      {"state-dir", "DIR", "--workload vm-vgpu: the agent's state dir, whose vgpu-catalog.txt names the vGPUs of full "
                           "SR-IOV cards (read, never written)", "/var/lib/vfio-gpu-agent"},
  };
  // --format dra on an HGX shared-NVSwitch node: the multi-GPU templates follow Fabric Manager's partition sizes.
  for (FlagSpec& spec : FabricFlags()) {
    if (spec.name != "fabric-fail-mode") specs.push_back(std::move(spec));
  }
  return specs;
}

// The partition sizes Fabric Manager supports (read-only); none without --fabric-manager.
absl::StatusOr<std::set<int>> PartitionSizes(const ParsedCommand& cmd) {
  if (!cmd.flags.Has("fabric-manager")) return std::set<int>{};
  absl::StatusOr<fabric::FabricOptions> options = FabricOptionsFromFlags(cmd);
  if (!options.ok()) return options.status();
  absl::StatusOr<std::unique_ptr<fabric::FmClient>> client = fabric::ConnectNvfm(
      {.address = options->address, .library = cmd.flags.Get("fabric-library", "libnvfm.so.1")});
  if (!client.ok()) return client.status();
  absl::StatusOr<fabric::PartitionTable> table = (*client)->Partitions();
  if (!table.ok()) return table.status();
  return table->Sizes();
}

absl::StatusOr<std::pair<uint16_t, uint16_t>> ParseId(std::string_view text) {
  const size_t colon = text.find(':');
  uint16_t ids[2] = {0, 0};
  const std::string_view parts[2] = {text.substr(0, colon), colon == std::string_view::npos ? "" : text.substr(colon + 1)};
  for (int i = 0; i < 2; ++i) {
    auto [end, ec] = std::from_chars(parts[i].data(), parts[i].data() + parts[i].size(), ids[i], 16);
    if (parts[i].size() != 4 || ec != std::errc() || end != parts[i].data() + parts[i].size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--ids \"", std::string(text), "\" is not a VID:DID pair of 4-digit hex ids (e.g. 10de:2335)"));
    }
  }
  return std::make_pair(ids[0], ids[1]);
}

absl::StatusOr<std::vector<std::pair<uint16_t, uint16_t>>> IdsFromFlags(const FlagValues& flags) {
  std::vector<std::pair<uint16_t, uint16_t>> ids;
  for (const std::string& value : flags.All("ids")) {
    size_t start = 0;
    while (start <= value.size()) {
      const size_t comma = std::min(value.find(',', start), value.size());
      if (comma > start) {
        auto id = ParseId(std::string_view(value).substr(start, comma - start));
        if (!id.ok()) return id.status();
        ids.push_back(*id);
      }
      start = comma + 1;
    }
  }
  return ids;
}

// The ids `serve` advertises (the selected GPUs, and the NVSwitches with --nvswitches), read-only, so that the
// names are resolved over the same ids as there. The DRA driver publishes the GPUs alone (`gpus_only`).
absl::StatusOr<std::vector<std::pair<uint16_t, uint16_t>>> IdsFromHost(const CommonOptions& common, bool gpus_only) {
  auto inventory = pci::Scan(common.paths.sysfs_root,
                             {.detail_vendor = common.policy.vendor_id, .driver_override = false});
  if (!inventory.ok()) return inventory.status();
  const pci::Selection selection = pci::Select(*inventory, common.policy);
  if (!gpus_only) return plugin::AdvertisableIds(*inventory, selection);
  std::vector<std::pair<uint16_t, uint16_t>> ids;
  for (const std::string& bdf : selection.gpus) {
    if (selection.RoleOf(bdf) != pci::Role::kGpu) continue;
    if (const pci::Function* fn = inventory->Find(bdf)) ids.emplace_back(fn->vendor_id, fn->device_id);
  }
  return ids;
}

// vm-vgpu: the entries for the vGPU types this node has now (mediatedDevices for mdev types, pciHostDevices for
// SR-IOV profiles), or with --format dra the DRA objects for them, read-only.
int PrintVgpuEntries(const ParsedCommand& cmd, const std::string& driver, std::ostream& out) {
  if (cmd.flags.Has("ids")) {
    std::cerr << "vfio-gpu-agent kubevirt-config: --ids names PCI ids, not vGPU types; --workload vm-vgpu reads the "
                 "host's vGPUs\n";
    return kExitUsage;
  }
  const std::string format = cmd.flags.Get("format", "kubevirt-patch");
  if (format != "kubevirt-patch" && format != "dra") {
    std::cerr << "vfio-gpu-agent kubevirt-config: --workload vm-vgpu prints a KubeVirt merge patch (--format "
                 "kubevirt-patch) or the DRA objects (--format dra): its mediatedDevices entries have no place in "
                 "Cozystack's gpu.permittedHostDevices values that the agent could check\n";
    return kExitUsage;
  }
  auto inventory = pci::Scan(cmd.common.paths.sysfs_root, {.detail_vendor = pci::kVendorNvidia, .driver_override = false});
  if (!inventory.ok()) {
    std::cerr << "vfio-gpu-agent kubevirt-config: " << inventory.status().message() << "\n";
    return kExitError;
  }
  const vgpu::Discovery discovery = validation::DiscoverVgpusReadOnly(
      cmd.common.paths.sysfs_root, *inventory,
      std::filesystem::path(cmd.flags.Get("state-dir", "/var/lib/vfio-gpu-agent")) / "vgpu-catalog.txt");
  bool none = false;
  if (format == "dra") {
    const auto models = validation::VgpuDraModels(discovery, cmd.common.resource_domain);
    out << validation::DraConfigYaml(models, driver);
    none = models.empty();
  } else {
    const auto entries = validation::VgpuPermittedEntries(discovery, *inventory, cmd.common.resource_domain);
    out << validation::VgpuKubevirtMergePatchYaml(entries);
    none = entries.empty();
  }
  if (none) {
    std::cerr << "vfio-gpu-agent kubevirt-config: no vGPU on this node (see `vfio-gpu-agent validate --workload "
                 "vm-vgpu --layers vgpu`)\n";
    return kExitNotReady;
  }
  return kExitOk;
}

}  // namespace

int RunKubevirtConfig(const std::vector<std::string>& args, std::ostream& out) {
  ParsedCommand cmd;
  if (auto exit = ParseCommand(
          "kubevirt-config",
          "Prints the permittedHostDevices.pciHostDevices entries KubeVirt needs for this node's GPUs, and its\n"
          "NVSwitches with --nvswitches (or for --ids): as Cozystack platform values, marking what Cozystack's\n"
          "default table already has, or as a merge patch for a plain KubeVirt CR. Read-only. Exit 1 when there\n"
          "is no GPU to describe. With --format dra: the DeviceClasses (one per GPU model, with the model's\n"
          "extended-resource name), a ResourceClaimTemplate per model for 1 and for all of its GPUs, and the\n"
          "VirtualMachine fields that use them (with --fabric-manager, a template per Fabric Manager partition size\n"
          "whose requests are tied to one partition). With --workload vm-vgpu: the entries for this node's vGPU types\n"
          "instead (mediatedDevices for mdev types, pciHostDevices for SR-IOV profiles) as a merge patch, or with\n"
          "--format dra the same DRA objects per vGPU type.",
          KubevirtConfigFlagSpecs(), args, out, &cmd)) {
    return *exit;
  }
  const std::string driver = cmd.flags.Get("dra-driver-name", std::string(dra::kDefaultDriverName));
  if (absl::Status valid = dra::ValidateDriverName(driver); !valid.ok()) {
    std::cerr << "vfio-gpu-agent kubevirt-config: --dra-driver-name: " << valid.message() << "\n";
    return kExitUsage;
  }
  if (cmd.common.workload == Workload::kVmVgpu) return PrintVgpuEntries(cmd, driver, out);
  const std::string format = cmd.flags.Get("format", "cozystack");
  if (format != "cozystack" && format != "kubevirt-patch" && format != "dra") {
    std::cerr << "vfio-gpu-agent kubevirt-config: --format \"" << format
              << "\" is not one of cozystack, kubevirt-patch, dra\n";
    return kExitUsage;
  }
  auto ids = cmd.flags.Has("ids") ? IdsFromFlags(cmd.flags) : IdsFromHost(cmd.common, format == "dra");
  if (!ids.ok()) {
    std::cerr << "vfio-gpu-agent kubevirt-config: " << ids.status().message() << "\n";
    return cmd.flags.Has("ids") ? kExitUsage : kExitError;
  }
  // pci.ids is read only for an id without a pinned or overridden name.
  auto db = LazyNameDatabase(cmd.common);
  names::NameResolver resolver(db.get(), cmd.common.resource_domain, cmd.common.name_overrides);
  bool none = false;
  if (format == "dra") {
    absl::StatusOr<std::set<int>> partition_sizes = PartitionSizes(cmd);
    if (!partition_sizes.ok()) {
      std::cerr << "vfio-gpu-agent kubevirt-config: " << partition_sizes.status().message() << "\n";
      return kExitError;
    }
    const auto models = validation::DraModels(*ids, resolver);
    out << validation::DraConfigYaml(models, driver, *partition_sizes, /*iommufd_classes=*/true);
    none = models.empty();
  } else {
    const auto entries = validation::PermittedEntries(*ids, resolver);
    out << (format == "cozystack" ? validation::CozystackValuesYaml(entries)
                                  : validation::KubevirtMergePatchYaml(entries));
    none = entries.empty();
  }
  if (none) {
    std::cerr << "vfio-gpu-agent kubevirt-config: no GPU selected on this node (see `vfio-gpu-agent inspect`)\n";
    return kExitNotReady;
  }
  return kExitOk;
}

}  // namespace vfio_agent::cli
