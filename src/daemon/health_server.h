// grpc.health.v1.Health over TCP for the kubelet's native gRPC probes. Service "" answers readiness,
// service "liveness" answers whether the reconcile loop still turns; any other name is NOT_FOUND.
// gRPC's sync API, whose pollers sleep until a call comes (their timeout set to a day): gRPC 1.51's callback
// API polls from two shared threads with a 1 s deadline (about 3 ms of CPU per 20 s on an idle node).
// Watch answers UNIMPLEMENTED.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/server.h"

namespace vfio_agent::daemon::internal {

inline constexpr char kLivenessService[] = "liveness";

class HealthServer final : public grpc::health::v1::Health::Service {
 public:
  // Both callbacks run on gRPC threads and must be cheap and thread-safe.
  HealthServer(std::function<bool()> ready, std::function<bool()> live);
  ~HealthServer() override;
  absl::Status Start(const std::string& host, int port);
  void Shutdown();

  grpc::Status Check(grpc::ServerContext* context, const grpc::health::v1::HealthCheckRequest* request,
                     grpc::health::v1::HealthCheckResponse* response) override;

 private:
  const std::function<bool()> ready_, live_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace vfio_agent::daemon::internal
