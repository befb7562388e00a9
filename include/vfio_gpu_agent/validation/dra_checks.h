// `validate --kubelet-api dra`: the links of a DRA node's chain in place of the device plugin's. In the plugin
// layer, the driver as the kubelet sees it (its registration socket answers GetInfo with our name, type and
// endpoint; the kubelet accepted it; the CDI spec directory is usable); in the kubelet layer, what the scheduler
// sees (the node's ResourceSlices hold exactly the devices the driver publishes here: the selected GPUs, or on a
// vm-vgpu node the vGPUs it serves; a DeviceClass selects the driver); in the
// kubevirt layer, GPUsWithDRA and HostDevicesWithDRA not disabled.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "vfio_gpu_agent/dra/driver.h"
#include "vfio_gpu_agent/validation/check.h"

namespace vfio_agent::validation {

// One list read from the API server: the request (evidence) and the body, or why there is none.
struct ApiListRead {
  std::string request;
  absl::StatusOr<std::string> body;
};

struct DraValidation {
  dra::DriverOptions driver;           // driver_name, registry_dir, plugins_dir, cdi_dir, bind_on_prepare
  std::optional<ApiListRead> slices;   // the node's ResourceSlices; nullopt: no cluster
  std::optional<ApiListRead> classes;  // the DeviceClasses; nullopt: no cluster
};

// What the driver publishes on this node now, by the driver's own functions: one device per selected GPU
// (dra::BuildDevices, under dra.driver.bind_on_prepare), or on a vm-vgpu node one per vGPU it serves
// (dra::BuildVgpuDevices over node.vgpu's discovery).
struct DraExpectedDevices {
  std::vector<std::string> names;     // device names, sorted
  std::map<std::string, std::string> unhealthy;  // name -> why the driver taints it (its health rule)
  std::vector<std::string> problems;  // vm-vgpu: the vGPUs not served, and why (vgpu::ServedVgpus::problems)
  bool vgpus = false;
};
DraExpectedDevices ExpectedDraDevices(const NodeView& node, const DraValidation& dra, const names::NameResolver& names,
                                      const names::PciIdsDatabase* pci_ids);

std::vector<Check> DraDriverChecks(const DraValidation& dra, std::chrono::milliseconds rpc_wait);
std::vector<Check> DraSliceChecks(const DraExpectedDevices& expected, const DraValidation& dra);
// `kubevirt_cr`: the CR's text; nullopt when none was read (the check is skipped).
std::vector<Check> DraKubevirtChecks(const std::optional<std::string>& kubevirt_cr);

}  // namespace vfio_agent::validation
