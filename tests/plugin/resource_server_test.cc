// The DevicePlugin server over its unix socket, as the kubelet talks to it: every method, ListAndWatch
// updates and the deregistering empty list, a stream the kubelet drops, and no gRPC thread that polls
// while the server idles (the callback API's `nexting_thread`s woke every second).
#include "resource_server.h"

#include <atomic>
#include <chrono>
#include <fstream>
#include <functional>
#include <thread>

#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "support/wait.h"
#include "support/sysfs_tree.h"
#include "test_devices.h"

namespace vfio_agent::plugin {
namespace {

using fixtures::Gpu;
using internal::ResourceServer;

constexpr auto kPatience = std::chrono::seconds(10);

ResourceDevices TwoGpus() {
  ResourceDevices r;
  r.resource_name = "nvidia.com/GH100_H200_SXM_141GB";
  r.env_name = "PCI_RESOURCE_NVIDIA_COM_GH100_H200_SXM_141GB";
  r.devices = {Gpu("0000:3b:00.0", 73, 0), Gpu("0000:5d:00.0", 74, 1)};
  return r;
}

using ::vfio_agent::testing::WaitUntil;

int ThreadsNamed(const std::string& name) {
  int n = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string line;
    if (std::getline(comm, line) && line == name) ++n;
  }
  return n;
}

class ResourceServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<ResourceServer>(TwoGpus().resource_name, socket_, false, [this] { ++streams_ended_; });
    ASSERT_TRUE(server_->Start(TwoGpus(), pci::VfioNodeSet::kLegacy, false).ok());
    channel_ = grpc::CreateChannel("unix:" + socket_.string(), grpc::InsecureChannelCredentials());
    stub_ = v1beta1::DevicePlugin::NewStub(channel_);
  }

  vfio_agent::testing::TempDir dir_{"va-resource-server"};
  const std::filesystem::path socket_ = dir_.path() / "kubevirt-test.sock";
  std::atomic<int> streams_ended_{0};
  std::unique_ptr<ResourceServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1beta1::DevicePlugin::Stub> stub_;
};

TEST_F(ResourceServerTest, AnswersEveryMethodAndUnknownOnesWithUnimplemented) {
  {
    grpc::ClientContext context;
    v1beta1::DevicePluginOptions options;
    ASSERT_TRUE(stub_->GetDevicePluginOptions(&context, v1beta1::Empty(), &options).ok());
    EXPECT_TRUE(options.get_preferred_allocation_available());
  }
  {
    grpc::ClientContext context;
    v1beta1::AllocateRequest request;
    request.add_container_requests()->add_devices_ids("0000:5d:00.0");
    v1beta1::AllocateResponse response;
    ASSERT_TRUE(stub_->Allocate(&context, request, &response).ok());
    ASSERT_EQ(response.container_responses_size(), 1);
    EXPECT_EQ(response.container_responses(0).envs().at("PCI_RESOURCE_NVIDIA_COM_GH100_H200_SXM_141GB"),
              "0000:5d:00.0");
  }
  {
    grpc::ClientContext context;
    v1beta1::AllocateRequest request;
    request.add_container_requests()->add_devices_ids("0000:ff:00.0");
    v1beta1::AllocateResponse response;
    EXPECT_EQ(stub_->Allocate(&context, request, &response).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    grpc::ClientContext context;
    v1beta1::PreferredAllocationRequest request;
    auto* container = request.add_container_requests();
    container->add_available_deviceids("0000:3b:00.0");
    container->add_available_deviceids("0000:5d:00.0");
    container->set_allocation_size(1);
    v1beta1::PreferredAllocationResponse response;
    ASSERT_TRUE(stub_->GetPreferredAllocation(&context, request, &response).ok());
    ASSERT_EQ(response.container_responses_size(), 1);
    EXPECT_EQ(response.container_responses(0).deviceids_size(), 1);
  }
  {
    grpc::ClientContext context;
    v1beta1::PreStartContainerResponse response;
    EXPECT_TRUE(stub_->PreStartContainer(&context, v1beta1::PreStartContainerRequest(), &response).ok());
  }
  {
    // A method the service does not have, on a queue of our own (the generic callback API would start
    // gRPC's polling threads in this process).
    grpc::GenericStub generic(channel_);
    grpc::CompletionQueue queue;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kPatience);
    grpc::ByteBuffer response;
    grpc::Status status;
    auto call = generic.PrepareUnaryCall(&context, "/v1beta1.DevicePlugin/NoSuchMethod", grpc::ByteBuffer(), &queue);
    call->StartCall();
    call->Finish(&response, &status, &queue);
    void* tag = nullptr;
    bool ok = false;
    ASSERT_TRUE(queue.Next(&tag, &ok));
    queue.Shutdown();
    while (queue.Next(&tag, &ok)) {
    }
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  }
}

TEST_F(ResourceServerTest, StreamGetsEachNewListAndAnEmptyOneWhenTheServerDeregisters) {
  grpc::ClientContext context;
  auto reader = stub_->ListAndWatch(&context, v1beta1::Empty());
  v1beta1::ListAndWatchResponse list;
  ASSERT_TRUE(reader->Read(&list));
  ASSERT_EQ(list.devices_size(), 2);
  EXPECT_EQ(list.devices(1).health(), kHealthy);
  ASSERT_TRUE(WaitUntil([&] { return server_->live_streams() == 1; }));

  ResourceDevices changed = TwoGpus();
  changed.devices[1].healthy = false;
  server_->Update(changed, pci::VfioNodeSet::kLegacy, false);
  ASSERT_TRUE(reader->Read(&list));
  EXPECT_EQ(list.devices(1).health(), kUnhealthy);

  // What is checked is that the empty list is sent, not how fast: under TSan on a busy machine the write took
  // longer than the production grace.
  server_->Shutdown(/*deregister=*/true, kPatience);
  ASSERT_TRUE(reader->Read(&list));
  EXPECT_EQ(list.devices_size(), 0);
  EXPECT_FALSE(reader->Read(&list));
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(streams_ended_, 0) << "a stream ended by Shutdown is not reported";
  EXPECT_FALSE(std::filesystem::exists(socket_));
}

TEST_F(ResourceServerTest, StreamTheKubeletDropsIsReportedAndForgotten) {
  auto context = std::make_unique<grpc::ClientContext>();
  auto reader = stub_->ListAndWatch(context.get(), v1beta1::Empty());
  v1beta1::ListAndWatchResponse list;
  ASSERT_TRUE(reader->Read(&list));
  ASSERT_TRUE(WaitUntil([&] { return server_->live_streams() == 1; }));
  context->TryCancel();
  EXPECT_TRUE(WaitUntil([&] { return streams_ended_ == 1 && server_->live_streams() == 0; }));

  // The server still answers, and a new stream starts with the current list.
  grpc::ClientContext again;
  auto second = stub_->ListAndWatch(&again, v1beta1::Empty());
  ASSERT_TRUE(second->Read(&list));
  EXPECT_EQ(list.devices_size(), 2);
  again.TryCancel();
}

// `validate` probes the plugin with a ListAndWatch of its own. It gets every list, but the agent must not take it
// for the kubelet's stream: not counted as the stream that follows a Register, its end not reported.
TEST_F(ResourceServerTest, ProbeStreamGetsListsButIsNeitherCountedNorReported) {
  grpc::ClientContext probe_context;
  probe_context.AddMetadata(kProbeMetadata, "test");
  auto probe = stub_->ListAndWatch(&probe_context, v1beta1::Empty());
  v1beta1::ListAndWatchResponse list;
  ASSERT_TRUE(probe->Read(&list));
  EXPECT_EQ(list.devices_size(), 2);
  EXPECT_EQ(server_->live_probes(), 1);  // counted before its first list is written
  EXPECT_EQ(server_->live_streams(), 0);
  EXPECT_EQ(server_->streams_opened(), 0);

  grpc::ClientContext kubelet_context;
  auto kubelet = stub_->ListAndWatch(&kubelet_context, v1beta1::Empty());
  ASSERT_TRUE(kubelet->Read(&list));
  EXPECT_EQ(server_->live_streams(), 1);
  EXPECT_EQ(server_->streams_opened(), 1);

  ResourceDevices changed = TwoGpus();
  changed.devices[0].healthy = false;
  server_->Update(changed, pci::VfioNodeSet::kLegacy, false);
  ASSERT_TRUE(probe->Read(&list));
  EXPECT_EQ(list.devices(0).health(), kUnhealthy);

  // One thread drains the server's queue, so the probe's end is handled before the kubelet's is.
  probe_context.TryCancel();
  ASSERT_TRUE(WaitUntil([&] { return server_->live_probes() == 0; }));
  kubelet_context.TryCancel();
  ASSERT_TRUE(WaitUntil([&] { return server_->live_streams() == 0 && streams_ended_ >= 1; }));
  EXPECT_EQ(streams_ended_, 1) << "the probe's end was reported as a stream end";
}

TEST_F(ResourceServerTest, NoGrpcThreadPollsForTheServer) {
  grpc::ClientContext context;
  auto reader = stub_->ListAndWatch(&context, v1beta1::Empty());
  v1beta1::ListAndWatchResponse list;
  ASSERT_TRUE(reader->Read(&list));
  grpc::ClientContext call;
  v1beta1::DevicePluginOptions options;
  ASSERT_TRUE(stub_->GetDevicePluginOptions(&call, v1beta1::Empty(), &options).ok());
  EXPECT_EQ(ThreadsNamed("nexting_thread"), 0);
  context.TryCancel();
}

}  // namespace
}  // namespace vfio_agent::plugin
