#include "health_server.h"

#include "absl/strings/str_cat.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "vfio_gpu_agent/common/grpc_idle.h"

namespace vfio_agent::daemon::internal {

using grpc::health::v1::HealthCheckResponse;

HealthServer::HealthServer(std::function<bool()> ready, std::function<bool()> live)
    : ready_(std::move(ready)), live_(std::move(live)) {}

HealthServer::~HealthServer() { Shutdown(); }

absl::Status HealthServer::Start(const std::string& host, int port) {
  const std::string address = absl::StrCat(host, ":", port);
  int bound_port = 0;
  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default: a second agent (or anything else) on the port would then share it
  // silently and answer half the kubelet's probes.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::CQ_TIMEOUT_MSEC, kSyncPollerTimeoutMs);
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &bound_port);
  builder.RegisterService(this);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || bound_port == 0) {
    server_.reset();
    return absl::UnavailableError(absl::StrCat("health service: cannot listen on ", address));
  }
  return absl::OkStatus();
}

void HealthServer::Shutdown() {
  if (server_ == nullptr) return;
  server_->Shutdown(std::chrono::system_clock::now());
  server_.reset();
}

grpc::Status HealthServer::Check(grpc::ServerContext*, const grpc::health::v1::HealthCheckRequest* request,
                                 HealthCheckResponse* response) {
  if (request->service().empty()) {
    response->set_status(ready_() ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING);
  } else if (request->service() == kLivenessService) {
    response->set_status(live_() ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING);
  } else {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown service");
  }
  return grpc::Status::OK;
}

}  // namespace vfio_agent::daemon::internal
