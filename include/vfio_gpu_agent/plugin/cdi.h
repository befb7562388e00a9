// Optional CDI output (--cdi): one spec file per resource in the CDI directory, one CDI device per GPU,
// so runtimes that apply CDI edits get the same device nodes as the classic DeviceSpecs.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "vfio_gpu_agent/plugin/devices.h"

namespace vfio_agent::plugin {

// "nvidia.com/GH100_H200_SXM_141GB", "0000:3b:00.0" -> "nvidia.com/GH100_H200_SXM_141GB=0000:3b:00.0".
std::string CdiDeviceName(std::string_view resource_name, std::string_view device_id);

// <cdi_dir>/vfio-gpu-agent_<vendor>_<class>.json
std::filesystem::path CdiSpecPath(const std::filesystem::path& cdi_dir, std::string_view resource_name);

// The spec as JSON (device nodes only), a pure function of the devices and the node's set (allocate.h: the same
// nodes as Allocate; a device the set gives no nodes is left out, its Allocate fails naming why). cdiVersion is the
// least version its content needs: 0.5.0 for BDF device names (a digit first), 0.6.0 when the class has a '.'.
std::string CdiSpecJson(const ResourceDevices& resource, pci::VfioNodeSet node_set, bool host_iommufd);

// Writes the spec atomically (temporary file, then rename), mode 0644. InvalidArgument, and no file, when the
// resource name is not a valid CDI kind (a class starting with a digit, such as a hex-id fallback name).
absl::Status WriteCdiSpec(const std::filesystem::path& cdi_dir, const ResourceDevices& resource,
                          pci::VfioNodeSet node_set, bool host_iommufd);

}  // namespace vfio_agent::plugin
