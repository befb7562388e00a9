#include "kubelet_services.h"

#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/dra/registration_record.h"

namespace vfio_agent::dra::internal {
namespace {

// Re-reads `from` as the other version's message of the same wire shape. A field one side lacks would survive
// only as an unknown field; the two versions differ in Device.share_id alone, which this driver never sets.
template <typename To, typename From>
grpc::Status Convert(const From& from, To* to) {
  std::string bytes;
  if (!from.SerializeToString(&bytes) || !to->ParseFromString(bytes)) {
    return grpc::Status(grpc::StatusCode::INTERNAL,
                        std::string("cannot carry ") + From::descriptor()->full_name() + " over to " +
                            To::descriptor()->full_name());
  }
  return grpc::Status::OK;
}

}  // namespace

::pluginregistration::PluginInfo MakePluginInfo(const DriverOptions& options) {
  ::pluginregistration::PluginInfo info;
  info.set_type(std::string(kPluginType));
  info.set_name(options.driver_name);
  info.set_endpoint(DraSocket(options).string());
  for (std::string_view service : {kServiceV1, kServiceV1beta1, kServiceHealthV1, kServiceHealthV1alpha1}) {
    info.add_supported_versions(std::string(service));
  }
  return info;
}

RegistrationService::RegistrationService(const DriverOptions& options, std::function<void(bool accepted)> on_notify)
    : info_(MakePluginInfo(options)), record_(RegistrationRecordPath(options)), on_notify_(std::move(on_notify)) {}

grpc::Status RegistrationService::GetInfo(grpc::ServerContext*, const ::pluginregistration::InfoRequest*,
                                          ::pluginregistration::PluginInfo* info) {
  *info = info_;
  std::lock_guard lock(mu_);
  ++status_.get_info_calls;
  return grpc::Status::OK;
}

grpc::Status RegistrationService::NotifyRegistrationStatus(grpc::ServerContext*,
                                                           const ::pluginregistration::RegistrationStatus* status,
                                                           ::pluginregistration::RegistrationStatusResponse*) {
  if (status->plugin_registered()) {
    spdlog::info("DRA driver {}: the kubelet accepted the registration (endpoint {})", info_.name(), info_.endpoint());
  } else {
    spdlog::error("DRA driver {}: the kubelet refused the registration: {}", info_.name(), status->error());
  }
  {
    std::lock_guard lock(mu_);
    ++status_.notifications;
    status_.registered = status->plugin_registered();
    status_.error = status->plugin_registered() ? "" : status->error();
    if (absl::Status written = WriteRegistrationRecord(record_, status_); !written.ok()) {
      spdlog::warn("DRA driver {}: the registration record for validate is not written: {}", info_.name(),
                   std::string(written.message()));
    }
  }
  if (on_notify_) on_notify_(status->plugin_registered());
  return grpc::Status::OK;
}

RegistrationStatus RegistrationService::Status() const {
  std::lock_guard lock(mu_);
  return status_;
}

grpc::Status DraServiceV1::NodePrepareResources(grpc::ServerContext*, const drav1::NodePrepareResourcesRequest* request,
                                                drav1::NodePrepareResourcesResponse* response) {
  const absl::Time call_start = absl::Now();
  std::lock_guard lock(serialize_);
  *response = handler_.Prepare(*request, call_start);
  return grpc::Status::OK;
}

grpc::Status DraServiceV1::NodeUnprepareResources(grpc::ServerContext*,
                                                  const drav1::NodeUnprepareResourcesRequest* request,
                                                  drav1::NodeUnprepareResourcesResponse* response) {
  const absl::Time call_start = absl::Now();
  std::lock_guard lock(serialize_);
  *response = handler_.Unprepare(*request, call_start);
  return grpc::Status::OK;
}

grpc::Status DraServiceV1beta1::NodePrepareResources(grpc::ServerContext*,
                                                     const drav1beta1::NodePrepareResourcesRequest* request,
                                                     drav1beta1::NodePrepareResourcesResponse* response) {
  const absl::Time call_start = absl::Now();
  drav1::NodePrepareResourcesRequest v1_request;
  if (grpc::Status status = Convert(*request, &v1_request); !status.ok()) return status;
  std::lock_guard lock(serialize_);
  return Convert(handler_.Prepare(v1_request, call_start), response);
}

grpc::Status DraServiceV1beta1::NodeUnprepareResources(grpc::ServerContext*,
                                                       const drav1beta1::NodeUnprepareResourcesRequest* request,
                                                       drav1beta1::NodeUnprepareResourcesResponse* response) {
  const absl::Time call_start = absl::Now();
  drav1::NodeUnprepareResourcesRequest v1_request;
  if (grpc::Status status = Convert(*request, &v1_request); !status.ok()) return status;
  std::lock_guard lock(serialize_);
  return Convert(handler_.Unprepare(v1_request, call_start), response);
}

}  // namespace vfio_agent::dra::internal
