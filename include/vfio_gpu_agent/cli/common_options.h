// Options every subcommand shares, built from flags (or their VFIO_GPU_AGENT_* environment variables).
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "vfio_gpu_agent/cli/flags.h"
#include "vfio_gpu_agent/common/host_paths.h"
#include "vfio_gpu_agent/names/resource_names.h"
#include "vfio_gpu_agent/pci/selection.h"

namespace vfio_agent::cli {

struct CommonOptions {
  HostPaths paths;
  pci::SelectionPolicy policy;
  std::filesystem::path pci_ids;  // empty: first of names::DefaultPciIdsLocations() that exists
  std::string resource_domain = "nvidia.com";
  std::vector<names::NameOverride> name_overrides;
  bool json = false;
  std::string log_level = "info";
};

// The flags of CommonOptions; a command appends its own.
std::vector<FlagSpec> CommonFlagSpecs();

absl::StatusOr<CommonOptions> CommonOptionsFromFlags(const FlagValues& flags);

// Loads pci.ids if it can; a missing database only costs names (pinned names and hex ids still work),
// so it is logged, not fatal. The returned pointer may be null.
std::unique_ptr<names::PciIdsDatabase> LoadNameDatabase(const CommonOptions& options);

// For serve and run: pci.ids is loaded when a GPU without a pinned or overridden name first needs it, so a start
// on a node of Cozystack's GPUs never parses it. Never null; a --pci-ids that does not exist is reported now.
std::unique_ptr<names::PciIdsDatabase> LazyNameDatabase(const CommonOptions& options);

}  // namespace vfio_agent::cli
