#include "health.h"

#include <chrono>
#include <optional>
#include <type_traits>

#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/dra/taints.h"

namespace vfio_agent::dra::internal {

namespace health = ::v1alpha1;

namespace {
constexpr size_t kMaxMessage = 1024;  // DeviceHealth.message
constexpr std::chrono::seconds kSupersededWatch{30};
}  // namespace

health::NodeWatchResourcesResponse HealthMessage(const std::vector<GpuDevice>& devices, const std::string& pool,
                                                 int64_t now_unix) {
  health::NodeWatchResourcesResponse message;
  for (const GpuDevice& device : devices) {
    health::DeviceHealth* entry = message.add_devices();
    entry->mutable_device()->set_pool_name(pool);
    entry->mutable_device()->set_device_name(device.slice.name);
    entry->set_health(device.healthy() ? health::HEALTHY : health::UNHEALTHY);
    entry->set_last_updated_time(now_unix);
    entry->set_health_check_timeout_seconds(kHealthCheckTimeoutSeconds);
    // The reason a failure taint's key and value are made from, or the warnings a None taint carries.
    entry->set_message((device.healthy() ? WarningText(device) : device.unhealthy_reason).substr(0, kMaxMessage));
  }
  return message;
}

::grpc::Status HealthService::NodeWatchResources(::grpc::ServerContext* context,
                                                 const health::NodeWatchResourcesRequest*,
                                                 ::grpc::ServerWriter<health::NodeWatchResourcesResponse>* writer) {
  return Stream(context, writer, "v1alpha1");
}

::grpc::Status HealthService::V1::NodeWatchResources(::grpc::ServerContext* context,
                                                     const ::v1::NodeWatchResourcesRequest*,
                                                     ::grpc::ServerWriter<::v1::NodeWatchResourcesResponse>* writer) {
  return source_.Stream(context, writer, "v1");
}

template <typename Response>
::grpc::Status HealthService::Stream(::grpc::ServerContext* context, ::grpc::ServerWriter<Response>* writer,
                                     const char* version) {
  const std::string peer = context->peer();
  std::unique_lock lock(mu_);
  if (closed_) return {::grpc::StatusCode::UNAVAILABLE, "the DRA driver is stopping"};
  ++open_streams_;
  const uint64_t opened = ++streams_opened_;
  changed_.notify_all();  // an older stream of a kubelet that went away ends now
  lock.unlock();
  spdlog::info("DRA health stream ({}) opened by {}", version, peer);
  lock.lock();
  Message sent;
  std::string ended = "the kubelet cancelled it";
  uint64_t newest_seen = opened;
  std::optional<std::chrono::steady_clock::time_point> superseded_at;
  while (true) {
    auto woken = [&] { return closed_ || latest_ != sent || streams_opened_ != newest_seen; };
    // The gRPC server may mark this stream cancelled only after the restarted kubelet's stream opened: for a
    // while after that, this one looks again every second, then waits as before.
    if (superseded_at && std::chrono::steady_clock::now() - *superseded_at < kSupersededWatch) {
      changed_.wait_for(lock, std::chrono::seconds(1), woken);
    } else {
      changed_.wait(lock, woken);
    }
    if (streams_opened_ != newest_seen && !superseded_at) superseded_at = std::chrono::steady_clock::now();
    newest_seen = streams_opened_;
    if (closed_) {
      ended = "the driver stopped";
      break;
    }
    if (context->IsCancelled()) break;
    if (latest_ == sent) continue;
    sent = latest_;
    lock.unlock();
    bool written;
    if constexpr (std::is_same_v<Response, ::v1::NodeWatchResourcesResponse>) {
      written = writer->Write(sent->v1);
    } else {
      written = writer->Write(sent->v1alpha1);
    }
    lock.lock();
    if (!written) {
      ended = "a write failed";
      break;
    }
  }
  --open_streams_;
  lock.unlock();
  spdlog::info("DRA health stream ({}) of {} ended: {}", version, peer, ended);
  return ::grpc::Status::OK;
}

void HealthService::Publish(health::NodeWatchResourcesResponse message) {
  auto lists = std::make_shared<Lists>();
  // Same fields and numbers: v1 reads v1alpha1's bytes whole (checked by the proto test).
  if (!lists->v1.ParseFromString(message.SerializeAsString())) {
    spdlog::error("DRA health: a device list does not carry over to dra-health v1; v1 streams keep the last one");
  }
  lists->v1alpha1 = std::move(message);
  Message shared = std::move(lists);
  std::lock_guard lock(mu_);
  latest_ = std::move(shared);
  changed_.notify_all();
}

void HealthService::CloseAll() {
  std::lock_guard lock(mu_);
  closed_ = true;
  changed_.notify_all();
}

int HealthService::open_streams() const {
  std::lock_guard lock(mu_);
  return open_streams_;
}

}  // namespace vfio_agent::dra::internal
