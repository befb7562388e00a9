// The ResourceSlice attribute names the DRA driver publishes and everything that selects on them uses
// (DeviceClass CEL selectors printed by `kubevirt-config --format dra` and shipped in daemonset/overlays/dra, and
// `validate`'s DRA layer): one definition, so a selector can never name an attribute the driver does not write.
#pragma once

#include <string>
#include <string_view>

namespace vfio_agent::dra {

// Standard attributes (k8s.io/dynamic-resource-allocation/deviceattribute; numaNode from KEP-6072, as NVIDIA's
// driver publishes it): the full name is the key.
inline constexpr std::string_view kPciBusIdAttribute = "resource.kubernetes.io/pciBusID";
inline constexpr std::string_view kPcieRootAttribute = "resource.kubernetes.io/pcieRoot";
inline constexpr std::string_view kNumaNodeAttribute = "resource.kubernetes.io/numaNode";
// This driver's own attributes, keyed "<driver name>/<attribute>" (CEL: device.attributes["<driver>"].resourceName).
inline constexpr std::string_view kResourceNameAttribute = "resourceName";  // "GH100_H200_SXM_141GB", as the plugin
inline constexpr std::string_view kProductNameAttribute = "productName";    // pci.ids, at most 64 characters
inline constexpr std::string_view kVendorIdAttribute = "vendorID";          // "0x10de"
inline constexpr std::string_view kDeviceIdAttribute = "deviceID";          // "0x2335"
inline constexpr std::string_view kIommuGroupAttribute = "iommuGroup";      // int
// vGPUs (vm-vgpu nodes). mdevUUID is bare, unqualified, in the slice and in the KEP-5304 metadata: the one key
// KubeVirt's virt-launcher reads an mdev from (an SR-IOV vGPU is a PCI device to it: pciBusID of the VF).
inline constexpr std::string_view kMdevUuidAttribute = "mdevUUID";
inline constexpr std::string_view kVgpuTypeAttribute = "vgpuType";             // "GRID T4-1Q", the type's own name
inline constexpr std::string_view kParentPciBusIdAttribute = "parentPciBusID";  // the GPU (or VF) an mdev lives on
// With --fabric-manager (HGX shared-NVSwitch mode): "partition<N>" (int, Fabric Manager's partition id) for each
// partition size N that holds the GPU, the names NVIDIA's driver uses. A claim of N single-device requests tied by
// `constraints: [{matchAttribute: <driver>/partition<N>}]` gets the N GPUs of one partition, which Prepare activates.
inline constexpr std::string_view kPartitionAttributePrefix = "partition";
inline std::string PartitionAttribute(int size) { return std::string(kPartitionAttributePrefix) + std::to_string(size); }

}  // namespace vfio_agent::dra
