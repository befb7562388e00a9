// NodePrepareResources/NodeUnprepareResources for GPUs already on vfio-pci, end to end: kubelet-dra-sim calls the
// driver, which reads the ResourceClaim from the fake API server and checks the devices on a plain-directory sysfs.
// The CDI spec, the KEP-5304 metadata (read by a reader written from the format: a JSON stream of which the
// v1alpha1 object is taken) and the checkpoint are read back from disk.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "claim_fixture.h"
#include "driver_start.h"
#include "kube/api_sim_fixture.h"
#include "kube_api_sim.h"
#include "kubelet_dra_sim.h"
#include "metadata_reader.h"
#include "nlohmann/json.hpp"
#include "support/sysfs_tree.h"
#include "support/wait.h"
#include "vfio_gpu_agent/dra/device_names.h"
#include "vfio_gpu_agent/dra/driver.h"

namespace vfio_agent::dra {
namespace {

using Json = nlohmann::json;
namespace drav1 = kubeletsim::dra::drav1;
using kubeletsim::dra::KubeletDraSim;
using kubeletsim::dra::MakeClaim;
using namespace std::chrono_literals;

constexpr char kDriver[] = "gpu.vfio-agent.cozystack.io";
constexpr char kPool[] = "node-a";
// Eight H200s on vfio-pci, each alone in its IOMMU group 10..17.
const std::vector<std::string> kGpus = {"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0",
                                        "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0"};
constexpr char kGpuWithAudio[] = "0000:04:00.0";  // group 30 with its HDA function 0000:04:00.1 on snd_hda_intel
constexpr char kGpuWithNic[] = "0000:05:00.0";    // group 31 with a NIC 0000:05:00.1 on i40e

using testing::ReadDeviceMetadata;
using testing::ReadFile;

struct Allocation {
  std::string request;
  std::string bdf;
  std::string driver = kDriver;
};

class DraPrepareTest : public claimtest::ClaimApiTest {
 protected:
  void SetUp() override {
    ClaimApiTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;

    testing::SysfsTree tree(dir_.path() / "sys");
    std::filesystem::create_directories(dir_.path() / "dev/vfio");
    for (size_t i = 0; i < kGpus.size(); ++i) {
      AddGpu(tree, kGpus[i], 10 + static_cast<int>(i));
    }
    AddGpu(tree, kGpuWithAudio, 30);
    tree.AddDevice({.bdf = "0000:04:00.1", .device = 0x22ba, .class_code = 0x040300, .driver = "snd_hda_intel",
                    .iommu_group = 30});
    AddGpu(tree, kGpuWithNic, 31);
    tree.AddDevice({.bdf = "0000:05:00.1", .vendor = 0x8086, .device = 0x1572, .class_code = 0x020000,
                    .driver = "i40e", .iommu_group = 31});
    std::filesystem::create_directories(dir_.path() / "proc/sys/kernel/random");
    SetBootId("boot-1");
  }

  void AddGpu(testing::SysfsTree& tree, const std::string& bdf, int group) {
    tree.AddDevice({.bdf = bdf, .driver = "vfio-pci", .iommu_group = group});
    std::ofstream(dir_.path() / "dev/vfio" / std::to_string(group));
  }

  void SetBootId(const std::string& id) { std::ofstream(dir_.path() / "proc/sys/kernel/random/boot_id") << id << "\n"; }

  DriverOptions Options() {
    DriverOptions options = claimtest::NodeDirectories(dir_.path());
    options.get_claim = GetClaim();
    return options;
  }

  // Driver and kubelet up, the driver registered.
  void StartNode() { ASSERT_NO_FATAL_FAILURE(testing::StartRegistered(Options(), &driver_, &kubelet_)); }

  void RestartDriver() {
    driver_.reset();
    ASSERT_TRUE(claimtest::Deregistered(*kubelet_));
    StartNode();
  }

  // A claim as the scheduler leaves it: allocated, one result per device.
  void AddClaim(const std::string& name, const std::string& uid, const std::vector<Allocation>& allocations,
                Json annotations = Json::object()) {
    Json results = Json::array();
    for (const Allocation& a : allocations) {
      results.push_back({{"request", a.request}, {"driver", a.driver}, {"pool", kPool}, {"device", DeviceName(a.bdf)}});
    }
    ASSERT_TRUE(api_->Control("claim " + claimtest::AllocatedClaim("vms", name, uid, results, annotations).dump()).ok());
  }

  absl::StatusOr<drav1::NodePrepareResourcesResponse> Prepare(const std::string& name, const std::string& uid) {
    return kubelet_->Prepare(kDriver, {MakeClaim("vms", name, uid)});
  }

  std::filesystem::path CdiSpec(const std::string& uid) const {
    return dir_.path() / "cdi" / absl::StrCat(kDriver, "_claim_", uid, ".json");
  }
  std::filesystem::path Checkpoint(const std::string& uid) const {
    return dir_.path() / "plugins" / kDriver / "claims" / (uid + ".json");
  }
  std::filesystem::path MetadataFile(const std::string& claim, const std::string& request) const {
    return dir_.path() / "plugins" / kDriver / "dra-device-metadata" / ("vms_" + claim) / request / "metadata.json";
  }

  // Checks one prepared claim of single-device requests (KubeVirt's shape) down to the files.
  void ExpectPrepared(const drav1::NodePrepareResourceResponse& response, const std::string& claim,
                      const std::string& uid, const std::vector<Allocation>& allocations) {
    ASSERT_EQ(response.error(), "");
    ASSERT_EQ(response.devices_size(), static_cast<int>(allocations.size()));
    const Json spec = Json::parse(ReadFile(CdiSpec(uid)));
    EXPECT_EQ(spec["kind"], std::string(kDriver) + "/claim");
    std::map<std::string, Json> cdi_devices;
    for (const Json& device : spec["devices"]) cdi_devices[device["name"]] = device["containerEdits"];
    for (size_t i = 0; i < allocations.size(); ++i) {
      const drav1::Device& device = response.devices(static_cast<int>(i));
      const Allocation& a = allocations[i];
      EXPECT_EQ(device.device_name(), DeviceName(a.bdf));
      EXPECT_EQ(device.pool_name(), kPool);
      ASSERT_EQ(device.request_names_size(), 1);
      EXPECT_EQ(device.request_names(0), a.request);
      const std::string gpu_cdi = absl::StrCat(uid, "-", DeviceName(a.bdf));
      const std::string metadata_cdi = absl::StrCat(uid, "-metadata-", a.request);
      ASSERT_EQ(device.cdi_device_ids_size(), 2);
      EXPECT_EQ(device.cdi_device_ids(0), absl::StrCat(kDriver, "/claim=", gpu_cdi));
      EXPECT_EQ(device.cdi_device_ids(1), absl::StrCat(kDriver, "/claim=", metadata_cdi));
      // The VFIO nodes of the GPU's group.
      const int group = 10 + static_cast<int>(std::find(kGpus.begin(), kGpus.end(), a.bdf) - kGpus.begin());
      ASSERT_TRUE(cdi_devices.contains(gpu_cdi));
      EXPECT_EQ(cdi_devices[gpu_cdi]["deviceNodes"],
                Json::parse(absl::StrCat(R"([{"path":"/dev/vfio/vfio","permissions":"rw"},{"path":"/dev/vfio/)", group,
                                         R"(","permissions":"rw"}])")));
      // The metadata file, bind-mounted where KubeVirt looks for it.
      ASSERT_TRUE(cdi_devices.contains(metadata_cdi));
      const Json mount = cdi_devices[metadata_cdi]["mounts"][0];
      EXPECT_EQ(mount["hostPath"], MetadataFile(claim, a.request).string());
      EXPECT_EQ(mount["containerPath"],
                absl::StrCat("/var/run/kubernetes.io/dra-device-attributes/resourceclaims/", claim, "/", a.request, "/",
                             kDriver, "-metadata.json"));
      EXPECT_EQ(mount["options"], Json::parse(R"(["ro","bind"])"));
      std::optional<Json> metadata = ReadDeviceMetadata(MetadataFile(claim, a.request));
      ASSERT_TRUE(metadata.has_value()) << MetadataFile(claim, a.request);
      EXPECT_EQ((*metadata)["metadata"]["uid"], uid);
      EXPECT_EQ((*metadata)["metadata"]["name"], claim);
      ASSERT_EQ((*metadata)["requests"].size(), 1u);
      EXPECT_EQ((*metadata)["requests"][0]["name"], a.request);
      ASSERT_EQ((*metadata)["requests"][0]["devices"].size(), 1u);  // KubeVirt takes exactly one device
      const Json& entry = (*metadata)["requests"][0]["devices"][0];
      EXPECT_EQ(entry["driver"], kDriver);
      EXPECT_EQ(entry["name"], DeviceName(a.bdf));
      EXPECT_EQ(entry["attributes"]["resource.kubernetes.io/pciBusID"]["string"], a.bdf);
    }
    const Json checkpoint = Json::parse(ReadFile(Checkpoint(uid)));
    EXPECT_EQ(checkpoint["bootID"], "boot-1");
    EXPECT_EQ(checkpoint["devices"].size(), allocations.size());
  }

  std::unique_ptr<Driver> driver_;
  std::unique_ptr<KubeletDraSim> kubelet_;
};

std::vector<Allocation> OnePerRequest(size_t first, size_t count) {
  std::vector<Allocation> allocations;
  for (size_t i = 0; i < count; ++i) allocations.push_back({absl::StrCat("gpu", i), kGpus[first + i]});
  return allocations;
}

// Kubernetes 1.37's metadata: the file is a stream of the same object as v1beta1, then v1alpha1 (the Go helper's
// order); KubeVirt 1.9's reader skips the version it does not know and still gets its device (issue 32).
TEST_F(DraPrepareTest, TheMetadataFileIsAStreamV1beta1ThenV1alpha1) {
  StartNode();
  AddClaim("one", "uid-one", OnePerRequest(0, 1));
  auto one = Prepare("one", "uid-one");
  ASSERT_TRUE(one.ok()) << one.status();
  std::istringstream stream(ReadFile(MetadataFile("one", "gpu0")));
  std::vector<Json> objects;
  for (Json object; (stream >> std::ws) && !stream.eof();) {
    stream >> object;
    objects.push_back(object);
  }
  ASSERT_EQ(objects.size(), 2u);
  EXPECT_EQ(objects[0]["apiVersion"], "metadata.resource.k8s.io/v1beta1");
  EXPECT_EQ(objects[1]["apiVersion"], "metadata.resource.k8s.io/v1alpha1");
  objects[0].erase("apiVersion");
  objects[1].erase("apiVersion");
  EXPECT_EQ(objects[0], objects[1]);
  std::optional<Json> kubevirt = ReadDeviceMetadata(MetadataFile("one", "gpu0"));
  ASSERT_TRUE(kubevirt.has_value());
  EXPECT_EQ((*kubevirt)["requests"][0]["devices"][0]["attributes"]["resource.kubernetes.io/pciBusID"]["string"],
            kGpus[0]);
}

TEST_F(DraPrepareTest, PreparesClaimsOfOneTwoAndEightGpus) {
  StartNode();
  AddClaim("one", "uid-one", OnePerRequest(0, 1));
  AddClaim("two", "uid-two", OnePerRequest(1, 2));
  AddClaim("eight", "uid-eight", OnePerRequest(0, 8));
  auto one = Prepare("one", "uid-one");
  ASSERT_TRUE(one.ok()) << one.status();
  ExpectPrepared(one->claims().at("uid-one"), "one", "uid-one", OnePerRequest(0, 1));
  auto two = Prepare("two", "uid-two");
  ASSERT_TRUE(two.ok()) << two.status();
  ExpectPrepared(two->claims().at("uid-two"), "two", "uid-two", OnePerRequest(1, 2));

  ASSERT_TRUE(kubelet_->Unprepare(kDriver, {MakeClaim("vms", "one", "uid-one"), MakeClaim("vms", "two", "uid-two")}).ok());
  auto eight = Prepare("eight", "uid-eight");
  ASSERT_TRUE(eight.ok()) << eight.status();
  ExpectPrepared(eight->claims().at("uid-eight"), "eight", "uid-eight", OnePerRequest(0, 8));
}

// The DeviceClass each request named (spec.devices.requests[].exactly.deviceClassName) picks the VFIO backend: the
// legacy group's nodes or iommufd's, never both in one CDI spec (Kata refuses such a spec), even on an iommufd host.
TEST_F(DraPrepareTest, TheRequestsDeviceClassChoosesLegacyOrIommufdNodesNeverBoth) {
  std::ofstream(dir_.path() / "dev/iommu");
  std::filesystem::create_directories(dir_.path() / "dev/vfio/devices");
  for (int i : {0, 1}) {
    const std::string cdev = absl::StrCat("vfio", i);
    std::ofstream(dir_.path() / "dev/vfio/devices" / cdev);
    std::filesystem::create_directories(dir_.path() / "sys/bus/pci/devices" / kGpus[i] / "vfio-dev" / cdev);
  }
  StartNode();
  const std::string legacy = absl::StrCat("h200.", kDriver), iommufd = absl::StrCat("h200-iommufd.", kDriver);
  // requests gpu0 (kGpus[0]) and gpu1 (kGpus[1]) with these classes.
  auto add = [&](const std::string& name, const std::string& uid, const std::string& class0, const std::string& class1) {
    Json claim = claimtest::AllocatedClaim(
        "vms", name, uid,
        Json::array({{{"request", "gpu0"}, {"driver", kDriver}, {"pool", kPool}, {"device", DeviceName(kGpus[0])}},
                     {{"request", "gpu1"}, {"driver", kDriver}, {"pool", kPool}, {"device", DeviceName(kGpus[1])}}}));
    claim["spec"]["devices"]["requests"] = Json::array({{{"name", "gpu0"}, {"exactly", {{"deviceClassName", class0}}}},
                                                        {{"name", "gpu1"}, {"exactly", {{"deviceClassName", class1}}}}});
    ASSERT_TRUE(api_->Control("claim " + claim.dump()).ok());
  };
  auto nodes = [&](const std::string& uid) {
    std::map<std::string, std::vector<std::string>> by_device;
    const Json spec = Json::parse(ReadFile(CdiSpec(uid)));
    for (const Json& device : spec["devices"]) {
      for (const Json& node : device["containerEdits"].value("deviceNodes", Json::array())) {
        by_device[device["name"]].push_back(node["path"]);
      }
    }
    return by_device;
  };
  using Nodes = std::map<std::string, std::vector<std::string>>;

  add("legacy", "uid-legacy", legacy, legacy);
  auto prepared = Prepare("legacy", "uid-legacy");
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  ASSERT_EQ(prepared->claims().at("uid-legacy").error(), "");
  EXPECT_EQ(nodes("uid-legacy"),
            (Nodes{{"uid-legacy-" + DeviceName(kGpus[0]), {"/dev/vfio/vfio", "/dev/vfio/10"}},
                   {"uid-legacy-" + DeviceName(kGpus[1]), {"/dev/vfio/vfio", "/dev/vfio/11"}}}));
  ASSERT_TRUE(kubelet_->Unprepare(kDriver, {MakeClaim("vms", "legacy", "uid-legacy")}).ok());

  add("iommufd", "uid-iommufd", iommufd, iommufd);
  prepared = Prepare("iommufd", "uid-iommufd");
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  ASSERT_EQ(prepared->claims().at("uid-iommufd").error(), "");
  EXPECT_EQ(nodes("uid-iommufd"),
            (Nodes{{"uid-iommufd-" + DeviceName(kGpus[0]), {"/dev/vfio/devices/vfio0", "/dev/iommu"}},
                   {"uid-iommufd-" + DeviceName(kGpus[1]), {"/dev/vfio/devices/vfio1", "/dev/iommu"}}}));
  ASSERT_TRUE(kubelet_->Unprepare(kDriver, {MakeClaim("vms", "iommufd", "uid-iommufd")}).ok());

  add("mixed", "uid-mixed", legacy, iommufd);
  prepared = Prepare("mixed", "uid-mixed");
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  const std::string error = prepared->claims().at("uid-mixed").error();
  EXPECT_NE(error.find("one claim gets one backend"), std::string::npos) << error;
  EXPECT_NE(error.find(iommufd), std::string::npos) << error;
  EXPECT_FALSE(std::filesystem::exists(CdiSpec("uid-mixed")));
}

TEST_F(DraPrepareTest, ARepeatAnswersWhatTheFirstCallPreparedWithoutAnotherRead) {
  StartNode();
  AddClaim("vm", "uid-1", OnePerRequest(0, 2));
  auto first = Prepare("vm", "uid-1");
  ASSERT_TRUE(first.ok()) << first.status();
  auto again = Prepare("vm", "uid-1");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(first->SerializeAsString(), again->SerializeAsString());
  EXPECT_EQ(api_->Count("GET", "/apis/resource.k8s.io/v1/namespaces/vms/resourceclaims/vm", "200"), 1);
}

TEST_F(DraPrepareTest, AnUnknownClaimIsThatClaimsErrorAndUnprepareOfItSucceeds) {
  StartNode();
  AddClaim("vm", "uid-1", OnePerRequest(0, 1));
  auto response = kubelet_->Prepare(kDriver, {MakeClaim("vms", "gone", "uid-gone"), MakeClaim("vms", "vm", "uid-1")});
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_NE(response->claims().at("uid-gone").error().find("resourceclaims.resource.k8s.io \"gone\" not found"),
            std::string::npos)
      << response->claims().at("uid-gone").error();
  EXPECT_EQ(response->claims().at("uid-1").error(), "");  // one claim's failure is not the other's
  auto unprepared = kubelet_->Unprepare(kDriver, {MakeClaim("vms", "never", "uid-never")});
  ASSERT_TRUE(unprepared.ok()) << unprepared.status();
  EXPECT_EQ(unprepared->claims().at("uid-never").error(), "");
}

TEST_F(DraPrepareTest, AClaimWhoseUidDiffersWasReplacedAndIsRefused) {
  StartNode();
  AddClaim("vm", "uid-new", OnePerRequest(0, 1));
  auto response = Prepare("vm", "uid-old");
  ASSERT_TRUE(response.ok()) << response.status();
  const std::string error = response->claims().at("uid-old").error();
  EXPECT_NE(error.find("the API has UID uid-new for this name (the claim was replaced)"), std::string::npos) << error;
  EXPECT_FALSE(std::filesystem::exists(CdiSpec("uid-old")));
  EXPECT_FALSE(std::filesystem::exists(Checkpoint("uid-old")));
}

TEST_F(DraPrepareTest, AClaimNotAllocatedToThisDriverIsRefused) {
  StartNode();
  AddClaim("nvidia", "uid-1", {{.request = "gpu", .bdf = kGpus[0], .driver = "gpu.nvidia.com"}});
  auto response = Prepare("nvidia", "uid-1");
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_NE(response->claims().at("uid-1").error().find("no device allocated to driver gpu.vfio-agent.cozystack.io"),
            std::string::npos);
}

TEST_F(DraPrepareTest, ADeviceAnotherPreparedClaimHoldsIsRefused) {
  StartNode();
  AddClaim("first", "uid-1", OnePerRequest(0, 2));
  AddClaim("second", "uid-2", OnePerRequest(1, 1));
  ASSERT_EQ(Prepare("first", "uid-1")->claims().at("uid-1").error(), "");
  const std::string error = Prepare("second", "uid-2")->claims().at("uid-2").error();
  EXPECT_NE(error.find("device gpu-0000-2a-00-0 (0000:2a:00.0) is held by prepared claim vms/first (uid-1)"),
            std::string::npos)
      << error;
  // Once the first is unprepared, the device is free again.
  ASSERT_TRUE(kubelet_->Unprepare(kDriver, {MakeClaim("vms", "first", "uid-1")}).ok());
  EXPECT_EQ(Prepare("second", "uid-2")->claims().at("uid-2").error(), "");
}

TEST_F(DraPrepareTest, AGroupWithACompanionOffVfioOrAForeignEndpointIsRefusedWithTheReason) {
  StartNode();
  AddClaim("audio", "uid-a", {{.request = "gpu", .bdf = kGpuWithAudio}});
  AddClaim("nic", "uid-n", {{.request = "gpu", .bdf = kGpuWithNic}});
  const std::string audio = Prepare("audio", "uid-a")->claims().at("uid-a").error();
  EXPECT_NE(audio.find("IOMMU group 30 member 0000:04:00.1 is on driver snd_hda_intel, not vfio-pci"),
            std::string::npos)
      << audio;
  const std::string nic = Prepare("nic", "uid-n")->claims().at("uid-n").error();
  EXPECT_NE(nic.find("IOMMU group 31 also holds 0000:05:00.1 (8086:1572, driver i40e)"), std::string::npos) << nic;
}

TEST_F(DraPrepareTest, AMissingGroupNodeIsRefused) {
  StartNode();
  std::filesystem::remove(dir_.path() / "dev/vfio/10");
  AddClaim("vm", "uid-1", OnePerRequest(0, 1));
  const std::string error = Prepare("vm", "uid-1")->claims().at("uid-1").error();
  EXPECT_NE(error.find("dev/vfio/10 does not exist"), std::string::npos) << error;
}

TEST_F(DraPrepareTest, UnprepareRemovesTheCdiSpecTheMetadataAndTheCheckpointAndLeavesTheGpuOnVfio) {
  StartNode();
  AddClaim("vm", "uid-1", OnePerRequest(0, 1));
  ASSERT_EQ(Prepare("vm", "uid-1")->claims().at("uid-1").error(), "");
  ASSERT_TRUE(std::filesystem::exists(CdiSpec("uid-1")));
  auto response = kubelet_->Unprepare(kDriver, {MakeClaim("vms", "vm", "uid-1")});
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->claims().at("uid-1").error(), "");
  EXPECT_FALSE(std::filesystem::exists(CdiSpec("uid-1")));
  EXPECT_FALSE(std::filesystem::exists(MetadataFile("vm", "gpu0")));
  EXPECT_FALSE(std::filesystem::exists(Checkpoint("uid-1")));
  EXPECT_EQ(std::filesystem::read_symlink(dir_.path() / "sys/bus/pci/devices" / kGpus[0] / "driver").filename(),
            "vfio-pci");
}

TEST_F(DraPrepareTest, AClaimFromATemplateIsMountedUnderThePodsClaimName) {
  StartNode();
  AddClaim("vm-gpu-x7k2p", "uid-1", OnePerRequest(0, 1), {{"resource.kubernetes.io/pod-claim-name", "gpu"}});
  ASSERT_EQ(Prepare("vm-gpu-x7k2p", "uid-1")->claims().at("uid-1").error(), "");
  const Json spec = Json::parse(ReadFile(CdiSpec("uid-1")));
  EXPECT_EQ(spec["devices"][1]["containerEdits"]["mounts"][0]["containerPath"],
            absl::StrCat("/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpu/gpu0/", kDriver,
                         "-metadata.json"));
  EXPECT_EQ((*ReadDeviceMetadata(MetadataFile("vm-gpu-x7k2p", "gpu0")))["podClaimName"], "gpu");
}

// DRAExtendedResource: a VM spec asking nvidia.com/<NAME> gets a claim the scheduler made, and KubeVirt reads the
// BDFs from the env the device plugin's Allocate sets, once for the claim, sorted and comma-joined.
TEST_F(DraPrepareTest, AnExtendedResourceClaimSetsTheDevicePluginsEnvOnce) {
  StartNode();
  AddClaim("pod-gpus", "uid-ext", {{"container-0-request-0", kGpus[3]}, {"container-0-request-0", kGpus[1]}},
           {{"resource.kubernetes.io/extended-resource-claim", "true"}});
  AddClaim("plain", "uid-plain", OnePerRequest(0, 1));
  auto extended = Prepare("pod-gpus", "uid-ext");
  ASSERT_TRUE(extended.ok()) << extended.status();
  ASSERT_EQ(extended->claims().at("uid-ext").error(), "");
  const Json spec = Json::parse(ReadFile(CdiSpec("uid-ext")));
  EXPECT_EQ(spec["containerEdits"]["env"],
            Json::array({absl::StrCat("PCI_RESOURCE_NVIDIA_COM_GH100_H200_SXM_141GB=", kGpus[1], ",", kGpus[3])}));
  for (const Json& device : spec["devices"]) EXPECT_FALSE(device["containerEdits"].contains("env"));
  // Any claim without the annotation (a VM's own ResourceClaim) gets no env: KubeVirt reads the metadata file.
  auto plain = Prepare("plain", "uid-plain");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(Json::parse(ReadFile(CdiSpec("uid-plain"))).contains("containerEdits"));
}

// A claim deleted (or deleted and re-created under another UID) while the agent was down is cleaned up when it
// starts; a claim the API still has stays prepared.
TEST_F(DraPrepareTest, ClaimsGoneFromTheApiWhileTheAgentWasDownAreCleanedUpAtStart) {
  StartNode();
  AddClaim("kept", "uid-kept", OnePerRequest(0, 1));
  AddClaim("gone", "uid-gone", OnePerRequest(1, 1));
  AddClaim("replaced", "uid-old", OnePerRequest(2, 1));
  for (const auto& [name, uid] : std::vector<std::pair<std::string, std::string>>{
           {"kept", "uid-kept"}, {"gone", "uid-gone"}, {"replaced", "uid-old"}}) {
    auto prepared = Prepare(name, uid);
    ASSERT_TRUE(prepared.ok()) << prepared.status();
    ASSERT_EQ(prepared->claims().at(uid).error(), "");
  }
  driver_.reset();
  ASSERT_TRUE(api_->Control("delete-claim vms gone").ok());
  AddClaim("replaced", "uid-new", OnePerRequest(2, 1));
  StartNode();
  EXPECT_TRUE(testing::WaitUntil([&] {
    return !std::filesystem::exists(Checkpoint("uid-gone")) && !std::filesystem::exists(Checkpoint("uid-old"));
  }));
  for (const std::string uid : {"uid-gone", "uid-old"}) EXPECT_FALSE(std::filesystem::exists(CdiSpec(uid))) << uid;
  EXPECT_FALSE(std::filesystem::exists(MetadataFile("gone", "gpu0").parent_path()));
  EXPECT_TRUE(std::filesystem::exists(Checkpoint("uid-kept")));
  EXPECT_TRUE(std::filesystem::exists(CdiSpec("uid-kept")));
  // The GPU the deleted claim held is free for the next claim.
  AddClaim("next", "uid-next", OnePerRequest(1, 1));
  auto next = Prepare("next", "uid-next");
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->claims().at("uid-next").error(), "");
}

TEST_F(DraPrepareTest, AnAgentRestartKeepsPreparedClaimsAndAnotherBootDiscardsThem) {
  StartNode();
  AddClaim("vm", "uid-1", OnePerRequest(0, 1));
  AddClaim("other", "uid-2", OnePerRequest(0, 1));
  auto first = Prepare("vm", "uid-1");
  ASSERT_EQ(first->claims().at("uid-1").error(), "");

  RestartDriver();
  // The start's stale-claim sweep reads it once; the kubelet's repeat reads nothing.
  const std::string claim_path = "/apis/resource.k8s.io/v1/namespaces/vms/resourceclaims/vm";
  ASSERT_TRUE(testing::WaitUntil([&] { return api_->Count("GET", claim_path, "200") == 2; }));
  auto again = Prepare("vm", "uid-1");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(first->SerializeAsString(), again->SerializeAsString());
  EXPECT_EQ(api_->Count("GET", claim_path, "200"), 2);
  EXPECT_NE(Prepare("other", "uid-2")->claims().at("uid-2").error().find("is held by prepared claim vms/vm"),
            std::string::npos);

  SetBootId("boot-2");
  RestartDriver();
  EXPECT_FALSE(std::filesystem::exists(CdiSpec("uid-1")));
  EXPECT_FALSE(std::filesystem::exists(Checkpoint("uid-1")));
  EXPECT_EQ(Prepare("other", "uid-2")->claims().at("uid-2").error(), "");
}

TEST_F(DraPrepareTest, AClaimTheAgentMayNotReadIsThatClaimsError) {
  StartNode();
  AddClaim("vm", "uid-1", OnePerRequest(0, 1));
  ASSERT_TRUE(api_->Control("deny get resourceclaims.resource.k8s.io").ok());
  const std::string error = Prepare("vm", "uid-1")->claims().at("uid-1").error();
  EXPECT_NE(error.find("cannot get resource \"resourceclaims\" in API group \"resource.k8s.io\""), std::string::npos)
      << error;
}

// pid of `vfio-gpu-agent args...`, its output in <dir>/agent.log.
pid_t SpawnAgent(const std::vector<std::string>& args, const std::filesystem::path& log) {
  std::vector<std::string> argv_strings = {VFIO_AGENT_BINARY};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& arg : argv_strings) argv.push_back(arg.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  if (posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&actions);
  return pid;
}

int WaitExit(pid_t pid) {
  int status = 0;
  if (!testing::WaitUntil([&] { return ::waitpid(pid, &status, WNOHANG) == pid; })) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST_F(DraPrepareTest, ServeWithTheDraApiPreparesClaimsAndStartsNoDevicePlugin) {
  const DriverOptions options = Options();
  const std::filesystem::path device_plugins = dir_.path() / "device-plugins";
  std::filesystem::create_directories(device_plugins);
  const pid_t agent = SpawnAgent(
      {"serve", "--kubelet-api", "dra", "--kubelet-registry-dir", options.registry_dir.string(),
       "--kubelet-plugins-dir", options.plugins_dir.string(), "--cdi-dir", options.cdi_dir.string(), "--sysfs-root",
       options.paths.sysfs_root.string(), "--dev-root", options.paths.dev_root.string(), "--proc-root",
       options.paths.proc_root.string(), "--kubelet-dir", device_plugins.string(), "--kubeconfig",
       (dir_.path() / "kubeconfig").string(), "--node-name", kPool},
      dir_.path() / "agent.log");
  ASSERT_GT(agent, 0);
  kubelet_ = std::make_unique<KubeletDraSim>(kubeletsim::dra::Options{.registry_dir = options.registry_dir});
  ASSERT_TRUE(kubelet_->Start().ok());
  ASSERT_TRUE(kubelet_->WaitFor([](const KubeletDraSim& k) { return k.Count("register") == 1; }, 30s))
      << ReadFile(dir_.path() / "agent.log");
  AddClaim("vm", "uid-1", OnePerRequest(0, 1));
  auto response = Prepare("vm", "uid-1");
  ASSERT_TRUE(response.ok()) << response.status();
  ExpectPrepared(response->claims().at("uid-1"), "vm", "uid-1", OnePerRequest(0, 1));
  EXPECT_TRUE(std::filesystem::is_empty(device_plugins));  // one kubelet API at a time
  // The node's slice: every GPU in the node's pool; the two whose groups are not viable (an HDA function on
  // snd_hda_intel, a NIC) tainted.
  ASSERT_TRUE(testing::WaitUntil([&] {
    auto slices = api_->Slices();
    return slices.ok() && slices->size() == 1 && (*slices)[0]["spec"]["devices"].size() == kGpus.size() + 2;
  })) << ReadFile(dir_.path() / "agent.log");
  const Json slice = (*api_->Slices())[0];
  EXPECT_EQ(slice["spec"]["pool"]["name"], kPool);
  std::vector<std::string> tainted;
  for (const Json& device : slice["spec"]["devices"]) {
    if (device.contains("taints")) tainted.push_back(device["name"]);
  }
  EXPECT_EQ(tainted, (std::vector<std::string>{DeviceName(kGpuWithAudio), DeviceName(kGpuWithNic)}));

  ::kill(agent, SIGTERM);
  EXPECT_EQ(WaitExit(agent), 0) << ReadFile(dir_.path() / "agent.log");
  EXPECT_FALSE(std::filesystem::exists(RegistrationSocket(options)));
  EXPECT_FALSE(std::filesystem::exists(DraSocket(options)));
  EXPECT_TRUE(std::filesystem::exists(CdiSpec("uid-1")));  // a running VM's claim outlives the agent
}

TEST_F(DraPrepareTest, UnknownKubeletApiIsAUsageError) {
  EXPECT_EQ(WaitExit(SpawnAgent({"serve", "--kubelet-api", "csi"}, dir_.path() / "agent.log")), 2);
  EXPECT_NE(ReadFile(dir_.path() / "agent.log").find("--kubelet-api \"csi\": device-plugin or dra"), std::string::npos);
}

TEST(DraDeviceNamesTest, TheNameIsThePciAddressAndBack) {
  EXPECT_EQ(DeviceName("0000:3b:00.0"), "gpu-0000-3b-00-0");
  EXPECT_EQ(DeviceName("0001:e1:1f.7"), "gpu-0001-e1-1f-7");
  EXPECT_EQ(*BdfOfDevice("gpu-0000-3b-00-0"), "0000:3b:00.0");
  EXPECT_EQ(*BdfOfDevice(DeviceName("0001:e1:1f.7")), "0001:e1:1f.7");
  EXPECT_FALSE(BdfOfDevice("gpu-vfio-0").ok());
  EXPECT_FALSE(BdfOfDevice("gpu-0000-3B-00-0").ok());
  EXPECT_FALSE(BdfOfDevice("gpu-0000-3b-00-8").ok());
  EXPECT_FALSE(BdfOfDevice("nic-0000-3b-00-0").ok());
  EXPECT_LE(DeviceName("ffff:ff:1f.7").size(), 63u);
}

}  // namespace
}  // namespace vfio_agent::dra
