#include "vfio_gpu_agent/dra/driver.h"

#include <signal.h>

#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "grpcpp/server_builder.h"
#include "claims.h"
#include "kubelet_services.h"
#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/common/unix_socket.h"

namespace vfio_agent::dra {
namespace {

constexpr size_t kMaxDriverNameLength = 63;  // ResourceSlice.spec.driver

bool IsLowerAlnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

absl::StatusOr<std::unique_ptr<grpc::Server>> ServeOn(const std::filesystem::path& socket,
                                                      std::initializer_list<grpc::Service*> services) {
  std::error_code ec;
  std::filesystem::create_directories(socket.parent_path(), ec);
  if (ec) return absl::UnavailableError(absl::StrCat("create ", socket.parent_path().string(), ": ", ec.message()));
  if (absl::Status free = ClaimSocketPath(socket); !free.ok()) return free;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + socket.string(), grpc::InsecureServerCredentials());
  for (grpc::Service* service : services) builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) return absl::UnavailableError(absl::StrCat("cannot serve on ", socket.string()));
  return server;
}

}  // namespace

absl::Status ValidateDriverName(std::string_view name) {
  auto invalid = [&](std::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("DRA driver name \"", std::string(name), "\" ", std::string(why)));
  };
  if (name.empty()) return invalid("is empty");
  if (name.size() > kMaxDriverNameLength) return invalid("is longer than 63 characters");
  for (const std::string& label : std::vector<std::string>(absl::StrSplit(std::string(name), '.'))) {
    if (label.empty()) return invalid("has an empty label");
    if (!IsLowerAlnum(label.front()) || !IsLowerAlnum(label.back())) {
      return invalid("is not a DNS subdomain: each label starts and ends with a lower-case letter or digit");
    }
    for (char c : label) {
      if (!IsLowerAlnum(c) && c != '-') return invalid("is not a DNS subdomain: only a-z, 0-9, '-' and '.'");
    }
  }
  return absl::OkStatus();
}

std::filesystem::path RegistrationSocket(const DriverOptions& options) {
  return options.registry_dir / (options.driver_name + "-reg.sock");
}

std::filesystem::path DraSocket(const DriverOptions& options) {
  return std::filesystem::absolute(options.plugins_dir / options.driver_name / "dra.sock").lexically_normal();
}

class Driver::Impl {
 public:
  explicit Impl(DriverOptions options)
      : options_(std::move(options)),
        registration_(options_),
        claims_(options_),
        v1_(claims_, serialize_),
        v1beta1_(claims_, serialize_) {}

  absl::Status Start() {
    if (absl::Status name = ValidateDriverName(options_.driver_name); !name.ok()) return name;
    if (absl::Status loaded = claims_.Load(); !loaded.ok()) return loaded;
    auto dra = ServeOn(DraSocket(options_), {&v1_, &v1beta1_});
    if (!dra.ok()) return dra.status();
    dra_server_ = *std::move(dra);
    auto registration = ServeOn(RegistrationSocket(options_), {&registration_});
    if (!registration.ok()) {
      StopDra();
      return registration.status();
    }
    registration_server_ = *std::move(registration);
    spdlog::info("DRA driver {}: serving {} and registration on {}", options_.driver_name,
                 DraSocket(options_).string(), RegistrationSocket(options_).string());
    return absl::OkStatus();
  }

  void Stop() {
    if (registration_server_) {
      std::error_code ec;
      std::filesystem::remove(RegistrationSocket(options_), ec);
      registration_server_->Shutdown();
      registration_server_.reset();
    }
    StopDra();
  }

  RegistrationStatus Registration() const { return registration_.Status(); }

 private:
  void StopDra() {
    if (!dra_server_) return;
    std::error_code ec;
    std::filesystem::remove(DraSocket(options_), ec);
    dra_server_->Shutdown();
    dra_server_.reset();
  }

  const DriverOptions options_;
  internal::RegistrationService registration_;
  internal::ClaimPreparer claims_;
  std::mutex serialize_;
  internal::DraServiceV1 v1_;
  internal::DraServiceV1beta1 v1beta1_;
  std::unique_ptr<grpc::Server> dra_server_;
  std::unique_ptr<grpc::Server> registration_server_;
};

Driver::Driver(DriverOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
Driver::~Driver() { Stop(); }
absl::Status Driver::Start() { return impl_->Start(); }
void Driver::Stop() { impl_->Stop(); }
RegistrationStatus Driver::Registration() const { return impl_->Registration(); }

absl::Status Serve(const DriverOptions& options) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  // Blocked before any thread starts, so every thread inherits the mask and sigwait sees the signal.
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  Driver driver(options);
  if (absl::Status status = driver.Start(); !status.ok()) return status;
  int signal = 0;
  sigwait(&signals, &signal);
  spdlog::info("signal {}: DRA driver {} deregistering and removing its sockets", signal, options.driver_name);
  driver.Stop();
  return absl::OkStatus();
}

}  // namespace vfio_agent::dra
