// Helpers shared by the cluster layers (plugin, kubelet, kubevirt): building checks and dialling unix sockets.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "vfio_gpu_agent/validation/check.h"

namespace vfio_agent::validation::cluster {

inline Check MakeCheck(std::string id, Layer layer, std::string subject, Result result, std::string message,
                       std::vector<Evidence> evidence = {}, std::string fix = "") {
  return Check{.id = std::move(id), .layer = layer, .subject = std::move(subject), .result = result,
               .message = std::move(message), .evidence = std::move(evidence), .fix = std::move(fix)};
}

// "2 devices: 0000:18:00.0,0000:2a:00.0" / "(none)".
inline std::string DeviceList(const std::set<std::string>& ids) {
  if (ids.empty()) return "(none)";
  return absl::StrCat(ids.size(), ids.size() == 1 ? " device: " : " devices: ", absl::StrJoin(ids, ","));
}

// A private connection to a unix socket, as the kubelet dials a plugin. No connection is made until the first RPC.
inline std::shared_ptr<grpc::Channel> DialUnix(const std::filesystem::path& socket) {
  grpc::ChannelArguments args;
  args.SetString(GRPC_ARG_DEFAULT_AUTHORITY, "localhost");
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel("unix:" + socket.string(), grpc::InsecureChannelCredentials(), args);
}

inline std::chrono::system_clock::time_point DeadlineAfter(std::chrono::milliseconds wait) {
  return std::chrono::system_clock::now() + wait;
}

inline std::string RpcError(const grpc::Status& status) {
  return absl::StrCat("code ", static_cast<int>(status.error_code()), ": ", status.error_message());
}

}  // namespace vfio_agent::validation::cluster
