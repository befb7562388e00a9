// health-probe: one grpc.health.v1.Health/Check against 127.0.0.1:PORT, for the QEMU guest (scripts/e2e), which
// has no grpc_health_probe or grpcurl. The exit status is the answer, so the guest's busybox sh can poll on it:
//   health-probe [--timeout-ms MS] PORT [SERVICE]      SERVICE "" (default) = readiness, "liveness" = liveness
//   exit 0 SERVING, 1 NOT_SERVING (or UNKNOWN), 2 unreachable or the call failed, 3 usage
#include <chrono>
#include <iostream>
#include <string>

#include "absl/strings/numbers.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace {

constexpr int kServing = 0, kNotServing = 1, kUnreachable = 2, kUsage = 3;

int Usage(const std::string& error) {
  std::cerr << "health-probe: " << error << "\nusage: health-probe [--timeout-ms MS] PORT [SERVICE]\n";
  return kUsage;
}

}  // namespace

int main(int argc, char** argv) {
  int timeout_ms = 5000;
  int arg = 1;
  if (arg < argc && std::string(argv[arg]) == "--timeout-ms") {
    if (arg + 1 >= argc || !absl::SimpleAtoi(argv[arg + 1], &timeout_ms) || timeout_ms <= 0) {
      return Usage("--timeout-ms wants a positive number of milliseconds");
    }
    arg += 2;
  }
  int port = 0;
  if (arg >= argc || !absl::SimpleAtoi(argv[arg], &port) || port <= 0 || port > 65535) {
    return Usage("PORT must be a TCP port number");
  }
  const std::string service = arg + 1 < argc ? argv[arg + 1] : "";
  if (arg + 2 < argc) return Usage("too many arguments");

  const std::string target = "127.0.0.1:" + std::to_string(port);
  auto stub = grpc::health::v1::Health::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  // Not wait_for_ready: a port nobody listens on answers UNAVAILABLE at once, which is the "not up yet" a poller
  // wants to see, instead of a wait for the whole deadline.
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);
  const std::string label = "health-probe " + target + " service \"" + service + "\": ";
  if (!status.ok()) {
    std::cout << label << "no answer (gRPC status " << status.error_code() << ": " << status.error_message() << ")\n";
    return kUnreachable;
  }
  std::cout << label << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status()) << "\n";
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING ? kServing : kNotServing;
}
