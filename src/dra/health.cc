#include "health.h"

#include <chrono>

#include "spdlog/spdlog.h"

namespace vfio_agent::dra::internal {

namespace health = ::v1alpha1;

namespace {
constexpr size_t kMaxMessage = 1024;  // DeviceHealth.message
// How often an idle stream looks whether the kubelet went away (the sync API calls nobody on cancellation).
constexpr std::chrono::seconds kCancelPoll{5};
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
  lock.unlock();
  spdlog::info("DRA health stream opened by {}", peer);
  lock.lock();
  Message sent;
  std::string ended = "the kubelet cancelled it";
  while (true) {
    // A cancellation wakes nobody: it is seen within kCancelPoll, or at the next write.
    changed_.wait_for(lock, kCancelPoll, [&] { return closed_ || latest_ != sent || context->IsCancelled(); });
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
