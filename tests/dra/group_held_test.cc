// A multi-GPU IOMMU group is one VM's (issue 31, defect 4, the publishing half): while a claim holds a GPU of a
// group, every other GPU of that group that no claim of the same pod holds is published with
// `<driver>/group-held=<group>` NoSchedule, so the scheduler never allocates it to another pod's claim (Prepare
// would refuse the split, and the VM would find its group busy). Republished at once on Prepare and Unprepare, gone
// with the holding claim, never in the health stream, and on a server that drops taints (1.34/1.35) the held
// sibling is left out of the slice as an unhealthy device is. Plain-directory sysfs with two GPUs behind a switch
// without ACS (group 33) and one alone (group 34), the fake API server, and kubelet-dra-sim or the driver's socket.
#include <fstream>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "claim_fixture.h"
#include "dra/v1/api.grpc.pb.h"
#include "driver_start.h"
#include "kube_api_sim.h"
#include "kubelet_dra_sim.h"
#include "nlohmann/json.hpp"
#include "support/sysfs_tree.h"
#include "support/wait.h"
#include "vfio_gpu_agent/dra/device_names.h"
#include "vfio_gpu_agent/dra/driver.h"
#include "vfio_gpu_agent/dra/taints.h"
#include "vfio_gpu_agent/kube/resource_slices.h"

// Its own namespace: dra_test is a unity build, and the other files' constants have these names too.
namespace vfio_agent::dra::group_held {
namespace {

using Json = nlohmann::json;
namespace drav1 = kubeletsim::dra::drav1;
using kubeletsim::dra::KubeletDraSim;
using kubeletsim::dra::MakeClaim;

constexpr char kDriver[] = "gpu.vfio-agent.cozystack.io";
constexpr char kPool[] = "node-a";
constexpr char kGpuA[] = "0000:3b:00.0";      // group 33 with kGpuB: one PCIe switch, no ACS between them
constexpr char kGpuB[] = "0000:3c:00.0";      // group 33
constexpr char kGpuAlone[] = "0000:5e:00.0";  // group 34
constexpr char kHeld33[] = "gpu.vfio-agent.cozystack.io/group-held=33:NoSchedule";

// device name -> "key=value:effect" of each taint ("" when untainted).
using SliceView = std::map<std::string, std::string>;

SliceView Untainted() {
  return {{DeviceName(kGpuA), ""}, {DeviceName(kGpuB), ""}, {DeviceName(kGpuAlone), ""}};
}

// ---- The slice content: what ApplyGroupHeldTaints makes of the devices and the holds.

kube::SliceDevice Gpu(const std::string& bdf, int group) {
  kube::SliceDevice device{.name = DeviceName(bdf)};
  device.attributes["resource.kubernetes.io/pciBusID"] = kube::DeviceAttribute::String(bdf);
  device.attributes[std::string(kDriver) + "/iommuGroup"] = kube::DeviceAttribute::Int(group);
  return device;
}

SliceView Tainted(std::vector<GroupHold> holds) {
  std::vector<kube::SliceDevice> devices = {Gpu(kGpuA, 33), Gpu(kGpuB, 33), Gpu(kGpuAlone, 34)};
  ApplyGroupHeldTaints(&devices, holds, kDriver);
  SliceView view;
  for (const kube::SliceDevice& device : devices) {
    std::string taints;
    for (const kube::DeviceTaint& taint : device.taints) {
      absl::StrAppend(&taints, taints.empty() ? "" : ",", taint.key, "=", taint.value, ":", taint.effect);
    }
    view[device.name] = taints;
  }
  return view;
}

GroupHold Hold(const std::string& bdf, const std::string& claim, const std::string& pod) {
  return {.bdf = bdf, .group = bdf == kGpuAlone ? 34 : 33, .claim = claim, .consumers = {pod}};
}

TEST(DraGroupHeldTaintsTest, TheOtherGpuOfAHeldGroupIsTaintedUnlessTheSameClaimOrPodHoldsIt) {
  EXPECT_EQ(Tainted({}), Untainted());
  // A holds group 33: B is off new allocations, A (allocated already) and the GPU alone are not touched.
  SliceView held = Untainted();
  held[DeviceName(kGpuB)] = kHeld33;
  EXPECT_EQ(Tainted({Hold(kGpuA, "vms/x (x)", "pod-p")}), held);
  // One claim holds both: one VM has the whole group.
  EXPECT_EQ(Tainted({Hold(kGpuA, "vms/x (x)", "pod-p"), Hold(kGpuB, "vms/x (x)", "pod-p")}), Untainted());
  // Two claims of one pod (KubeVirt: one claim per GPU): still one VM.
  EXPECT_EQ(Tainted({Hold(kGpuA, "vms/x (x)", "pod-p"), Hold(kGpuB, "vms/y (y)", "pod-p")}), Untainted());
  // Claims of two pods (a split from before Prepare refused it): each is the other's held sibling.
  SliceView split = Untainted();
  split[DeviceName(kGpuA)] = kHeld33;
  split[DeviceName(kGpuB)] = kHeld33;
  EXPECT_EQ(Tainted({Hold(kGpuA, "vms/x (x)", "pod-p"), Hold(kGpuB, "vms/y (y)", "pod-q")}), split);
  // A GPU alone in its group has no sibling to hold.
  EXPECT_EQ(Tainted({Hold(kGpuAlone, "vms/z (z)", "pod-r")}), Untainted());
}

TEST(DraGroupHeldTaintsTest, ItAddsToAFailureTaintAndLeavesAGpuWithoutAGroupAlone) {
  std::vector<kube::SliceDevice> devices = {Gpu(kGpuA, 33), Gpu(kGpuB, 33)};
  devices[1].taints.push_back(FailureTaint(kDriver, "driver nvidia"));
  kube::SliceDevice no_group{.name = DeviceName("0000:3d:00.0")};  // IOMMU off: no iommuGroup attribute
  no_group.attributes["resource.kubernetes.io/pciBusID"] = kube::DeviceAttribute::String("0000:3d:00.0");
  devices.push_back(no_group);
  const std::map<std::string, HeldSibling> held =
      ApplyGroupHeldTaints(&devices, {Hold(kGpuA, "vms/x (x)", "pod-p")}, kDriver);
  ASSERT_EQ(devices[1].taints.size(), 2u);
  EXPECT_EQ(devices[1].taints[0].key, "gpu.vfio-agent.cozystack.io/not-vfio");
  EXPECT_EQ(devices[1].taints[1].key, "gpu.vfio-agent.cozystack.io/group-held");
  EXPECT_TRUE(devices[2].taints.empty());
  EXPECT_EQ(held, (std::map<std::string, HeldSibling>{
                      {DeviceName(kGpuB), {.bdf = kGpuB, .group = 33, .claim = "vms/x (x)"}}}));
  // Not a failure: validate's failure keys do not count it, the health stream never says it.
  const std::vector<std::string> failures = FailureTaintKeys(kDriver);
  EXPECT_EQ(std::find(failures.begin(), failures.end(), "gpu.vfio-agent.cozystack.io/group-held"), failures.end());
}

// ---- The running driver: Prepare and Unprepare through to the fake API server's slices.

class DraGroupHeldTest : public claimtest::ClaimApiTest {
 protected:
  void SetUp() override {
    ClaimApiTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    testing::SysfsTree tree(dir_.path() / "sys");
    std::filesystem::create_directories(dir_.path() / "dev/vfio");
    for (const auto& [bdf, group] : {std::pair{kGpuA, 33}, {kGpuB, 33}, {kGpuAlone, 34}}) {
      tree.AddDevice({.bdf = bdf, .driver = "vfio-pci", .iommu_group = group});
      std::ofstream(dir_.path() / "dev/vfio" / std::to_string(group));
    }
    std::filesystem::create_directories(dir_.path() / "proc/sys/kernel/random");
    std::ofstream(dir_.path() / "proc/sys/kernel/random/boot_id") << "boot-1\n";
    auto publisher = kube::ConnectResourceSlicePublisher(kubeconfig_, "", {.driver = kDriver, .node_name = kPool});
    ASSERT_TRUE(publisher.ok()) << publisher.status();
    publisher_ = *std::move(publisher);
  }

  // The driver publishes through publisher_, which goes before the base class's members.
  void TearDown() override {
    kubelet_.reset();
    driver_.reset();
  }

  // The resync is an hour: within a test's wait only a Prepare or Unprepare (or the registration burst, which the
  // tests without a kubelet do not have) republishes.
  DriverOptions Options() const {
    DriverOptions options = claimtest::NodeDirectories(dir_.path());
    options.node_name = kPool;
    options.get_claim = GetClaim();
    options.slice_resync_interval = std::chrono::hours(1);
    options.publish_slices = [this](std::vector<kube::SliceDevice> devices) {
      return publisher_->Publish(std::move(devices));
    };
    options.watch_slices = [this](std::function<void()> changed) { return publisher_->Watch(std::move(changed)); };
    return options;
  }

  // The driver alone, called on its own socket as the kubelet would: no registration, so no re-list burst.
  void StartDriver() {
    driver_ = std::make_unique<Driver>(Options());
    ASSERT_TRUE(driver_->Start().ok());
  }
  // The driver registered with kubelet-dra-sim (it opens the health stream).
  void StartNode() { ASSERT_NO_FATAL_FAILURE(testing::StartRegistered(Options(), &driver_, &kubelet_)); }

  // Allocated by the scheduler, one request per GPU, reserved for `pod`.
  void AddClaim(const std::string& uid, const std::vector<std::string>& gpus, const std::string& pod) {
    Json results = Json::array();
    for (const std::string& bdf : gpus) {
      results.push_back({{"request", absl::StrCat("gpu", results.size())}, {"driver", kDriver}, {"pool", kPool},
                         {"device", DeviceName(bdf)}});
    }
    Json claim = claimtest::AllocatedClaim("vms", "claim-" + uid, uid, results);
    claim["status"]["reservedFor"] = Json::array({{{"resource", "pods"}, {"name", pod}, {"uid", pod}}});
    ASSERT_TRUE(api_->Control("claim " + claim.dump()).ok());
  }

  // The claim's error ("" when prepared or unprepared); a broken call fails the test. Through the kubelet when one
  // runs, else straight on dra.sock.
  std::string Prepare(const std::string& uid) {
    if (kubelet_) {
      auto response = kubelet_->Prepare(kDriver, {MakeClaim("vms", "claim-" + uid, uid)});
      EXPECT_TRUE(response.ok()) << response.status();
      return response.ok() ? response->claims().at(uid).error() : "call failed";
    }
    drav1::NodePrepareResourcesRequest request;
    *request.add_claims() = MakeClaim("vms", "claim-" + uid, uid);
    drav1::NodePrepareResourcesResponse response;
    grpc::ClientContext context;
    const grpc::Status status = Stub().NodePrepareResources(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return status.ok() ? response.claims().at(uid).error() : "call failed";
  }
  std::string Unprepare(const std::string& uid) {
    if (kubelet_) {
      auto response = kubelet_->Unprepare(kDriver, {MakeClaim("vms", "claim-" + uid, uid)});
      EXPECT_TRUE(response.ok()) << response.status();
      return response.ok() ? response->claims().at(uid).error() : "call failed";
    }
    drav1::NodeUnprepareResourcesRequest request;
    *request.add_claims() = MakeClaim("vms", "claim-" + uid, uid);
    drav1::NodeUnprepareResourcesResponse response;
    grpc::ClientContext context;
    const grpc::Status status = Stub().NodeUnprepareResources(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return status.ok() ? response.claims().at(uid).error() : "call failed";
  }

  drav1::DRAPlugin::Stub& Stub() {
    if (!stub_) {
      stub_ = drav1::DRAPlugin::NewStub(
          grpc::CreateChannel("unix:" + DraSocket(Options()).string(), grpc::InsecureChannelCredentials()));
    }
    return *stub_;
  }

  // Every device of the node's slices with its taints.
  SliceView Slices() const {
    SliceView devices;
    auto slices = api_->Slices();
    if (!slices.ok() || !slices->is_array()) return devices;
    for (const Json& slice : *slices) {
      for (const Json& device : slice["spec"].value("devices", Json::array())) {
        std::string taints;
        for (const Json& taint : device.value("taints", Json::array())) {
          absl::StrAppend(&taints, taints.empty() ? "" : ",", taint.value("key", ""), "=", taint.value("value", ""),
                          ":", taint.value("effect", ""));
        }
        devices[device.value("name", "")] = taints;
      }
    }
    return devices;
  }
  bool SlicesAre(const SliceView& expected) const {
    return testing::WaitUntil([&] { return Slices() == expected; });
  }

  size_t Writes() const {
    return api_->Count("POST", "/apis/resource.k8s.io/v1/resourceslices", "201") +
           api_->Count("PUT", "/apis/resource.k8s.io/v1/resourceslices", "200");
  }

  // device name -> health as the kubelet last heard it.
  std::map<std::string, std::string> Health() const {
    std::map<std::string, std::string> health;
    const auto latest = kubelet_->LatestHealth(kDriver);
    if (!latest) return health;
    for (const auto& device : latest->devices()) {
      health[device.device().device_name()] =
          ::v1alpha1::HealthStatus_Name(device.health()) + (device.message().empty() ? "" : ": " + device.message());
    }
    return health;
  }

  std::unique_ptr<kube::ResourceSlicePublisher> publisher_;
  std::unique_ptr<Driver> driver_;
  std::unique_ptr<KubeletDraSim> kubelet_;
  std::unique_ptr<drav1::DRAPlugin::Stub> stub_;
};

TEST_F(DraGroupHeldTest, APreparedGpuTaintsItsGroupsOtherGpuUntilUnpreparedAndEachChangeIsWrittenAtOnce) {
  StartDriver();
  ASSERT_TRUE(SlicesAre(Untainted()));
  const size_t writes = Writes();

  AddClaim("uid-a", {kGpuA}, "pod-p");
  ASSERT_EQ(Prepare("uid-a"), "");
  SliceView held = Untainted();
  held[DeviceName(kGpuB)] = kHeld33;
  // Without the driver's own trigger nothing would write before the hour's resync.
  EXPECT_TRUE(SlicesAre(held)) << Slices().size();
  EXPECT_EQ(Writes(), writes + 1);

  // Another pod's claim that the scheduler could no longer make: Prepare still refuses it, naming the holder.
  AddClaim("uid-b", {kGpuB}, "pod-q");
  EXPECT_NE(Prepare("uid-b").find("shares IOMMU group 33 with " + DeviceName(kGpuA)), std::string::npos);
  EXPECT_EQ(Slices(), held);

  ASSERT_EQ(Unprepare("uid-a"), "");
  EXPECT_TRUE(SlicesAre(Untainted()));
  EXPECT_EQ(Writes(), writes + 2);
  // The group is free: the other pod gets it, and now A is the held sibling.
  ASSERT_EQ(Prepare("uid-b"), "");
  SliceView held_by_b = Untainted();
  held_by_b[DeviceName(kGpuA)] = kHeld33;
  EXPECT_TRUE(SlicesAre(held_by_b));
}

TEST_F(DraGroupHeldTest, AClaimHoldingTheWholeGroupOrClaimsOfOnePodTaintNothing) {
  StartDriver();
  ASSERT_TRUE(SlicesAre(Untainted()));
  AddClaim("uid-both", {kGpuA, kGpuB}, "pod-p");
  ASSERT_EQ(Prepare("uid-both"), "");
  AddClaim("uid-alone", {kGpuAlone}, "pod-r");
  ASSERT_EQ(Prepare("uid-alone"), "");
  const size_t writes = Writes();
  ASSERT_EQ(Unprepare("uid-both"), "");
  ASSERT_TRUE(SlicesAre(Untainted()));
  EXPECT_EQ(Writes(), writes);  // nothing was ever tainted: no write for the change

  // KubeVirt's shape: one claim per GPU, both claims of the VM's pod. Between the two Prepares B is held for pod P
  // by nobody yet, so it is kept off other claims; once the pod holds both, nothing is.
  AddClaim("uid-p1", {kGpuA}, "pod-p");
  AddClaim("uid-p2", {kGpuB}, "pod-p");
  ASSERT_EQ(Prepare("uid-p1"), "");
  SliceView held = Untainted();
  held[DeviceName(kGpuB)] = kHeld33;
  EXPECT_TRUE(SlicesAre(held));
  ASSERT_EQ(Prepare("uid-p2"), "");
  EXPECT_TRUE(SlicesAre(Untainted()));
  // One of the pod's claims unprepared first: the GPU it leaves is the other claim's sibling again.
  ASSERT_EQ(Unprepare("uid-p2"), "");
  EXPECT_TRUE(SlicesAre(held));
}

// The held sibling is reserved, not broken: the kubelet keeps hearing HEALTHY while the slice carries the taint. A
// restarted agent reads the holder from its checkpoint and publishes the taint from its first write.
TEST_F(DraGroupHeldTest, TheHealthStreamKeepsAHeldSiblingHealthyAndARestartKeepsTheTaint) {
  StartNode();
  ASSERT_TRUE(SlicesAre(Untainted()));
  AddClaim("uid-a", {kGpuA}, "pod-p");
  ASSERT_EQ(Prepare("uid-a"), "");
  SliceView held = Untainted();
  held[DeviceName(kGpuB)] = kHeld33;
  ASSERT_TRUE(SlicesAre(held));
  const std::map<std::string, std::string> healthy = {
      {DeviceName(kGpuA), "HEALTHY"}, {DeviceName(kGpuB), "HEALTHY"}, {DeviceName(kGpuAlone), "HEALTHY"}};
  EXPECT_TRUE(testing::WaitUntil([&] { return Health() == healthy; }));

  driver_.reset();
  ASSERT_TRUE(claimtest::Deregistered(*kubelet_));
  ASSERT_TRUE(api_->Control(std::string("delete-slices ") + kPool).ok());
  ASSERT_TRUE(testing::WaitUntil([&] { return Slices().empty(); }));
  StartNode();
  EXPECT_TRUE(SlicesAre(held));
  EXPECT_TRUE(testing::WaitUntil([&] { return Health() == healthy; }));
  ASSERT_EQ(Unprepare("uid-a"), "");
  EXPECT_TRUE(SlicesAre(Untainted()));
}

// Kubernetes 1.34/1.35 (DRADeviceTaints off) store the slice without the taint, which would leave the sibling
// allocatable: it is left out of the slice while held, as an unhealthy GPU is, and back once the group is free.
TEST_F(DraGroupHeldTest, AServerThatDropsTaintsGetsTheHeldSiblingLeftOutOfTheSlice) {
  ASSERT_TRUE(api_->Control("feature-gates DRADeviceTaints=false").ok());
  StartDriver();
  ASSERT_TRUE(SlicesAre(Untainted()));
  AddClaim("uid-a", {kGpuA}, "pod-p");
  ASSERT_EQ(Prepare("uid-a"), "");
  EXPECT_TRUE(SlicesAre({{DeviceName(kGpuA), ""}, {DeviceName(kGpuAlone), ""}}));
  const size_t writes = Writes();
  ASSERT_EQ(Unprepare("uid-a"), "");
  EXPECT_TRUE(SlicesAre(Untainted()));
  EXPECT_EQ(Writes(), writes + 1);
}

}  // namespace
}  // namespace vfio_agent::dra::group_held
