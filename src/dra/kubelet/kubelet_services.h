// The gRPC services the kubelet calls on a DRA driver, over the driver's own logic.
#pragma once

#include <filesystem>
#include <functional>
#include <mutex>

#include "absl/time/time.h"

#include "dra/v1/api.grpc.pb.h"
#include "dra/v1beta1/api.grpc.pb.h"
#include "pluginregistration/v1/api.grpc.pb.h"
#include "vfio_gpu_agent/dra/driver.h"

namespace vfio_agent::dra::internal {

namespace drav1 = ::k8s::io::kubelet::pkg::apis::dra::v1;
namespace drav1beta1 = ::k8s::io::kubelet::pkg::apis::dra::v1beta1;

// What Prepare and Unprepare do, in v1 terms; v1beta1 calls are answered by the same handlers.
class ClaimHandler {
 public:
  virtual ~ClaimHandler() = default;
  // `call_start`: when the kubelet's call arrived, before any wait for the driver's lock; every budget of the call
  // (the kubelet gives it 45 s) counts from there.
  virtual drav1::NodePrepareResourcesResponse Prepare(const drav1::NodePrepareResourcesRequest& request,
                                                      absl::Time call_start) = 0;
  virtual drav1::NodeUnprepareResourcesResponse Unprepare(const drav1::NodeUnprepareResourcesRequest& request,
                                                          absl::Time call_start) = 0;
};

// pluginregistration.Registration: GetInfo describes the driver; NotifyRegistrationStatus is recorded, logged and
// written to the registration record (registration_record.h) for `validate`.
class RegistrationService final : public ::pluginregistration::Registration::Service {
 public:
  // `on_notify` (may be empty) runs on a gRPC thread after each NotifyRegistrationStatus, with its verdict.
  RegistrationService(const DriverOptions& options, std::function<void(bool accepted)> on_notify);
  grpc::Status GetInfo(grpc::ServerContext* context, const ::pluginregistration::InfoRequest* request,
                       ::pluginregistration::PluginInfo* info) override;
  grpc::Status NotifyRegistrationStatus(grpc::ServerContext* context,
                                        const ::pluginregistration::RegistrationStatus* status,
                                        ::pluginregistration::RegistrationStatusResponse* response) override;
  RegistrationStatus Status() const;

 private:
  const ::pluginregistration::PluginInfo info_;
  const std::filesystem::path record_;
  const std::function<void(bool accepted)> on_notify_;
  mutable std::mutex mu_;
  RegistrationStatus status_;
};

// The PluginInfo a driver with these options answers.
::pluginregistration::PluginInfo MakePluginInfo(const DriverOptions& options);

// DRAPlugin v1. Calls are serialized, as the Go helper does by default: a claim is prepared by one call at a time.
class DraServiceV1 final : public drav1::DRAPlugin::Service {
 public:
  DraServiceV1(ClaimHandler& handler, std::mutex& serialize) : handler_(handler), serialize_(serialize) {}
  grpc::Status NodePrepareResources(grpc::ServerContext* context, const drav1::NodePrepareResourcesRequest* request,
                                    drav1::NodePrepareResourcesResponse* response) override;
  grpc::Status NodeUnprepareResources(grpc::ServerContext* context,
                                      const drav1::NodeUnprepareResourcesRequest* request,
                                      drav1::NodeUnprepareResourcesResponse* response) override;

 private:
  ClaimHandler& handler_;
  std::mutex& serialize_;
};

// DRAPlugin v1beta1: its messages are v1's minus Device.share_id (field 5), so a call is carried over to v1 and its
// answer back by their wire bytes, and both versions run the same handlers.
class DraServiceV1beta1 final : public drav1beta1::DRAPlugin::Service {
 public:
  DraServiceV1beta1(ClaimHandler& handler, std::mutex& serialize) : handler_(handler), serialize_(serialize) {}
  grpc::Status NodePrepareResources(grpc::ServerContext* context,
                                    const drav1beta1::NodePrepareResourcesRequest* request,
                                    drav1beta1::NodePrepareResourcesResponse* response) override;
  grpc::Status NodeUnprepareResources(grpc::ServerContext* context,
                                      const drav1beta1::NodeUnprepareResourcesRequest* request,
                                      drav1beta1::NodeUnprepareResourcesResponse* response) override;

 private:
  ClaimHandler& handler_;
  std::mutex& serialize_;
};

}  // namespace vfio_agent::dra::internal
