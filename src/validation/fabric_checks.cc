// Layer 7: shared-NVSwitch mode, as Fabric Manager itself reports it.
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "check_builder.h"
#include "vfio_gpu_agent/fabric/fm_client.h"
#include "vfio_gpu_agent/fabric/nvfm_api.h"
#include "vfio_gpu_agent/validation/check.h"

namespace vfio_agent::validation {
namespace {

using internal::CheckBuilder;
constexpr Layer kFabricLayer = Layer::kFabric;

bool IsNvSwitchFunction(const pci::Function& fn) {
  return fn.vendor_id == pci::kVendorNvidia && (fn.class_code >> 8) == (pci::kClassBridgeOther >> 8);
}

std::vector<Check> SkipRest(std::vector<Check> out, const std::string& why) {
  for (const char* id : {"fabric.partitions", "fabric.gpus", "fabric.nvswitches"}) {
    out.push_back(CheckBuilder(id, kFabricLayer, "node").Skip(why));
  }
  return out;
}

}  // namespace

std::vector<Check> FabricChecks(const NodeView& node, const std::optional<FabricRead>& read) {
  std::vector<Check> out;
  if (!read) {
    CheckBuilder check("fabric.reachable", kFabricLayer, "node");
    return SkipRest({check.Skip("not checked: no --fabric-manager (shared-NVSwitch mode not in use on this node)")},
                    "not checked: no --fabric-manager");
  }
  CheckBuilder reachable("fabric.reachable", kFabricLayer, read->address);
  reachable.Saw(absl::StrCat("Fabric Manager ", read->address),
                read->table.ok() ? absl::StrCat(read->table->partitions().size(), " supported partitions")
                                 : std::string(read->table.status().message()));
  if (!read->table.ok()) {
    const std::optional<int> code = fabric::FmReturnOf(read->table.status());
    std::string fix;
    if (code == fabric::nvfm::kNotSupported) {
      fix = "Set FABRIC_MODE=1 (shared NVSwitch) in /usr/share/nvidia/nvswitch/fabricmanager.cfg and restart "
            "nvidia-fabricmanager; FABRIC_MODE=0 is full passthrough, where the VM runs FM (use --nvswitches "
            "instead of --fabric-manager)";
    } else if (code == fabric::nvfm::kNotConfigured || code == fabric::nvfm::kNotReady) {
      fix = "Fabric Manager is still starting: wait, then look at `journalctl -u nvidia-fabricmanager`";
    } else if (code == fabric::nvfm::kVersionMismatch) {
      fix = "Install the libnvfm of the same driver branch as the running Fabric Manager (nvidia-fabricmanager "
            "package of the node's driver version)";
    } else if (code == fabric::nvfm::kUninitialized) {
      fix = "The address is not FM's command socket: set FM_CMD_UNIX_SOCKET_PATH in fabricmanager.cfg and pass "
            "that path";
    } else if (!code) {
      fix = "Install Fabric Manager's client library (libnvfm.so.1, nvidia-fabricmanager package), or pass "
            "--fabric-library";
    } else {
      fix = "Start nvidia-fabricmanager (`systemctl status nvidia-fabricmanager`) and check the address: "
            "FM_CMD_UNIX_SOCKET_PATH (unix:PATH) or FM_CMD_BIND_INTERFACE:FM_CMD_PORT_NUMBER (host:port)";
    }
    out.push_back(reachable.Fail("Fabric Manager does not answer as shared-NVSwitch mode needs", fix));
    return SkipRest(std::move(out), "not checked: Fabric Manager did not answer");
  }
  out.push_back(reachable.Pass("Fabric Manager answers in shared-NVSwitch mode"));
  const fabric::PartitionTable& table = *read->table;

  CheckBuilder partitions("fabric.partitions", kFabricLayer, "node");
  std::vector<std::string> listed, active;
  for (const fabric::Partition& partition : table.partitions()) {
    listed.push_back(fabric::Describe(partition));
    if (partition.active) active.push_back(fabric::Describe(partition));
  }
  partitions.Saw("fmGetSupportedFabricPartitions (minus unsupported)", listed.empty() ? "(none)" : absl::StrJoin(listed, " "));
  partitions.Saw("active", active.empty() ? "(none)" : absl::StrJoin(active, " "));
  if (listed.empty()) {
    out.push_back(partitions.Fail("Fabric Manager supports no partition on this board",
                                  "Check `fmpm -l` and FM's log: a degraded board (NVLink or switch faults) can "
                                  "leave no partition supported"));
  } else {
    out.push_back(partitions.Pass(absl::StrCat(listed.size(), " partitions of ", absl::StrJoin(table.Sizes(), ", "),
                                               " GPUs; ", active.size(), " active")));
  }

  CheckBuilder gpus("fabric.gpus", kFabricLayer, "node");
  std::vector<std::string> outside;
  std::vector<std::string> selected;
  if (node.selection != nullptr) {
    for (const std::string& bdf : node.selection->gpus) {
      if (node.selection->RoleOf(bdf) != pci::Role::kGpu) continue;
      selected.push_back(bdf);
      if (!table.Contains(bdf)) outside.push_back(bdf);
    }
  }
  gpus.Saw("selected GPUs", selected.empty() ? "(none)" : absl::StrJoin(selected, ","));
  if (!outside.empty()) {
    out.push_back(gpus.Fail(absl::StrCat("in no supported partition (advertised Unhealthy): ", absl::StrJoin(outside, ",")),
                            "A GPU outside every partition cannot get its fabric set up; check that FM sees it "
                            "(`fmpm -l` lists each partition's pciBusId) and that it is on this board"));
  } else {
    out.push_back(gpus.Pass(absl::StrCat("every selected GPU (", selected.size(), ") is in a supported partition")));
  }

  CheckBuilder switches("fabric.nvswitches", kFabricLayer, "node");
  std::vector<std::string> seen, on_vfio;
  if (node.inventory != nullptr) {
    for (const pci::Function& fn : node.inventory->functions()) {
      if (!IsNvSwitchFunction(fn)) continue;
      seen.push_back(absl::StrCat(fn.bdf, " on ", fn.driver.empty() ? "(no driver)" : fn.driver));
      if (pci::IsVfioDriver(fn.driver)) on_vfio.push_back(fn.bdf);
    }
  }
  switches.Saw("NVSwitch functions (10de, class 0680)", seen.empty() ? "(none)" : absl::StrJoin(seen, ", "));
  if (!on_vfio.empty()) {
    out.push_back(switches.Fail(absl::StrCat("NVSwitches on vfio in shared-NVSwitch mode: ", absl::StrJoin(on_vfio, ",")),
                                "In shared mode the switches stay with Fabric Manager on the host: `vfio-gpu-agent "
                                "unbind` them (and do not pass --nvswitches), then restart nvidia-fabricmanager"));
  } else {
    out.push_back(switches.Pass(seen.empty() ? "no NVSwitch function visible" : "the NVSwitches stay on the host driver"));
  }
  return out;
}

}  // namespace vfio_agent::validation
