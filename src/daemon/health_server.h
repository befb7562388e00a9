// grpc.health.v1.Health over TCP for the kubelet's native gRPC probes. Service "" answers readiness,
// service "liveness" answers whether the reconcile loop still turns; any other name is NOT_FOUND.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/server.h"

namespace vfio_agent::daemon::internal {

inline constexpr char kLivenessService[] = "liveness";

class HealthServer final : public grpc::health::v1::Health::CallbackService {
 public:
  // Both callbacks run on gRPC threads and must be cheap and thread-safe.
  HealthServer(std::function<bool()> ready, std::function<bool()> live);
  ~HealthServer() override;
  absl::Status Start(const std::string& host, int port);
  void Shutdown();

  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* context,
                                  const grpc::health::v1::HealthCheckRequest* request,
                                  grpc::health::v1::HealthCheckResponse* response) override;

 private:
  const std::function<bool()> ready_, live_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace vfio_agent::daemon::internal
