#include "vfio_gpu_agent/plugin/held_devices.h"

#include "absl/strings/str_cat.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "podresources/v1/api.grpc.pb.h"

namespace vfio_agent::plugin {

absl::StatusOr<std::vector<HeldByContainer>> HeldDevicesByPod(const std::filesystem::path& socket,
                                                              const std::set<std::string>& resource_names,
                                                              std::chrono::milliseconds deadline) {
  grpc::ChannelArguments args;
  args.SetString(GRPC_ARG_DEFAULT_AUTHORITY, "localhost");
  // A private connection, closed with the channel: a shared subchannel would outlive the call.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto stub = ::v1::PodResourcesLister::NewStub(
      grpc::CreateCustomChannel("unix:" + socket.string(), grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + deadline);
  ::v1::ListPodResourcesResponse response;
  const grpc::Status status = stub->List(&context, ::v1::ListPodResourcesRequest(), &response);
  if (!status.ok()) {
    return absl::UnavailableError(
        absl::StrCat("pod-resources List on ", socket.string(), ": ", status.error_message()));
  }
  std::vector<HeldByContainer> held;
  for (const auto& pod : response.pod_resources()) {
    for (const auto& container : pod.containers()) {
      std::set<std::string> ids;
      for (const auto& devices : container.devices()) {
        if (!resource_names.contains(devices.resource_name())) continue;
        ids.insert(devices.device_ids().begin(), devices.device_ids().end());
      }
      if (!ids.empty()) held.push_back({pod.namespace_(), pod.name(), std::move(ids)});
    }
  }
  return held;
}

absl::StatusOr<std::vector<std::set<std::string>>> HeldDeviceSets(const std::filesystem::path& socket,
                                                                 const std::set<std::string>& resource_names,
                                                                 std::chrono::milliseconds deadline) {
  absl::StatusOr<std::vector<HeldByContainer>> held = HeldDevicesByPod(socket, resource_names, deadline);
  if (!held.ok()) return held.status();
  std::vector<std::set<std::string>> sets;
  for (HeldByContainer& container : *held) sets.push_back(std::move(container.ids));
  return sets;
}

}  // namespace vfio_agent::plugin
