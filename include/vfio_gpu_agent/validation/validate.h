// `vfio-gpu-agent validate`: runs the layers of checks (check.h) against one host and turns them into a report
// (proto/report/v1/validate.proto), printed for humans or as JSON, and into the GPU Operator's status files.
#pragma once

#include <chrono>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "report/v1/validate.pb.h"
#include "vfio_gpu_agent/validation/check.h"
#include "vfio_gpu_agent/validation/dra_checks.h"

namespace vfio_agent::validation {

inline constexpr const char* kValidateSchema = "vfio-gpu-agent.validate/v1";

struct ValidateOptions {
  HostPaths paths;  // paths.pod_resources_socket is the kubelet layer's socket
  pci::SelectionPolicy policy;
  std::string resource_domain = "nvidia.com";
  std::vector<names::NameOverride> name_overrides;
  const names::PciIdsDatabase* pci_ids = nullptr;  // may be null: pinned names and hex ids still work
  std::set<Layer> layers = {Layer::kPlatform, Layer::kDevices, Layer::kPlugin, Layer::kKubelet,
                            Layer::kKubevirt, Layer::kApi,     Layer::kFabric,  Layer::kVgpu};
  std::optional<std::filesystem::path> status_dir;  // write the status files there (needs both host layers)
  std::optional<std::string> kubevirt_cr;            // text of a KubeVirt CR
  std::optional<KubevirtCrUnavailable> kubevirt_cr_unavailable;  // the API gave no CR (wins over kubevirt_cr)
  std::optional<AdmissionPolicyRead> admission_policy;  // the api layer's reads; nullopt: no cluster
  std::optional<FabricRead> fabric;  // the fabric layer's read; nullopt: no --fabric-manager
  // A DRA node (--kubelet-api dra): the plugin and kubelet layers check the DRA driver and its ResourceSlices
  // instead of device-plugin sockets and pod-resources, and the kubevirt layer also the DRA feature gates.
  std::optional<DraValidation> dra;
  // The device plugin's --vfio-backend, as the agent runs with it (not on a DRA node).
  plugin::VfioBackendChoice vfio_backend = plugin::VfioBackendChoice::kAuto;
  std::chrono::milliseconds rpc_wait{2000};          // bound on each plugin / pod-resources exchange
  // vm-vgpu (issue 19): the vgpu layer replaces devices, the plugin and kubelet layers expect the vGPUs, the
  // KubeVirt layer their permittedHostDevices entries, and --status-dir gets the vGPU status files.
  Workload workload = Workload::kVmPassthrough;
  std::filesystem::path vgpu_catalog_file;  // the agent's <state-dir>/vgpu-catalog.txt: read, never written
  std::optional<std::filesystem::path> vgpu_config_file;  // with vgpu_config: the profiles to compare
  std::string vgpu_config;                                 // the config's name (nvidia.com/vgpu.config)
};

// "platform,devices" -> those layers; "all" -> every layer (api included).
absl::StatusOr<std::set<Layer>> ParseLayers(std::string_view text);

// Scans the host read-only and runs the selected layers. Fails only when the PCI device list cannot be read
// (the host could not be read at all) or the status files could not be written.
absl::StatusOr<report::v1::ValidateReport> Validate(const ValidateOptions& options);

// Layers 1-2 have no failure: the condition for `vfio-pci-ready`.
bool HostReady(const std::vector<Check>& checks);

report::v1::ValidateReport MakeReport(const std::vector<Check>& checks, const std::set<Layer>& layers,
                                      const HostPaths& paths);

// Grouped by layer, one line per check; evidence and fix indented below every check that did not pass (and
// below skips, the reason); a summary line.
std::string FormatValidateText(const report::v1::ValidateReport& report);
std::string FormatValidateJson(const report::v1::ValidateReport& report);

}  // namespace vfio_agent::validation
