// What a DRA node's GPUs need at the API server (`vfio-gpu-agent kubevirt-config --format dra`, and the
// DeviceClasses of daemonset/overlays/dra): a DeviceClass per GPU model that selects the driver's devices of that
// model and carries the model's extended-resource name (so, with DRAExtendedResource, a VM asking for
// `deviceName: nvidia.com/<NAME>` keeps working), a ResourceClaimTemplate per model for 1 GPU and for all of the
// node's GPUs of that model, and the VirtualMachine fields that use them.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "vfio_gpu_agent/names/resource_names.h"
#include "vfio_gpu_agent/vgpu/discovery.h"

namespace vfio_agent::validation {

struct DraModel {
  std::string resource_name;  // "nvidia.com/GH100_H200_SXM_141GB", as the device plugin would advertise it
  int gpus = 0;               // GPUs (vGPUs) of this model on the node (the N of the N-GPU claim template)
};

// One model per distinct resource name among `ids` (one entry per GPU), in name order, named by `names` exactly as
// the device plugin and the DRA driver's resourceName attribute name them.
std::vector<DraModel> DraModels(const std::vector<std::pair<uint16_t, uint16_t>>& ids,
                                const names::NameResolver& names);

// vm-vgpu: one model per vGPU resource name among the node's vGPUs ("nvidia.com/GRID_T4-1Q", as the device plugin
// advertises the type and the DRA driver's resourceName attribute carries it), in name order, counting them. A type
// whose name gives no valid resource name is left out (it is neither advertised nor published).
std::vector<DraModel> VgpuDraModels(const vgpu::Discovery& discovery, std::string_view domain);

// "gh100-h200-sxm-141gb.gpu.vfio-agent.cozystack.io": the name part lower-cased with '_' and '.' as '-', under
// the driver's name (a DNS subdomain, as object names must be, that says whose devices the class selects).
std::string DeviceClassName(const std::string& resource_name, const std::string& driver);
// "gh100-h200-sxm-141gb-iommufd.gpu.vfio-agent.cozystack.io": the same GPUs for a claim that wants the iommufd
// nodes (dra/vfio_backend.h); it has no extendedResourceName (the legacy class keeps the model's).
std::string IommufdDeviceClassName(const std::string& resource_name, const std::string& driver);

// device.driver == "<driver>" && device.attributes["<driver>"].resourceName == "<NAME>"
std::string DeviceClassSelector(const std::string& resource_name, const std::string& driver);

// The DeviceClasses alone (one YAML document each, resource.k8s.io/v1); with `iommufd_classes` (whole GPUs: an
// mdev has no iommufd cdev) each model's iommufd class after its legacy one.
std::string DeviceClassesYaml(const std::vector<DraModel>& models, const std::string& driver,
                              bool iommufd_classes = false);

// The DeviceClasses, the ResourceClaimTemplates, and the VirtualMachine snippets both ways (claims, and the
// unchanged deviceName through the class's extendedResourceName) as YAML comments after the last document, so
// the whole output can be given to `kubectl apply -n <VM namespace> -f -`. With Fabric Manager's
// `partition_sizes` (HGX shared NVSwitch), the multi-GPU templates are one per partition size, their requests tied
// by `constraints: [{requests: [...], matchAttribute: <driver>/partition<N>}]`.
std::string DraConfigYaml(const std::vector<DraModel>& models, const std::string& driver,
                          const std::set<int>& partition_sizes = {}, bool iommufd_classes = false);

}  // namespace vfio_agent::validation
