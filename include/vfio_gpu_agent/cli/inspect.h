// `inspect`: what the node will advertise and what binding would do, as a report (text or JSON).
#pragma once

#include <filesystem>
#include <string>

#include "absl/status/statusor.h"
#include "report/v1/inspect.pb.h"
#include "vfio_gpu_agent/cli/common_options.h"

namespace vfio_agent::cli {

inline constexpr const char* kInspectSchema = "vfio-gpu-agent.inspect/v1";

// Reads the host (read-only) and builds the report. Fails only when the PCI device list cannot be read.
// --workload vm-vgpu: nothing is bound on such a node (the GPUs stay on nvidia, the vGPU manager), so every function
// STAYS and the report lists the vGPUs the node serves instead; `vgpu_catalog_file` (the agent's state dir's
// vgpu-catalog.txt, read, never written) names the SR-IOV vGPUs of cards that are full.
absl::StatusOr<report::v1::InspectReport> BuildInspectReport(const CommonOptions& options,
                                                             const names::PciIdsDatabase* db,
                                                             const std::filesystem::path& vgpu_catalog_file = {});

// The vm-vgpu part of a report as text: the vGPUs served, one line each, and the problems.
std::string FormatVgpusText(const report::v1::InspectReport& report);

// The flag both `inspect` and `bind` take for the catalog file, and the file it names.
inline constexpr const char* kStateDirFlag = "state-dir";
std::filesystem::path VgpuCatalogFile(const FlagValues& flags);

std::string FormatInspectText(const report::v1::InspectReport& report);
std::string FormatInspectJson(const report::v1::InspectReport& report);

}  // namespace vfio_agent::cli
