#include "vfio_gpu_agent/common/grpc_idle.h"

#include <grpc/event_engine/event_engine.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <utility>

namespace vfio_agent {
namespace {

using grpc_event_engine::experimental::EventEngine;

// Forwards every call to gRPC's built-in engine, made by the first call that needs it. Until then there is
// nothing to cancel and no worker thread to be on.
class OnFirstUseEventEngine final : public EventEngine {
 public:
  absl::StatusOr<std::unique_ptr<Listener>> CreateListener(
      Listener::AcceptCallback on_accept, absl::AnyInvocable<void(absl::Status)> on_shutdown,
      const grpc_event_engine::experimental::EndpointConfig& config,
      std::unique_ptr<grpc_event_engine::experimental::MemoryAllocatorFactory> factory) override {
    return Engine().CreateListener(std::move(on_accept), std::move(on_shutdown), config, std::move(factory));
  }
  ConnectionHandle Connect(OnConnectCallback on_connect, const ResolvedAddress& addr,
                           const grpc_event_engine::experimental::EndpointConfig& args,
                           grpc_event_engine::experimental::MemoryAllocator memory_allocator,
                           Duration timeout) override {
    return Engine().Connect(std::move(on_connect), addr, args, std::move(memory_allocator), timeout);
  }
  bool CancelConnect(ConnectionHandle handle) override {
    EventEngine* engine = Created();
    return engine != nullptr && engine->CancelConnect(handle);
  }
  bool IsWorkerThread() override {
    EventEngine* engine = Created();
    return engine != nullptr && engine->IsWorkerThread();
  }
  std::unique_ptr<DNSResolver> GetDNSResolver(const DNSResolver::ResolverOptions& options) override {
    return Engine().GetDNSResolver(options);
  }
  void Run(Closure* closure) override { Engine().Run(closure); }
  void Run(absl::AnyInvocable<void()> closure) override { Engine().Run(std::move(closure)); }
  TaskHandle RunAfter(Duration when, Closure* closure) override { return Engine().RunAfter(when, closure); }
  TaskHandle RunAfter(Duration when, absl::AnyInvocable<void()> closure) override {
    return Engine().RunAfter(when, std::move(closure));
  }
  bool Cancel(TaskHandle handle) override {
    EventEngine* engine = Created();
    return engine != nullptr && engine->Cancel(handle);
  }

 private:
  EventEngine& Engine() {
    std::call_once(once_, [this] {
      // Back to gRPC's own factory for good: this engine and any later one are gRPC's.
      grpc_event_engine::experimental::EventEngineFactoryReset();
      engine_ = grpc_event_engine::experimental::CreateEventEngine();
      created_.store(engine_.get(), std::memory_order_release);
    });
    return *engine_;
  }
  EventEngine* Created() const { return created_.load(std::memory_order_acquire); }

  std::once_flag once_;
  std::unique_ptr<EventEngine> engine_;
  std::atomic<EventEngine*> created_{nullptr};
};

}  // namespace

void CreateGrpcEventEngineOnFirstUse() {
  grpc_event_engine::experimental::SetEventEngineFactory(
      [] { return std::make_unique<OnFirstUseEventEngine>(); });
}

}  // namespace vfio_agent
