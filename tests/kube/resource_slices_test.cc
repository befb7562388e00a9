// The DRA driver's ResourceSlices against the fake API server, which validates them as kube-apiserver does.
#include "vfio_gpu_agent/kube/resource_slices.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "api_client.h"
#include "api_sim_fixture.h"
#include "config.h"
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
    Connect();
  }

  void Connect() {
    auto kubeconfig = api_->WriteKubeconfig(dir_.path() / "kubeconfig");
    ASSERT_TRUE(kubeconfig.ok()) << kubeconfig.status();
    auto publisher = ConnectResourceSlicePublisher(*kubeconfig, "", {.driver = kDriver, .node_name = kNode});
    ASSERT_TRUE(publisher.ok()) << publisher.status();
    publisher_ = *std::move(publisher);
  }

  // A fake API server started again with these feature gates (a 1.34/1.35 one: "DRADeviceTaints=false").
  void RestartApiWithGates(const std::string& gates) {
    publisher_.reset();
    api_.reset();
    auto api = sim::KubeApiSim::Start(dir_.path(), {.feature_gates = gates});
    ASSERT_TRUE(api.ok()) << api.status();
    api_ = *std::move(api);
    Connect();
  }

  // A request of our own to the fake server, as another client would send it.
  ApiResponse Request(const std::string& method, const std::string& path, const Json& body = nullptr) {
    auto kubeconfig = api_->WriteKubeconfig(dir_.path() / "kubeconfig");
    EXPECT_TRUE(kubeconfig.ok());
    auto config = LoadClusterConfig(*kubeconfig, "");
    EXPECT_TRUE(config.ok()) << config.status();
    ApiClient client(*config);
    auto response = client.Send(method, path, body.is_null() ? "" : "application/json",
                                body.is_null() ? "" : body.dump(), 10s);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? *response : ApiResponse{};
  }

  // Watch requests the server has taken (each logged when it starts).
  size_t Watching() {
    size_t count = 0;
    for (const sim::KubeApiRequest& request : api_->Log()) count += request.watch ? 1 : 0;
    return count;
  }

  size_t DevicesIn(const Json& slice) { return slice["spec"].value("devices", Json::array()).size(); }

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

  // A connection cut mid-answer is the transport's failure: Unavailable, naming the request, never the Aborted that
  // means the server's 409.
  ASSERT_TRUE(api_->Control(absl::StrCat("cut GET ", kSlices, " 1")).ok());
  auto cut = publisher_->Publish(Gpus(1));
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kUnavailable) << cut.status();
  EXPECT_THAT(cut.status().message(), HasSubstr(absl::StrCat("GET ", api_->url(), kSlices)));
}

std::vector<SliceDevice> TaintedGpus(int count, int tainted) {
  std::vector<SliceDevice> out = Gpus(count);
  out[tainted] = Gpu(tainted + 1, /*healthy=*/false);
  return out;
}

// kube-apiserver 1.36 caps a slice at 64 devices when any of them has a taint (ResourceSliceMaxDevicesWith-
// AdvancedFeatures), on create and on update. 65 GPUs with one unhealthy used to be one slice, refused with 422 on
// every pass, the old slices kept.
TEST_F(ResourceSlicesTest, ASliceWithATaintedDeviceHoldsAtMost64Devices) {
  auto healthy = publisher_->Publish(Gpus(65));  // no taint: one slice of 65 is valid
  ASSERT_TRUE(healthy.ok()) << healthy.status();
  ASSERT_EQ(Stored().size(), 1u);

  auto tainted = publisher_->Publish(TaintedGpus(65, 64));
  ASSERT_TRUE(tainted.ok()) << tainted.status();
  Json slices = Stored();
  ASSERT_EQ(slices.size(), 2u);
  size_t devices = 0;
  for (const Json& slice : slices) {
    EXPECT_LE(DevicesIn(slice), kMaxDevicesPerSliceWithAdvancedFeatures);
    EXPECT_EQ(slice["spec"]["pool"]["resourceSliceCount"], 2);
    devices += DevicesIn(slice);
  }
  EXPECT_EQ(devices, 65u);

  // 200 GPUs, the last unhealthy: slices of 128 in device order until one would hold the tainted device past 64.
  auto big = publisher_->Publish(TaintedGpus(200, 199));
  ASSERT_TRUE(big.ok()) << big.status();
  slices = Stored();
  std::vector<size_t> sizes;
  for (const Json& slice : slices) {
    sizes.push_back(DevicesIn(slice));
    bool tainted_slice = false;
    for (const Json& device : slice["spec"]["devices"]) tainted_slice = tainted_slice || device.contains("taints");
    EXPECT_LE(DevicesIn(slice), tainted_slice ? 64u : 128u);
  }
  std::sort(sizes.begin(), sizes.end());
  EXPECT_EQ(sizes, (std::vector<size_t>{1, 71, 128}));
  // And nothing written again while nothing changes.
  const size_t writes = Writes();
  ASSERT_TRUE(publisher_->Publish(TaintedGpus(200, 199)).ok());
  EXPECT_EQ(Writes(), writes);
}

// The simulator refuses what kube-apiserver 1.36 refuses, in its words: a slice of 65 devices one of which is
// tainted (create and update), and 129 devices without taints.
TEST_F(ResourceSlicesTest, TheApiRefusesA65DeviceSliceWithATaintAsKubeApiserverDoes) {
  auto slice = [&](int count, bool taint) {
    Json devices = Json::array();
    for (int i = 0; i < count; ++i) {
      Json device = {{"name", absl::StrFormat("gpu-%d", i)}};
      if (taint && i == 0) device["taints"] = Json::array({{{"key", "example.com/unhealthy"}, {"effect", "NoSchedule"}}});
      devices.push_back(device);
    }
    return Json{{"apiVersion", "resource.k8s.io/v1"}, {"kind", "ResourceSlice"},
                {"metadata", {{"name", "big"}}},
                {"spec", {{"driver", kDriver}, {"nodeName", kNode},
                          {"pool", {{"name", kNode}, {"generation", 0}, {"resourceSliceCount", 1}}},
                          {"devices", devices}}}};
  };
  ApiResponse refused = Request("POST", kSlices, slice(65, true));
  EXPECT_EQ(refused.code, 422);
  const Json status = Json::parse(refused.body);
  EXPECT_EQ(status["reason"], "Invalid");
  EXPECT_EQ(status["message"], "ResourceSlice.resource.k8s.io \"big\" is invalid: spec.devices: Too many: 65: must "
                               "have at most 64 items");
  EXPECT_EQ(status["details"]["causes"][0]["field"], "spec.devices");
  EXPECT_EQ(status["details"]["causes"][0]["reason"], "FieldValueTooMany");
  EXPECT_EQ(Request("POST", kSlices, slice(129, false)).code, 422);

  ApiResponse created = Request("POST", kSlices, slice(65, false));
  ASSERT_EQ(created.code, 201) << created.body;
  Json update = slice(65, true);
  update["metadata"]["resourceVersion"] = Json::parse(created.body)["metadata"]["resourceVersion"];
  ApiResponse updated = Request("PUT", absl::StrCat(kSlices, "/big"), update);
  EXPECT_EQ(updated.code, 422);
  EXPECT_THAT(updated.body, HasSubstr("Too many: 65: must have at most 64 items"));
  EXPECT_EQ(Request("POST", kSlices, slice(64, true)).code, 409);  // valid; "big" exists already
}

// Kubernetes 1.34/1.35 (DRADeviceTaints off) store a slice without its devices' taints. An unhealthy GPU must then
// not stay allocatable, and the difference between what was written and what is stored must not make every pass
// write the whole pool again.
TEST_F(ResourceSlicesTest, WhenTheServerDropsTaintsTheUnhealthyDeviceIsLeftOutAndNothingLoops) {
  RestartApiWithGates("DRADeviceTaints=false");
  ASSERT_TRUE(publisher_->Publish(Gpus(3)).ok());
  auto unhealthy = publisher_->Publish(TaintedGpus(3, 1));
  ASSERT_TRUE(unhealthy.ok()) << unhealthy.status();
  EXPECT_TRUE(publisher_->taints_dropped());
  EXPECT_EQ(unhealthy->left_out, 1);
  Json slices = Stored();
  ASSERT_EQ(slices.size(), 1u);
  std::vector<std::string> names;
  for (const Json& device : slices[0]["spec"]["devices"]) names.push_back(device["name"]);
  EXPECT_EQ(names, (std::vector<std::string>{"gpu-0000-01-00-0", "gpu-0000-03-00-0"}));

  // Several resyncs while the GPU stays unhealthy: one list each, no write.
  const size_t writes = Writes();
  for (int i = 0; i < 5; ++i) {
    auto again = publisher_->Publish(TaintedGpus(3, 1));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_FALSE(again->changed());
  }
  EXPECT_EQ(Writes(), writes);
  // Healthy again: back in the slice.
  ASSERT_TRUE(publisher_->Publish(Gpus(3)).ok());
  EXPECT_EQ(DevicesIn(Stored()[0]), 3u);
}

SliceDevice Bound(int bus) {
  SliceDevice device = Gpu(bus);
  device.binding_conditions = {"gpu.vfio-agent.cozystack.io/vfio-bound"};
  device.binding_failure_conditions = {"gpu.vfio-agent.cozystack.io/bind-failed"};
  return device;
}

// 1.36 stores binding conditions as written; they do not lower the 128-device cap (only taints, counters and list
// attributes do), and a pass that finds them stored writes nothing.
TEST_F(ResourceSlicesTest, BindingConditionsArePublishedAndDoNotLowerTheDeviceCap) {
  std::vector<SliceDevice> devices;
  for (int i = 0; i < 100; ++i) devices.push_back(Bound(i + 1));
  auto result = publisher_->Publish(devices);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_FALSE(result->binding_conditions_dropped);
  Json slices = Stored();
  ASSERT_EQ(slices.size(), 1u);
  EXPECT_EQ(DevicesIn(slices[0]), 100u);
  const Json& device = slices[0]["spec"]["devices"][0];
  EXPECT_EQ(device["bindingConditions"], Json::array({"gpu.vfio-agent.cozystack.io/vfio-bound"}));
  EXPECT_EQ(device["bindingFailureConditions"], Json::array({"gpu.vfio-agent.cozystack.io/bind-failed"}));
  EXPECT_FALSE(device.contains("bindsToNode"));  // our slices name their node already
  const size_t writes = Writes();
  ASSERT_TRUE(publisher_->Publish(devices).ok());
  EXPECT_EQ(Writes(), writes);
}

// kube-apiserver 1.36's validateDeviceBindingParameters, as the fake server answers it.
TEST_F(ResourceSlicesTest, TheApiValidatesBindingConditionsAsKubeApiserverDoes) {
  auto slice = [&](Json conditions, Json failures) {
    Json device = {{"name", "gpu-0"}};
    if (!conditions.is_null()) device["bindingConditions"] = conditions;
    if (!failures.is_null()) device["bindingFailureConditions"] = failures;
    return Json{{"apiVersion", "resource.k8s.io/v1"}, {"kind", "ResourceSlice"}, {"metadata", {{"name", "s"}}},
                {"spec", {{"driver", kDriver}, {"nodeName", kNode},
                          {"pool", {{"name", kNode}, {"generation", 0}, {"resourceSliceCount", 1}}},
                          {"devices", Json::array({device})}}}};
  };
  auto message = [&](const ApiResponse& response) {
    EXPECT_EQ(response.code, 422) << response.body;
    return Json::parse(response.body).value("message", "");
  };
  EXPECT_THAT(message(Request("POST", kSlices, slice({"a/1", "a/2", "a/3", "a/4", "a/5"}, {"f/1"}))),
              HasSubstr("spec.devices[0].bindingConditions: Too many: 5: must have at most 4 items"));
  EXPECT_THAT(message(Request("POST", kSlices, slice({"a/1"}, {"f/1", "f/2", "f/3", "f/4", "f/5"}))),
              HasSubstr("spec.devices[0].bindingFailureConditions: Too many: 5"));
  EXPECT_THAT(message(Request("POST", kSlices, slice({"not a type"}, {"f/1"}))),
              HasSubstr("spec.devices[0].bindingConditions[0]: Invalid value"));
  EXPECT_THAT(message(Request("POST", kSlices, slice({"a/1"}, {"a/1"}))),
              HasSubstr("bindingFailureConditions must not overlap with bindingConditions"));
  EXPECT_THAT(message(Request("POST", kSlices, slice({"a/1"}, nullptr))),
              HasSubstr("bindingFailureConditions are required to use bindingConditions"));
  EXPECT_THAT(message(Request("POST", kSlices, slice(nullptr, {"f/1"}))),
              HasSubstr("bindingConditions are required to use bindingFailureConditions"));
  EXPECT_EQ(Request("POST", kSlices, slice({"a/1", "a/2", "a/3", "a/4"}, {"f/1", "f/2", "f/3", "f/4"})).code, 201);
}

// 1.34/1.35 (DRADeviceBindingConditions off) drop the fields: the publisher says so in every result (the driver
// then binds in Prepare), publishes the devices without them and does not rewrite every pass.
TEST_F(ResourceSlicesTest, WhenTheServerDropsBindingConditionsEveryResultSaysSoAndNothingLoops) {
  RestartApiWithGates("DRADeviceBindingConditions=false");
  auto result = publisher_->Publish({Bound(1), Bound(2)});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->binding_conditions_dropped);
  EXPECT_EQ(DevicesIn(Stored()[0]), 2u);
  EXPECT_FALSE(Stored()[0]["spec"]["devices"][0].contains("bindingConditions"));
  const size_t writes = Writes();
  for (int i = 0; i < 3; ++i) {
    auto again = publisher_->Publish({Bound(1), Bound(2)});
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_TRUE(again->binding_conditions_dropped);
  }
  EXPECT_EQ(Writes(), writes);
}

// A server that changes what it stores in a way we cannot express (here: dropping a field) does not make every
// pass rewrite: what our last write left, untouched since, is taken as equal.
TEST_F(ResourceSlicesTest, WhatOurLastWriteLeftIsNotRewrittenWhateverTheServerStored) {
  RestartApiWithGates("DRADeviceTaints=false");
  // An informational taint (effect None) is dropped by the server and not a reason to leave the device out.
  SliceDevice informational = Gpu(1);
  informational.taints.push_back({.key = "example.com/note", .value = "x", .effect = "None"});
  ASSERT_TRUE(publisher_->Publish({informational, Gpu(2)}).ok());
  const size_t puts = api_->Count("PUT", kSlices);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(publisher_->Publish({informational, Gpu(2)}).ok());
  EXPECT_EQ(api_->Count("PUT", kSlices), puts);
  EXPECT_EQ(DevicesIn(Stored()[0]), 2u);
}

// The watch: a deletion by anyone (the kubelet's start, kubectl) or a change by another writer is reported at once;
// 410 Gone leads to a new list; a watch the server ends is made again from where it was.
TEST_F(ResourceSlicesTest, TheWatchReportsDeletionsAndChangesByOthersAndSurvives410AndServerCuts) {
  ASSERT_TRUE(publisher_->Publish(Gpus(2)).ok());
  std::atomic<int> changes{0};
  std::unique_ptr<ResourceSliceWatch> watch = publisher_->Watch([&] { ++changes; });
  ASSERT_TRUE(sim::KubeApiSim::WaitFor([&] { return Watching() == 1; }));
  const std::string name = Stored()[0]["metadata"]["name"];

  // Deleted through the API, as kubectl would.
  const int before_delete = changes;
  ASSERT_EQ(Request("DELETE", absl::StrCat(kSlices, "/", name)).code, 200);
  ASSERT_TRUE(sim::KubeApiSim::WaitFor([&] { return changes > before_delete; }));
  // Our own writes are not reported: the create below is not, the other writer's change after it (delivered
  // after it, in order) is, once.
  const int before_publish = changes;
  auto recreated = publisher_->Publish(Gpus(2));
  ASSERT_TRUE(recreated.ok()) << recreated.status();
  EXPECT_EQ(recreated->created, 1);
  EXPECT_FALSE(recreated->others_meanwhile);
  const std::string name_now = Stored()[0]["metadata"]["name"];
  ASSERT_TRUE(api_->Control(absl::StrCat("patch-slice ", name_now, R"( {"spec":{"devices":[]}})")).ok());
  ASSERT_TRUE(sim::KubeApiSim::WaitFor([&] { return changes > before_publish; }));
  EXPECT_EQ(changes, before_publish + 1);

  // The server ends every watch: a new one from the last resourceVersion, no list.
  const uint64_t lists = watch->lists();
  const uint64_t watches = watch->watches();
  ASSERT_TRUE(api_->Control("close-watches").ok());
  ASSERT_TRUE(sim::KubeApiSim::WaitFor([&] { return watch->watches() > watches; }));
  EXPECT_EQ(watch->lists(), lists);

  // Compaction, then a cut: the re-watch from the old resourceVersion gets 410 and the watch lists again (and
  // reports, since it cannot know what it missed). A deletion afterwards is still seen.
  // How many watches it takes to get there is timing (a watch the server ends within a second of its start is
  // retried after a back-off, and the compaction may come during it): the list is the condition. The watch after
  // it starts from the list's resourceVersion, so the deletion below reaches it whenever it opens.
  ASSERT_TRUE(api_->Control("compact").ok());
  ASSERT_TRUE(api_->Control("close-watches").ok());
  ASSERT_TRUE(sim::KubeApiSim::WaitFor([&] { return watch->lists() > lists; }));
  const int before_kubelet = changes;
  ASSERT_TRUE(api_->Control(absl::StrCat("delete-slices ", kNode)).ok());
  ASSERT_TRUE(sim::KubeApiSim::WaitFor([&] { return changes > before_kubelet; }));
}

// A watch that cannot connect backs off (doubling from 1 s), and its destruction ends it promptly even while it
// waits or watches.
TEST_F(ResourceSlicesTest, TheWatchBacksOffOnErrorsAndStopsWhenDestroyed) {
  ASSERT_TRUE(api_->Control(absl::StrCat("fail GET ", kSlices, " 503 -1")).ok());
  std::unique_ptr<ResourceSliceWatch> watch = publisher_->Watch([] {});
  ASSERT_TRUE(sim::KubeApiSim::WaitFor([&] { return watch->lists() >= 2; }));
  watch.reset();
  ASSERT_TRUE(api_->Control("clear-faults").ok());
  watch = publisher_->Watch([] {});
  ASSERT_TRUE(sim::KubeApiSim::WaitFor([&] { return watch->watches() >= 1; }));
  watch.reset();  // a watch in progress is cancelled, not waited out
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
