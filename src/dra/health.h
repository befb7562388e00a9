// v1alpha1.DRAResourceHealth (KEP-4680) on the driver's dra.sock: NodeWatchResources streams stay open, each
// message is the driver's complete device list, and every stream gets a new one when the list changes.
#pragma once

#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "dra-health/v1alpha1/api.grpc.pb.h"
#include "vfio_gpu_agent/dra/devices.h"

namespace vfio_agent::dra::internal {

// The message a list of devices makes: one DeviceHealth per device, pool = `pool` (the node name), HEALTHY or
// UNHEALTHY with the reason as message, stamped `now_unix`.
::v1alpha1::NodeWatchResourcesResponse HealthMessage(const std::vector<GpuDevice>& devices, const std::string& pool,
                                                     int64_t now_unix);

class HealthService final : public ::v1alpha1::DRAResourceHealth::CallbackService {
 public:
  HealthService() = default;
  // Every stream must be done (CloseAll, then the server's Shutdown).
  ~HealthService() override;

  ::grpc::ServerWriteReactor<::v1alpha1::NodeWatchResourcesResponse>* NodeWatchResources(
      ::grpc::CallbackServerContext* context, const ::v1alpha1::NodeWatchResourcesRequest* request) override;

  // The list every open stream gets next (at most one write in flight per stream: a newer list replaces one not
  // yet sent), and a new stream first.
  void Publish(::v1alpha1::NodeWatchResourcesResponse message);
  // Ends every stream with OK and refuses new ones: a server's Shutdown waits for open streams.
  void CloseAll();
  int open_streams() const;

 private:
  class Stream;
  using Message = std::shared_ptr<const ::v1alpha1::NodeWatchResourcesResponse>;

  mutable std::mutex mu_;
  Message latest_;  // null until the first Publish
  bool closed_ = false;
  std::set<Stream*> streams_;
};

}  // namespace vfio_agent::dra::internal
