// The DRA driver's ResourceSlices against the fake API server, which validates them as kube-apiserver does.
#include "vfio_gpu_agent/kube/resource_slices.h"

#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "api_sim_fixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kube_api_sim.h"

namespace vfio_agent::kube {
namespace {

using Json = nlohmann::json;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr char kDriver[] = "gpu.vfio-agent.cozystack.io";
constexpr char kNode[] = "node-a";
constexpr char kSlices[] = "/apis/resource.k8s.io/v1/resourceslices";

SliceDevice Gpu(int bus, bool healthy = true) {
  const std::string bdf = absl::StrFormat("0000:%02x:00.0", bus);
  SliceDevice device{.name = absl::StrFormat("gpu-0000-%02x-00-0", bus),
                     .attributes = {{"resource.kubernetes.io/pciBusID", DeviceAttribute::String(bdf)},
                                    {"numaNode", DeviceAttribute::Int(bus < 0x80 ? 0 : 1)},
                                    {"passthrough", DeviceAttribute::Bool(true)},
                                    {"driverVersion", DeviceAttribute::Version("1.2.3")}}};
  if (!healthy) device.taints.push_back({.key = "gpu.vfio-agent.cozystack.io/unhealthy", .value = "driver-nvidia"});
  return device;
}

std::vector<SliceDevice> Gpus(int count) {
  std::vector<SliceDevice> out;
  for (int i = 0; i < count; ++i) out.push_back(Gpu(i + 1));
  return out;
}

class ResourceSlicesTest : public testing::KubeApiSimTest {
 protected:
  void SetUp() override {
    testing::KubeApiSimTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    auto kubeconfig = api_->WriteKubeconfig(dir_.path() / "kubeconfig");
    ASSERT_TRUE(kubeconfig.ok()) << kubeconfig.status();
    auto publisher = ConnectResourceSlicePublisher(*kubeconfig, "", {.driver = kDriver, .node_name = kNode});
    ASSERT_TRUE(publisher.ok()) << publisher.status();
    publisher_ = *std::move(publisher);
  }

  Json Stored() {
    auto slices = api_->Slices();
    EXPECT_TRUE(slices.ok()) << slices.status();
    return slices.ok() ? *slices : Json::array();
  }
  size_t Writes() {
    return api_->Count("POST", kSlices) + api_->Count("PUT", kSlices) + api_->Count("DELETE", kSlices);
  }

  std::unique_ptr<ResourceSlicePublisher> publisher_;
};

TEST_F(ResourceSlicesTest, PublishesOneSliceOwnedByTheNodeAndWritesNothingWhenUnchanged) {
  auto first = publisher_->Publish(Gpus(8));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->created, 1);
  const Json slices = Stored();
  ASSERT_EQ(slices.size(), 1u);
  const Json& slice = slices[0];
  const auto node = api_->Node(kNode);
  ASSERT_TRUE(node.ok());
  EXPECT_EQ(slice["metadata"]["ownerReferences"][0]["kind"], "Node");
  EXPECT_EQ(slice["metadata"]["ownerReferences"][0]["uid"], (*node)["metadata"]["uid"]);
  EXPECT_EQ(slice["metadata"]["ownerReferences"][0]["controller"], true);
  EXPECT_EQ(slice["spec"]["nodeName"], kNode);
  EXPECT_EQ(slice["spec"]["driver"], kDriver);
  EXPECT_EQ(slice["spec"]["pool"]["name"], kNode);
  EXPECT_EQ(slice["spec"]["pool"]["resourceSliceCount"], 1);
  ASSERT_EQ(slice["spec"]["devices"].size(), 8u);
  const Json& device = slice["spec"]["devices"][0];
  EXPECT_EQ(device["name"], "gpu-0000-01-00-0");
  EXPECT_EQ(device["attributes"]["resource.kubernetes.io/pciBusID"], Json({{"string", "0000:01:00.0"}}));
  EXPECT_EQ(device["attributes"]["numaNode"], Json({{"int", 0}}));
  EXPECT_EQ(device["attributes"]["passthrough"], Json({{"bool", true}}));
  EXPECT_EQ(device["attributes"]["driverVersion"], Json({{"version", "1.2.3"}}));

  // The same devices in another order, again and again: one list each, no write.
  const size_t writes = Writes();
  std::vector<SliceDevice> reversed = Gpus(8);
  std::reverse(reversed.begin(), reversed.end());
  for (int i = 0; i < 3; ++i) {
    auto again = publisher_->Publish(reversed);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_FALSE(again->changed());
  }
  EXPECT_EQ(Writes(), writes);
}

TEST_F(ResourceSlicesTest, AnUnhealthyGpuIsTaintedNoScheduleInPlaceWithTheNextGeneration) {
  ASSERT_TRUE(publisher_->Publish(Gpus(2)).ok());
  const std::string name = Stored()[0]["metadata"]["name"];
  const int64_t generation = Stored()[0]["spec"]["pool"]["generation"];
  auto tainted = publisher_->Publish({Gpu(1), Gpu(2, /*healthy=*/false)});
  ASSERT_TRUE(tainted.ok()) << tainted.status();
  EXPECT_EQ(tainted->updated, 1);
  EXPECT_EQ(tainted->created, 0);
  const Json slices = Stored();
  ASSERT_EQ(slices.size(), 1u);
  EXPECT_EQ(slices[0]["metadata"]["name"], name);
  EXPECT_EQ(slices[0]["spec"]["pool"]["generation"], generation + 1);
  const Json& taint = slices[0]["spec"]["devices"][1]["taints"][0];
  EXPECT_EQ(taint["effect"], "NoSchedule");
  EXPECT_EQ(taint["key"], "gpu.vfio-agent.cozystack.io/unhealthy");
  EXPECT_TRUE(taint.contains("timeAdded"));  // stamped by the server, and not a difference next time
  const size_t writes = Writes();
  auto same = publisher_->Publish({Gpu(1), Gpu(2, /*healthy=*/false)});
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_FALSE(same->changed());
  EXPECT_EQ(Writes(), writes);
}

TEST_F(ResourceSlicesTest, MoreThan128DevicesSpanSlicesOfOneGenerationAndShrinkBack) {
  auto big = publisher_->Publish(Gpus(200));
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(big->created, 2);
  Json slices = Stored();
  ASSERT_EQ(slices.size(), 2u);
  size_t devices = 0;
  for (const Json& slice : slices) {
    EXPECT_EQ(slice["spec"]["pool"]["resourceSliceCount"], 2);
    EXPECT_EQ(slice["spec"]["pool"]["generation"], big->generation);
    devices += slice["spec"]["devices"].size();
  }
  EXPECT_EQ(devices, 200u);
  auto small = publisher_->Publish(Gpus(3));
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(small->updated, 1);
  EXPECT_EQ(small->deleted, 1);
  slices = Stored();
  ASSERT_EQ(slices.size(), 1u);
  EXPECT_EQ(slices[0]["spec"]["pool"]["resourceSliceCount"], 1);
  EXPECT_EQ(slices[0]["spec"]["pool"]["generation"], big->generation + 1);
  EXPECT_EQ(slices[0]["spec"]["devices"].size(), 3u);
}

TEST_F(ResourceSlicesTest, SlicesDeletedByAKubeletStartComeBackOnTheNextPublish) {
  ASSERT_TRUE(publisher_->Publish(Gpus(8)).ok());
  ASSERT_TRUE(api_->Control(absl::StrCat("delete-slices ", kNode)).ok());
  ASSERT_EQ(Stored().size(), 0u);
  auto back = publisher_->Publish(Gpus(8));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->created, 1);
  ASSERT_EQ(Stored().size(), 1u);
  EXPECT_EQ(Stored()[0]["spec"]["devices"].size(), 8u);
}

TEST_F(ResourceSlicesTest, ANodeWithNoGpuKeepsAnEmptyPoolAndDeleteAllRemovesIt) {
  ASSERT_TRUE(publisher_->Publish(Gpus(2)).ok());
  auto none = publisher_->Publish({});
  ASSERT_TRUE(none.ok()) << none.status();
  ASSERT_EQ(Stored().size(), 1u);
  EXPECT_FALSE(Stored()[0]["spec"].contains("devices") && !Stored()[0]["spec"]["devices"].empty());
  ASSERT_TRUE(publisher_->DeleteAll().ok());
  EXPECT_EQ(Stored().size(), 0u);
}

TEST_F(ResourceSlicesTest, TheServersRefusalsAreErrorsThatNameTheRequest) {
  ASSERT_TRUE(api_->Control("deny create resourceslices.resource.k8s.io").ok());
  auto denied = publisher_->Publish(Gpus(1));
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(denied.status().message(), HasSubstr(absl::StrCat("POST ", api_->url(), kSlices)));
  ASSERT_TRUE(api_->Control("allow create resourceslices.resource.k8s.io").ok());

  // An attribute string the API refuses (over 64 characters) is the server's 422, not a silent drop.
  SliceDevice long_value = Gpu(1);
  long_value.attributes["productName"] = DeviceAttribute::String(std::string(65, 'x'));
  auto invalid = publisher_->Publish({long_value});
  EXPECT_EQ(invalid.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(invalid.status().message(), HasSubstr("Too long"));

  // Another writer moved the slice on between our list and our update: Aborted, and the next call settles it.
  ASSERT_TRUE(publisher_->Publish(Gpus(1)).ok());
  ASSERT_TRUE(api_->Control(absl::StrCat("fail PUT ", kSlices, " 409 1")).ok());
  auto conflict = publisher_->Publish(Gpus(2));
  EXPECT_EQ(conflict.status().code(), absl::StatusCode::kAborted);
  auto settled = publisher_->Publish(Gpus(2));
  ASSERT_TRUE(settled.ok()) << settled.status();
  EXPECT_EQ(Stored()[0]["spec"]["devices"].size(), 2u);
}

TEST(ResourceSlicePublisherConnectTest, RefusesNamesThatAreNoDnsSubdomain) {
  for (const char* node : {"", "Node-A", "node_a", "-node", "node-", "a..b", "a/b"}) {
    auto publisher = ConnectResourceSlicePublisher("/nonexistent", "", {.driver = kDriver, .node_name = node});
    EXPECT_EQ(publisher.status().code(), absl::StatusCode::kInvalidArgument) << node;
  }
  auto driver = ConnectResourceSlicePublisher("/nonexistent", "", {.driver = "Gpu.Example", .node_name = kNode});
  EXPECT_EQ(driver.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace vfio_agent::kube
