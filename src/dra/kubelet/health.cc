#include "health.h"

#include <chrono>
#include <optional>

#include "spdlog/spdlog.h"

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
    entry->set_message(device.unhealthy_reason.substr(0, kMaxMessage));
  }
  return message;
}

::grpc::Status HealthService::NodeWatchResources(::grpc::ServerContext* context,
                                                 const health::NodeWatchResourcesRequest*,
                                                 ::grpc::ServerWriter<health::NodeWatchResourcesResponse>* writer) {
  const std::string peer = context->peer();
  std::unique_lock lock(mu_);
  if (closed_) return {::grpc::StatusCode::UNAVAILABLE, "the DRA driver is stopping"};
  ++open_streams_;
  const uint64_t opened = ++streams_opened_;
  changed_.notify_all();  // an older stream of a kubelet that went away ends now
  lock.unlock();
  spdlog::info("DRA health stream opened by {}", peer);
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
    const bool written = writer->Write(*sent);
    lock.lock();
    if (!written) {
      ended = "a write failed";
      break;
    }
  }
  --open_streams_;
  lock.unlock();
  spdlog::info("DRA health stream of {} ended: {}", peer, ended);
  return ::grpc::Status::OK;
}

void HealthService::Publish(health::NodeWatchResourcesResponse message) {
  auto shared = std::make_shared<const health::NodeWatchResourcesResponse>(std::move(message));
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
