// DRAResourceHealth (KEP-4680) on the driver's dra.sock, as v1 (the 1.37 kubelet) and v1alpha1 (1.36) from one
// source: NodeWatchResources streams stay open, each message is the driver's complete device list, and every
// stream of either version gets a new one when the list changes.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dra-health/v1/api.grpc.pb.h"
#include "dra-health/v1alpha1/api.grpc.pb.h"
#include "vfio_gpu_agent/dra/devices.h"

namespace vfio_agent::dra::internal {

// How long the kubelet keeps a reported health before it takes the device as Unknown (its default is 30 s). The
// kubelet forgets every health of a driver whose stream ends, so a stopped agent leaves nothing behind; this
// bounds only an agent that hangs with its stream open, and lets the driver resend the list once a minute instead
// of every 10 s.
inline constexpr int64_t kHealthCheckTimeoutSeconds = 180;

// The message a list of devices makes: one DeviceHealth per device, pool = `pool` (the node name), HEALTHY or
// UNHEALTHY with the reason as message, stamped `now_unix`, valid for kHealthCheckTimeoutSeconds.
::v1alpha1::NodeWatchResourcesResponse HealthMessage(const std::vector<GpuDevice>& devices, const std::string& pool,
                                                     int64_t now_unix);

// The sync API: each open stream holds one of the server's threads, blocked on a condition variable between
// lists. The callback API would start gRPC's two callback-queue threads, which poll every second (the idle cost
// tests/bench/README.md measures); a node has one kubelet, so one stream. The sync API tells a handler nothing when
// its client goes away, and polling for that woke the thread every few seconds: a stream instead looks whether it
// was cancelled when it has a list to send and when a newer stream opens (a restarted kubelet's).
class HealthService final : public ::v1alpha1::DRAResourceHealth::Service {
 public:
  HealthService() = default;

  ::grpc::Status NodeWatchResources(::grpc::ServerContext* context, const ::v1alpha1::NodeWatchResourcesRequest* request,
                                    ::grpc::ServerWriter<::v1alpha1::NodeWatchResourcesResponse>* writer) override;

  // The same streams under v1's names; register it beside this one (it lives as long as this one).
  ::grpc::Service* v1() { return &v1_; }

  // The list every open stream sends next (a newer list replaces one not yet sent), and a new stream first.
  void Publish(::v1alpha1::NodeWatchResourcesResponse message);
  // Ends every stream with OK and refuses new ones: a server's Shutdown waits for open streams.
  void CloseAll();
  int open_streams() const;  // of both versions

 private:
  // One published list in both versions' messages (the same fields and numbers), converted once per list.
  struct Lists {
    ::v1alpha1::NodeWatchResourcesResponse v1alpha1;
    ::v1::NodeWatchResourcesResponse v1;
  };
  using Message = std::shared_ptr<const Lists>;

  class V1 final : public ::v1::DRAResourceHealth::Service {
   public:
    explicit V1(HealthService& source) : source_(source) {}
    ::grpc::Status NodeWatchResources(::grpc::ServerContext* context, const ::v1::NodeWatchResourcesRequest* request,
                                      ::grpc::ServerWriter<::v1::NodeWatchResourcesResponse>* writer) override;

   private:
    HealthService& source_;
  };

  // The stream both versions run; `version` names it in the log.
  template <typename Response>
  ::grpc::Status Stream(::grpc::ServerContext* context, ::grpc::ServerWriter<Response>* writer, const char* version);

  V1 v1_{*this};

  mutable std::mutex mu_;
  std::condition_variable changed_;  // latest_, closed_ or streams_opened_
  Message latest_;                   // null until the first Publish
  bool closed_ = false;
  int open_streams_ = 0;
  uint64_t streams_opened_ = 0;
};

}  // namespace vfio_agent::dra::internal
