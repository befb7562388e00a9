#include <cstring>
#include <map>
#include <mutex>
#include <set>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "vfio_gpu_agent/common/runtime_library.h"
#include "vfio_gpu_agent/fabric/fm_client.h"
#include "vfio_gpu_agent/fabric/nvfm_api.h"

namespace vfio_agent::fabric {
namespace nvfm {

const char* ReturnName(Return code) {
  switch (code) {
    case kSuccess: return "FM_ST_SUCCESS";
    case kBadParam: return "FM_ST_BADPARAM";
    case kGenericError: return "FM_ST_GENERIC_ERROR";
    case kNotSupported: return "FM_ST_NOT_SUPPORTED";
    case kUninitialized: return "FM_ST_UNINITIALIZED";
    case kTimeout: return "FM_ST_TIMEOUT";
    case kVersionMismatch: return "FM_ST_VERSION_MISMATCH";
    case kInUse: return "FM_ST_IN_USE";
    case kNotConfigured: return "FM_ST_NOT_CONFIGURED";
    case kConnectionNotValid: return "FM_ST_CONNECTION_NOT_VALID";
    case kNvlinkError: return "FM_ST_NVLINK_ERROR";
    case kNotReady: return "FM_ST_NOT_READY";
    default: return nullptr;
  }
}

}  // namespace nvfm

namespace {

constexpr char kFmReturnPayload[] = "type.vfio-gpu-agent/fm-return";

// What each code means for the agent, in the words an operator acts on.
const char* Meaning(nvfm::Return code) {
  switch (code) {
    case nvfm::kNotSupported: return "not supported: Fabric Manager is not in shared-NVSwitch mode (FABRIC_MODE=1) or there is no fabric";
    case nvfm::kNotConfigured: return "Fabric Manager is still initialising";
    case nvfm::kNotReady: return "Fabric Manager is not ready";
    case nvfm::kUninitialized: return "not initialised (inactive partition, or a socket that is not FM's command socket)";
    case nvfm::kVersionMismatch: return "libnvfm and Fabric Manager versions differ";
    case nvfm::kInUse: return "in use (already active)";
    case nvfm::kConnectionNotValid: return "the connection is no longer valid (Fabric Manager restarted)";
    case nvfm::kNvlinkError: return "NVLink error";
    case nvfm::kTimeout: return "timed out";
    default: return "";
  }
}

absl::StatusCode CodeFor(nvfm::Return code) {
  switch (code) {
    case nvfm::kConnectionNotValid:
    case nvfm::kTimeout:
    case nvfm::kNotConfigured:
    case nvfm::kNotReady: return absl::StatusCode::kUnavailable;
    case nvfm::kBadParam: return absl::StatusCode::kInvalidArgument;
    case nvfm::kNotSupported:
    case nvfm::kUninitialized:
    case nvfm::kInUse:
    case nvfm::kVersionMismatch: return absl::StatusCode::kFailedPrecondition;
    default: return absl::StatusCode::kInternal;
  }
}

absl::Status FmError(nvfm::Return code, std::string_view call) {
  const char* name = nvfm::ReturnName(code);
  const std::string label = name != nullptr ? name : absl::StrCat("FM_ST_", code);
  const std::string meaning = Meaning(code);
  absl::Status status(CodeFor(code), absl::StrCat(std::string(call), ": ", label, meaning.empty() ? "" : absl::StrCat(" (", meaning, ")")));
  status.SetPayload(kFmReturnPayload, absl::Cord(std::to_string(code)));
  return status;
}

struct Library {
  nvfm::LibInitFn init = nullptr;
  nvfm::ConnectFn connect = nullptr;
  nvfm::DisconnectFn disconnect = nullptr;
  nvfm::GetSupportedFn supported = nullptr;
  nvfm::GetUnsupportedFn unsupported = nullptr;
  nvfm::ActivateFn activate = nullptr;
  nvfm::DeactivateFn deactivate = nullptr;
  nvfm::SetActivatedFn set_activated = nullptr;
};

// One per path for the process, as if linked: fmLibInit once, never shut down (other connections may live).
absl::StatusOr<const Library*> LoadLibrary(const std::filesystem::path& path) {
  static std::mutex mu;
  static std::map<std::filesystem::path, Library> loaded;
  std::lock_guard lock(mu);
  if (auto it = loaded.find(path); it != loaded.end()) return &it->second;
  absl::StatusOr<RuntimeLibrary> library = RuntimeLibrary::Open(path.c_str());
  if (!library.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("Fabric Manager client library ", path.string(),
                                                      " not loadable (install the fabric manager package of the "
                                                      "node's driver version): ", library.status().message()));
  }
  Library fns;
  library->Resolve(fns.init, "fmLibInit");
  library->Resolve(fns.connect, "fmConnect");
  library->Resolve(fns.disconnect, "fmDisconnect");
  library->Resolve(fns.supported, "fmGetSupportedFabricPartitions");
  library->Resolve(fns.unsupported, "fmGetUnsupportedFabricPartitions");
  library->Resolve(fns.activate, "fmActivateFabricPartition");
  library->Resolve(fns.deactivate, "fmDeactivateFabricPartition");
  library->Resolve(fns.set_activated, "fmSetActivatedFabricPartitions");
  if (absl::Status complete = library->Complete(); !complete.ok()) return complete;
  if (nvfm::Return rc = fns.init(); rc != nvfm::kSuccess) return FmError(rc, "fmLibInit");
  return &loaded.emplace(path, fns).first->second;
}

class NvfmClient final : public FmClient {
 public:
  NvfmClient(const Library* library, nvfm::Handle handle, std::string address)
      : lib_(library), handle_(handle), address_(std::move(address)) {}
  ~NvfmClient() override { lib_->disconnect(handle_); }

  absl::StatusOr<PartitionTable> Partitions() override {
    // 129 KiB: on the heap, not on a gRPC thread's stack.
    auto list = std::make_unique<nvfm::PartitionList>();
    std::memset(list.get(), 0, sizeof(*list));
    list->version = nvfm::kPartitionListVersion;
    if (nvfm::Return rc = lib_->supported(handle_, list.get()); rc != nvfm::kSuccess) {
      return FmError(rc, "fmGetSupportedFabricPartitions");
    }
    auto unsupported = std::make_unique<nvfm::UnsupportedPartitionList>();
    std::memset(unsupported.get(), 0, sizeof(*unsupported));
    unsupported->version = nvfm::kUnsupportedPartitionListVersion;
    std::set<uint32_t> excluded;
    // NOT_SUPPORTED: a library or FM that cannot tell; every listed partition is then taken as supported.
    if (nvfm::Return rc = lib_->unsupported(handle_, unsupported.get()); rc == nvfm::kSuccess) {
      for (unsigned int i = 0; i < std::min<unsigned int>(unsupported->numPartitions, nvfm::kMaxFabricPartitions); ++i) {
        excluded.insert(unsupported->partitionInfo[i].partitionId);
      }
    } else if (rc != nvfm::kNotSupported) {
      return FmError(rc, "fmGetUnsupportedFabricPartitions");
    }
    std::vector<Partition> partitions;
    for (unsigned int i = 0; i < std::min<unsigned int>(list->numPartitions, nvfm::kMaxFabricPartitions); ++i) {
      const nvfm::PartitionInfo& info = list->partitionInfo[i];
      if (excluded.contains(info.partitionId)) continue;
      Partition partition;
      partition.id = info.partitionId;
      // FM's flag is 1 when active; any other value (an unsigned int FM may extend) is not taken as active.
      partition.active = info.isActive == 1;
      for (unsigned int g = 0; g < std::min<unsigned int>(info.numGpus, nvfm::kMaxNumGpus); ++g) {
        const nvfm::PartitionGpuInfo& gpu = info.gpuInfo[g];
        absl::StatusOr<std::string> bdf =
            BdfFromFmBusId(std::string_view(gpu.pciBusId, strnlen(gpu.pciBusId, sizeof gpu.pciBusId)));
        if (!bdf.ok()) {
          return absl::Status(bdf.status().code(), absl::StrCat(address_, ": partition ", info.partitionId, ": ",
                                                                bdf.status().message()));
        }
        partition.gpus.push_back(*std::move(bdf));
        partition.module_ids.push_back(gpu.physicalId);
      }
      partitions.push_back(std::move(partition));
    }
    return PartitionTable(std::move(partitions));
  }

  absl::Status Activate(uint32_t partition) override {
    if (nvfm::Return rc = lib_->activate(handle_, partition); rc != nvfm::kSuccess) {
      return FmError(rc, absl::StrCat("fmActivateFabricPartition(", partition, ")"));
    }
    return absl::OkStatus();
  }

  absl::Status Deactivate(uint32_t partition) override {
    if (nvfm::Return rc = lib_->deactivate(handle_, partition); rc != nvfm::kSuccess) {
      return FmError(rc, absl::StrCat("fmDeactivateFabricPartition(", partition, ")"));
    }
    return absl::OkStatus();
  }

  absl::Status SetActivated(const std::vector<uint32_t>& partitions) override {
    nvfm::ActivatedPartitionList list{};
    list.version = nvfm::kActivatedPartitionListVersion;
    if (partitions.size() > nvfm::kMaxFabricPartitions) return absl::InvalidArgumentError("too many partitions");
    list.numPartitions = static_cast<unsigned int>(partitions.size());
    std::copy(partitions.begin(), partitions.end(), list.partitionIds);
    if (nvfm::Return rc = lib_->set_activated(handle_, &list); rc != nvfm::kSuccess) {
      return FmError(rc, absl::StrCat("fmSetActivatedFabricPartitions(", partitions.size(), " partitions)"));
    }
    return absl::OkStatus();
  }

 private:
  const Library* const lib_;
  const nvfm::Handle handle_;
  const std::string address_;
};

}  // namespace

std::optional<int> FmReturnOf(const absl::Status& status) {
  absl::optional<absl::Cord> payload = status.GetPayload(kFmReturnPayload);
  int code = 0;
  if (!payload || !absl::SimpleAtoi(std::string(*payload), &code)) return std::nullopt;
  return code;
}

bool ConnectionLost(const absl::Status& status) {
  const std::optional<int> code = FmReturnOf(status);
  return code && (*code == nvfm::kConnectionNotValid || *code == nvfm::kTimeout || *code == nvfm::kGenericError);
}

absl::StatusOr<FmAddress> ParseFmAddress(std::string_view address) {
  FmAddress out;
  const std::string given(address);
  if (address.starts_with("unix:")) address.remove_prefix(5);
  if (given.starts_with("unix:") || address.starts_with("/")) {
    out.unix_socket = true;
    out.info = std::string(address);
  } else {
    out.info = std::string(address);
    if (address.find(':') == std::string_view::npos) absl::StrAppend(&out.info, ":", nvfm::kDefaultPort);
  }
  if (address.empty() || out.info.size() >= nvfm::kMaxStrLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("--fabric-manager \"", given, "\": want unix:/path/to/socket or host:port"));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<FmClient>> ConnectNvfm(const NvfmOptions& options) {
  absl::StatusOr<FmAddress> address = ParseFmAddress(options.address);
  if (!address.ok()) return address.status();
  absl::StatusOr<const Library*> library = LoadLibrary(options.library);
  if (!library.ok()) return library.status();
  nvfm::ConnectParams params{};
  params.version = nvfm::kConnectParamsVersion;
  address->info.copy(params.addressInfo, sizeof params.addressInfo - 1);
  params.timeoutMs = static_cast<unsigned int>(options.connect_timeout.count());
  params.addressIsUnixSocket = address->unix_socket ? 1 : 0;
  params.addressType = address->unix_socket ? nvfm::kAddressUnix : nvfm::kAddressInet;
  nvfm::Handle handle = nullptr;
  if (nvfm::Return rc = (*library)->connect(&params, &handle); rc != nvfm::kSuccess) {
    return FmError(rc, absl::StrCat("fmConnect(", options.address, ")"));
  }
  return std::make_unique<NvfmClient>(*library, handle, options.address);
}

}  // namespace vfio_agent::fabric
