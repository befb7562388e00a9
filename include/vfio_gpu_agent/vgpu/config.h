// vGPU profiles from a config file in the format of NVIDIA's vgpu-device-manager (`version: v1`,
// `vgpu-configs: {<name>: [{devices: all | [indices], device-filter, vgpu-devices: {<type>: <count>}}]}`), and the
// difference between what a GPU holds and what its config asks for.
//
// Types are named as vgpu-device-manager names them: the last word of the type's name ("NVIDIA A10-4Q" -> "A10-4Q",
// "GRID T4-1Q" -> "T4-1Q"). A GPU index is its position among the node's NVIDIA display and 3D controllers that are
// physical functions, in PCI address order (as go-nvlib's nvpci lists them).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace vfio_agent::vgpu {

struct ConfigEntry {
  std::optional<std::vector<int>> devices;  // nullopt: `devices: all`
  // `device-filter`: PCI ids as vgpu-device-manager writes them, device << 16 | vendor ("0x1EB810DE" is a T4);
  // empty matches every GPU.
  std::vector<uint32_t> device_filter;
  std::map<std::string, int> vgpu_devices;  // short type name -> count (> 0); empty: no vGPU on these GPUs
};

struct VgpuConfigFile {
  std::map<std::string, std::vector<ConfigEntry>> configs;  // by config name (the nvidia.com/vgpu.config label)
};

// Refuses what vgpu-device-manager refuses (a version other than v1, an unknown field, an empty config, `devices`
// neither "all" nor a list of indices, a malformed type name, a count below 1, time-sliced and MIG-backed types
// on one GPU), with the config name and entry index in the message.
absl::StatusOr<VgpuConfigFile> ParseVgpuConfig(std::string_view yaml);
absl::StatusOr<VgpuConfigFile> LoadVgpuConfig(const std::filesystem::path& file);

// "NVIDIA A10-4Q" -> "A10-4Q": the key a config uses for a type.
std::string ShortTypeName(std::string_view type_name);

struct ConfigGpu {
  int index = 0;  // see the header comment
  std::string bdf;
  uint16_t vendor_id = 0;
  uint16_t device_id = 0;
};

// What config `name` asks of each GPU, by BDF (a GPU no entry matches is absent: the config leaves it alone).
// NotFound for an unknown config name; InvalidArgument naming the GPU and both entries when two entries match one
// GPU (vgpu-device-manager would apply whichever came last).
absl::StatusOr<std::map<std::string, std::map<std::string, int>>> DesiredTypes(const VgpuConfigFile& file,
                                                                              std::string_view name,
                                                                              const std::vector<ConfigGpu>& gpus);

// One vGPU that exists on a GPU: an mdev (id = UUID) or an SR-IOV vGPU (id = VF BDF).
struct ExistingVgpu {
  std::string id;
  std::string type;  // short type name
  bool held = false;  // a running VM holds it (its /dev/vfio/<group> open, or allocated in pod-resources)
};

struct GpuChange {
  std::vector<std::string> remove;     // ids to delete: surplus or unwanted types, never a held one, sorted
  std::map<std::string, int> create;   // type -> instances to create
  std::vector<std::string> deferred;   // held ids the config wants gone: removed once freed, sorted
  bool empty() const { return remove.empty() && create.empty() && deferred.empty(); }
};

// Reconcile, not rebuild: only the difference between `existing` and `desired` is changed; of a type with too many
// instances the free ones go first. Creations that need room a held vGPU still takes are not planned until it is
// freed (the GPU's capacity is the driver's to tell: a create that fails for room is retried on the next pass).
GpuChange PlanGpu(const std::vector<ExistingVgpu>& existing, const std::map<std::string, int>& desired);

}  // namespace vfio_agent::vgpu
