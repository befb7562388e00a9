#include "vfio_gpu_agent/common/grpc_idle.h"

#include <grpc/event_engine/event_engine.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "support/wait.h"

namespace vfio_agent {
namespace {

using namespace std::chrono_literals;

// gRPC 1.51 names the event engine's timer thread "timer_manager".
bool TimerManagerRuns() {
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::string name;
    std::getline(std::ifstream(task.path() / "comm"), name);
    if (name == "timer_manager") return true;
  }
  return false;
}

// One process, one order: the factory is installed before gRPC makes anything, as main does.
TEST(GrpcIdleTest, AServerStartsNoEventEngineThreadAndTheFirstTimerMakesTheEngine) {
  CreateGrpcEventEngineOnFirstUse();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  grpc::AsyncGenericService service;  // a server needs something to serve
  builder.RegisterAsyncGenericService(&service);
  std::unique_ptr<grpc::ServerCompletionQueue> queue = builder.AddCompletionQueue();
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  EXPECT_FALSE(TimerManagerRuns());

  std::unique_ptr<grpc_event_engine::experimental::EventEngine> engine =
      grpc_event_engine::experimental::CreateEventEngine();
  std::atomic<bool> ran{false};
  engine->RunAfter(1ms, [&ran] { ran = true; });
  EXPECT_TRUE(testing::WaitUntil([&] { return ran.load(); }));
  EXPECT_TRUE(TimerManagerRuns());
  server->Shutdown();
  queue->Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (queue->Next(&tag, &ok)) {
  }
}

}  // namespace
}  // namespace vfio_agent
