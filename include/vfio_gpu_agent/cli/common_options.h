// Options every subcommand shares, built from flags (or their VFIO_GPU_AGENT_* environment variables).
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "vfio_gpu_agent/cli/flags.h"
#include "vfio_gpu_agent/common/host_paths.h"
#include "vfio_gpu_agent/common/workload.h"
#include "vfio_gpu_agent/names/resource_names.h"
#include "vfio_gpu_agent/pci/selection.h"

namespace vfio_agent::cli {

struct CommonOptions {
  HostPaths paths;
  pci::SelectionPolicy policy;
  std::filesystem::path pci_ids;  // empty: first of names::DefaultPciIdsLocations() that exists
  // Loaded while parsing when --pci-ids names a file: a file the user named that cannot be read is a usage
  // error, never a quiet fallback to other names.
  std::shared_ptr<names::PciIdsDatabase> named_pci_ids;
  Workload workload = Workload::kVmPassthrough;
  std::string resource_domain = "nvidia.com";
  std::vector<names::NameOverride> name_overrides;
  bool json = false;
  std::string log_level = "info";
};

// The flags of CommonOptions; a command appends its own.
std::vector<FlagSpec> CommonFlagSpecs();

absl::StatusOr<CommonOptions> CommonOptionsFromFlags(const FlagValues& flags);

// This node's name, one rule for every command: --node-name, else NODE_NAME (the downward API). Never the host
// name: a Node, its slices' pool and its events must name the same object, and a host name differs from the
// Node's name on many clusters. NotFound naming both when neither is set: a command that writes to the API under
// the name refuses to start without it; one that only reads the host may go on without.
absl::StatusOr<std::string> NodeName(const FlagValues& flags);

// The --pci-ids database, or else the first of the default locations if it can be loaded: a missing default
// database only costs names (pinned names and hex ids still work), so it is logged, not fatal. May be null.
std::shared_ptr<names::PciIdsDatabase> LoadNameDatabase(const CommonOptions& options);

// For serve and run: the --pci-ids database, or else the default one loaded when a GPU without a pinned or
// overridden name first needs it, so a start on a node of Cozystack's GPUs never parses it. Never null.
std::shared_ptr<names::PciIdsDatabase> LazyNameDatabase(const CommonOptions& options);

}  // namespace vfio_agent::cli
