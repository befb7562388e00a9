#include "health.h"

#include "spdlog/spdlog.h"

namespace vfio_agent::dra::internal {

namespace health = ::v1alpha1;

namespace {
constexpr size_t kMaxMessage = 1024;  // DeviceHealth.message
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

// One NodeWatchResources stream. Its state is guarded by the service's mutex; StartWrite and Finish are called
// outside it. Finish waits for a write in flight (`writing_`), so the reactor cannot be done, and deleted, between
// a decision to write and the StartWrite that follows it.
class HealthService::Stream final : public ::grpc::ServerWriteReactor<health::NodeWatchResourcesResponse> {
 public:
  Stream(HealthService* owner, std::string peer) : owner_(owner), peer_(std::move(peer)) {}

  // Under the owner's mutex: whether the caller must StartWrite(in_flight_) once it released the mutex.
  bool Offer(Message message) {
    if (finishing_) return false;
    if (writing_) {
      pending_ = std::move(message);
      return false;
    }
    writing_ = true;
    in_flight_ = std::move(message);
    return true;
  }
  void Write() { StartWrite(in_flight_.get()); }

  // Under the owner's mutex: whether the caller must Finish once it released the mutex.
  bool Close() {
    finishing_ = true;
    return TakeFinish();
  }
  void End() { Finish(::grpc::Status::OK); }

  void OnWriteDone(bool ok) override {
    std::unique_lock lock(owner_->mu_);
    in_flight_.reset();
    if (!ok) finishing_ = true;
    if (!finishing_ && pending_) {
      in_flight_ = std::move(pending_);
      lock.unlock();
      Write();
      return;
    }
    writing_ = false;
    const bool finish = finishing_ && TakeFinish();
    lock.unlock();
    if (finish) End();
  }

  void OnCancel() override {
    std::unique_lock lock(owner_->mu_);
    const bool finish = Close();
    lock.unlock();
    if (finish) End();
  }

  void OnDone() override {
    {
      std::lock_guard lock(owner_->mu_);
      owner_->streams_.erase(this);
    }
    spdlog::info("DRA health stream of {} ended", peer_);
    delete this;
  }

 private:
  bool TakeFinish() {
    if (writing_ || finished_) return false;
    finished_ = true;
    return true;
  }

  HealthService* const owner_;
  const std::string peer_;
  bool writing_ = false;
  bool finishing_ = false;
  bool finished_ = false;
  Message in_flight_;
  Message pending_;
};

HealthService::~HealthService() = default;

::grpc::ServerWriteReactor<health::NodeWatchResourcesResponse>* HealthService::NodeWatchResources(
    ::grpc::CallbackServerContext* context, const health::NodeWatchResourcesRequest*) {
  auto* stream = new Stream(this, context->peer());
  std::unique_lock lock(mu_);
  if (closed_) {
    (void)stream->Close();  // never written to: a cancellation now must not finish it a second time
    lock.unlock();
    stream->Finish(::grpc::Status(::grpc::StatusCode::UNAVAILABLE, "the DRA driver is stopping"));
    return stream;
  }
  streams_.insert(stream);
  const bool write = latest_ && stream->Offer(latest_);
  lock.unlock();
  spdlog::info("DRA health stream opened by {}", context->peer());
  if (write) stream->Write();
  return stream;
}

void HealthService::Publish(health::NodeWatchResourcesResponse message) {
  auto shared = std::make_shared<const health::NodeWatchResourcesResponse>(std::move(message));
  std::vector<Stream*> to_write;
  {
    std::lock_guard lock(mu_);
    latest_ = shared;
    for (Stream* stream : streams_) {
      if (stream->Offer(shared)) to_write.push_back(stream);
    }
  }
  for (Stream* stream : to_write) stream->Write();
}

void HealthService::CloseAll() {
  std::vector<Stream*> to_end;
  {
    std::lock_guard lock(mu_);
    closed_ = true;
    for (Stream* stream : streams_) {
      if (stream->Close()) to_end.push_back(stream);
    }
  }
  for (Stream* stream : to_end) stream->End();
}

int HealthService::open_streams() const {
  std::lock_guard lock(mu_);
  return static_cast<int>(streams_.size());
}

}  // namespace vfio_agent::dra::internal
