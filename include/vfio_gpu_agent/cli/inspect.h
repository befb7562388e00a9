// `inspect`: what the node will advertise and what binding would do, as a report (text or JSON).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "report/v1/inspect.pb.h"
#include "vfio_gpu_agent/cli/common_options.h"

namespace vfio_agent::cli {

inline constexpr const char* kInspectSchema = "vfio-gpu-agent.inspect/v1";

// Reads the host (read-only) and builds the report. Fails only when the PCI device list cannot be read.
absl::StatusOr<report::v1::InspectReport> BuildInspectReport(const CommonOptions& options,
                                                             const names::PciIdsDatabase* db);

std::string FormatInspectText(const report::v1::InspectReport& report);
std::string FormatInspectJson(const report::v1::InspectReport& report);

}  // namespace vfio_agent::cli
