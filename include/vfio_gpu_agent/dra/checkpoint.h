// The driver's checkpoint as another process reads it: `validate` on a --bind-on-prepare node wants on vfio-pci
// only the functions a prepared claim holds, the others stay on their host drivers until a Prepare binds them; on a
// vm-vgpu node the profile applier keeps every vGPU a prepared claim holds, even before its VM opens it.
// One file per prepared claim, <plugins_dir>/<driver>/claims/<uid>.json, written by the driver (claims.h).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "vfio_gpu_agent/dra/driver.h"

namespace vfio_agent::dra {

struct CheckpointedClaim {
  std::string ref;                // "namespace/name (uid)"
  std::vector<std::string> bdfs;  // its GPUs (or SR-IOV vGPU VFs) and every function its Prepare bound, sorted
  std::vector<std::string> mdev_uuids;  // its mdev vGPUs, sorted
  std::vector<std::string> vgpu_vfs;    // its SR-IOV vGPUs (VF BDFs; also in bdfs), sorted
};

struct CheckpointRead {
  std::filesystem::path dir;                // <plugins_dir>/<driver>/claims
  std::vector<CheckpointedClaim> claims;    // this boot's, by file name
  std::vector<std::string> other_boot;      // files of another boot: the agent discards them at its start
  std::vector<std::string> unreadable;      // "<file>: <why>"
};

// <plugins_dir>/<driver>/claims
std::filesystem::path CheckpointDir(const DriverOptions& options);

// The claims the checkpoint holds for this boot (options.paths.proc_root's boot_id). No directory: no claim. An
// error only when the boot ID or the directory cannot be read.
absl::StatusOr<CheckpointRead> ReadCheckpoint(const DriverOptions& options);

}  // namespace vfio_agent::dra
