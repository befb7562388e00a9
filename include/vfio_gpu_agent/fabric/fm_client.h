// A connection to NVIDIA Fabric Manager (shared-NVSwitch mode, FABRIC_MODE=1), the calls the agent makes.
// Errors carry FM's return code (FmReturnOf) and name the call, the partition and FM's status.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "vfio_gpu_agent/fabric/partitions.h"

namespace vfio_agent::fabric {

class FmClient {
 public:
  virtual ~FmClient() = default;
  // The supported partitions (fmGetSupportedFabricPartitions minus fmGetUnsupportedFabricPartitions), with
  // their GPUs by PCI address and FM's active flag.
  virtual absl::StatusOr<PartitionTable> Partitions() = 0;
  virtual absl::Status Activate(uint32_t partition) = 0;
  virtual absl::Status Deactivate(uint32_t partition) = 0;
  // What FM must be told after it restarted (fmSetActivatedFabricPartitions), an empty list included.
  virtual absl::Status SetActivated(const std::vector<uint32_t>& partitions) = 0;
};

// FM's return code carried by a status from an FmClient; nullopt for a status that did not come from FM.
std::optional<int> FmReturnOf(const absl::Status& status);
// True when the connection is no use any more (FM restarted or went away): reconnect before the next call.
bool ConnectionLost(const absl::Status& status);

struct NvfmOptions {
  // "unix:/run/nvidia-fabricmanager/socket", a socket path, or "host:port" (TCP; port 6666 when omitted).
  std::string address;
  // dlopen()ed by this name: the SONAME on a node with FM installed, a path in tests.
  std::filesystem::path library = "libnvfm.so.1";
  std::chrono::milliseconds connect_timeout{3000};
};

// The address as FM's connect call takes it; InvalidArgument for an empty or over-long one.
struct FmAddress {
  std::string info;  // a path, or "<ip>:<port>"
  bool unix_socket = false;
};
absl::StatusOr<FmAddress> ParseFmAddress(std::string_view address);

// Loads the library (once per process and path, with fmLibInit) and connects.
absl::StatusOr<std::unique_ptr<FmClient>> ConnectNvfm(const NvfmOptions& options);

}  // namespace vfio_agent::fabric
