// The DRA driver on a vm-vgpu node, against the FUSE simulator's vGPU nodes (vgpu-mdev-t4-a10: a T4 mdev parent;
// vgpu-sriov-l40s-h200: two H200 with SR-IOV vGPUs), vGPUs made by the profile applier: one device per vGPU in the
// node's ResourceSlice (the bare mdevUUID KubeVirt reads, or the VF's pciBusID), Prepare through kubelet-dra-sim
// with the ResourceClaim on the fake API server (CDI spec and KEP-5304 metadata read back), and a removed mdev
// turning unhealthy and tainted. Nothing is ever bound or unbound (the simulator's log of kernel writes).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "driver_start.h"
#include "kube/api_sim_fixture.h"
#include "kube_api_sim.h"
#include "kubelet_dra_sim.h"
#include "metadata_reader.h"
#include "nlohmann/json.hpp"
#include "sim_process.h"
#include "support/fuse.h"
#include "support/wait.h"
#include "vfio_gpu_agent/common/fs.h"
#include "vfio_gpu_agent/dra/device_names.h"
#include "vfio_gpu_agent/dra/driver.h"
#include "vfio_gpu_agent/dra/vgpu_devices.h"
#include "vfio_gpu_agent/vgpu/apply.h"
#include "vgpu/profile_configs.h"

namespace vfio_agent::dra {
namespace {

using Json = nlohmann::json;
namespace drav1 = kubeletsim::dra::drav1;
using kubeletsim::dra::KubeletDraSim;
using kubeletsim::dra::MakeClaim;
using testing::ReadDeviceMetadata;
using testing::ReadFile;
using namespace std::chrono_literals;

constexpr char kDriver[] = "gpu.vfio-agent.cozystack.io";
constexpr char kPool[] = "node-a";
constexpr char kT4[] = "0000:3b:00.0";  // vgpu-mdev-t4-a10's T4: the mdev parent, NUMA 0

TEST(DraVgpuNamesTest, NamedFromTheMdevUuidOrTheVfAddressAndBack) {
  const std::string uuid = "4b3e2c1a-0000-4000-8000-00000000000a";
  EXPECT_EQ(MdevDeviceName(uuid), "mdev-" + uuid);
  EXPECT_EQ(VfDeviceName("0000:86:00.4"), "vgpu-0000-86-00-4");
  absl::StatusOr<VgpuId> mdev = VgpuOfDevice(MdevDeviceName(uuid));
  ASSERT_TRUE(mdev.ok()) << mdev.status();
  EXPECT_TRUE(mdev->mdev);
  EXPECT_EQ(mdev->id, uuid);
  absl::StatusOr<VgpuId> vf = VgpuOfDevice("vgpu-0000-86-00-4");
  ASSERT_TRUE(vf.ok()) << vf.status();
  EXPECT_FALSE(vf->mdev);
  EXPECT_EQ(vf->id, "0000:86:00.4");
  for (const char* other : {"gpu-0000-86-00-4", "mdev-4B3E2C1A-0000-4000-8000-00000000000A", "mdev-1234",
                            "vgpu-0000-86-00", "vgpu-0000:86:00.4"}) {
    EXPECT_FALSE(VgpuOfDevice(other).ok()) << other;
  }
}

class DraVgpuTest : public kube::testing::KubeApiSimTest {
 protected:
  void SetUp() override {
    KubeApiSimTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (!testing::FuseAvailable()) GTEST_SKIP() << testing::kNeedsFuse;
    auto kubeconfig = api_->WriteKubeconfig(dir_.path() / "kubeconfig");
    ASSERT_TRUE(kubeconfig.ok()) << kubeconfig.status();
    auto reader = kube::ConnectResourceClaimReader({.kubeconfig = *kubeconfig});
    ASSERT_TRUE(reader.ok()) << reader.status();
    reader_ = *std::move(reader);
    auto publisher = kube::ConnectResourceSlicePublisher(*kubeconfig, "", {.driver = kDriver, .node_name = kPool});
    ASSERT_TRUE(publisher.ok()) << publisher.status();
    publisher_ = *std::move(publisher);
    std::filesystem::create_directories(dir_.path() / "proc/sys/kernel/random");
    std::ofstream(dir_.path() / "proc/sys/kernel/random/boot_id") << "boot-1\n";
    std::ofstream(dir_.path() / "pci.ids") << "10de  NVIDIA Corporation\n\t1eb8  TU104GL [Tesla T4]\n"
                                           << "\t2335  GH100 [H200 SXM 141GB]\n";
    auto db = names::LoadPciIds(dir_.path() / "pci.ids");
    ASSERT_TRUE(db.ok()) << db.status();
    db_ = *std::move(db);
  }

  // The driver publishes through publisher_ and reads through reader_: it goes first.
  void TearDown() override { driver_.reset(); }

  // The node with the vGPUs of `config` (tests/vgpu/profile_configs.h) made by the profile applier.
  // `iommufd`: the node file's host with /dev/iommu (platform.iommufd).
  void StartSim(const char* node_file, const std::string& config, bool iommufd = false) {
    std::filesystem::path node_path = sim::NodeFile(node_file);
    if (iommufd) {
      Json node = Json::parse(ReadFile(node_path));
      node["platform"]["iommufd"] = true;
      node_path = dir_.path() / node_file;
      std::ofstream(node_path) << node.dump();
    }
    auto sim = sim::SimProcess::Start(node_path, dir_.path() / "root");
    ASSERT_TRUE(sim.ok()) << sim.status();
    sim_ = *std::move(sim);
    auto file = vgpu::ParseVgpuConfig(testing::kSimNodeProfileConfigs);
    ASSERT_TRUE(file.ok()) << file.status();
    vgpu::CatalogStore catalog(CatalogFile());
    absl::StatusOr<vgpu::ApplyReport> report =
        vgpu::ApplyVgpuConfig({.paths = Paths(), .catalog = &catalog, .new_uuid = {}}, *file, config);
    ASSERT_TRUE(report.ok()) << report.status();
    ASSERT_EQ(report->State(), "success");
    writes_after_apply_ = sim_->Log().size();
  }

  std::filesystem::path CatalogFile() const { return dir_.path() / "state/vgpu-catalog.txt"; }

  HostPaths Paths() const {
    HostPaths paths;
    paths.sysfs_root = sim_->sysfs_root();
    paths.dev_root = sim_->dev_root();
    paths.proc_root = dir_.path() / "proc";
    return paths;
  }

  vgpu::Discovery Discovered() const {
    absl::StatusOr<pci::Inventory> inventory = pci::Scan(Paths().sysfs_root, {.detail_vendor = 0x10de});
    EXPECT_TRUE(inventory.ok()) << inventory.status();
    vgpu::CatalogStore catalog(CatalogFile());
    absl::StatusOr<vgpu::Discovery> found = vgpu::Discover(Paths().sysfs_root, *inventory, catalog);
    EXPECT_TRUE(found.ok()) << found.status();
    return *std::move(found);
  }

  DriverOptions Options() const {
    DriverOptions options;
    options.registry_dir = dir_.path() / "plugins_registry";
    options.plugins_dir = dir_.path() / "plugins";
    options.cdi_dir = dir_.path() / "cdi";
    options.paths = Paths();
    options.node_name = kPool;
    options.pci_ids = db_.get();
    options.workload = Workload::kVmVgpu;
    options.vgpu_catalog_file = CatalogFile();
    options.get_claim = [this](const std::string& ns, const std::string& name) { return reader_->Get(ns, name, 20s); };
    options.publish_slices = [this](std::vector<kube::SliceDevice> devices) {
      return publisher_->Publish(std::move(devices));
    };
    return options;
  }

  void StartNode() { ASSERT_NO_FATAL_FAILURE(testing::StartRegistered(Options(), &driver_, &kubelet_)); }

  // The devices of the node's slices by name, once there are `count` of them.
  std::map<std::string, Json> SliceDevices(size_t count) const {
    std::map<std::string, Json> devices;
    EXPECT_TRUE(testing::WaitUntil([&] {
      devices.clear();
      auto slices = api_->Slices();
      if (!slices.ok() || !slices->is_array()) return false;
      for (const Json& slice : *slices) {
        for (const Json& device : slice["spec"].value("devices", Json::array())) devices[device["name"]] = device;
      }
      return devices.size() == count;
    })) << devices.size() << " devices";
    return devices;
  }

  // `device_class`: every request's spec.devices.requests[].exactly.deviceClassName ("" = none named).
  void AddClaim(const std::string& name, const std::string& uid, const std::vector<std::string>& device_names,
                Json annotations = Json::object(), const std::string& device_class = "") {
    Json results = Json::array();
    for (size_t i = 0; i < device_names.size(); ++i) {
      results.push_back(
          {{"request", absl::StrCat("vgpu", i)}, {"driver", kDriver}, {"pool", kPool}, {"device", device_names[i]}});
    }
    Json requests = Json::array();
    for (size_t i = 0; i < device_names.size() && !device_class.empty(); ++i) {
      requests.push_back({{"name", absl::StrCat("vgpu", i)}, {"exactly", {{"deviceClassName", device_class}}}});
    }
    Json claim = {{"metadata", {{"namespace", "vms"}, {"name", name}, {"uid", uid}, {"annotations", annotations}}},
                  {"spec", {{"devices", {{"requests", requests}}}}},
                  {"status", {{"allocation", {{"devices", {{"results", results}}}}}}}};
    ASSERT_TRUE(api_->Control("claim " + claim.dump()).ok());
  }

  drav1::NodePrepareResourceResponse Prepare(const std::string& name, const std::string& uid) {
    auto response = kubelet_->Prepare(kDriver, {MakeClaim("vms", name, uid)});
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? response->claims().at(uid) : drav1::NodePrepareResourceResponse{};
  }

  Json CdiSpec(const std::string& uid) const {
    return Json::parse(ReadFile(dir_.path() / "cdi" / absl::StrCat(kDriver, "_claim_", uid, ".json")));
  }
  // The one device of request `request` in the claim's KEP-5304 metadata, as KubeVirt takes it.
  Json MetadataDevice(const std::string& claim, const std::string& request) const {
    const std::filesystem::path file =
        dir_.path() / "plugins" / kDriver / "dra-device-metadata" / ("vms_" + claim) / request / "metadata.json";
    std::optional<Json> metadata = ReadDeviceMetadata(file);
    EXPECT_TRUE(metadata.has_value()) << file;
    if (!metadata || (*metadata)["requests"].size() != 1 || (*metadata)["requests"][0]["devices"].size() != 1) {
      ADD_FAILURE() << "not one request of one device: " << (metadata ? metadata->dump() : "none");
      return Json();
    }
    return (*metadata)["requests"][0]["devices"][0];
  }

  // Every write to a kernel attribute since the vGPUs were made: none binds, unbinds or retypes anything.
  std::vector<std::string> WritesSinceApply() const {
    const std::vector<std::string> log = sim_->Log();
    return std::vector<std::string>(log.begin() + static_cast<std::ptrdiff_t>(writes_after_apply_), log.end());
  }

  std::unique_ptr<sim::SimProcess> sim_;
  size_t writes_after_apply_ = 0;
  std::unique_ptr<names::PciIdsDatabase> db_;
  std::unique_ptr<kube::ResourceClaimReader> reader_;
  std::unique_ptr<kube::ResourceSlicePublisher> publisher_;
  std::unique_ptr<Driver> driver_;
  std::unique_ptr<KubeletDraSim> kubelet_;
};

std::string Group(const vgpu::Mdev& mdev) { return std::to_string(mdev.iommu_group.value_or(-1)); }

TEST_F(DraVgpuTest, MdevSliceDevicesCarryTheBareMdevUuidTheProfileAndTheParent) {
  StartSim("vgpu-mdev-t4-a10.json", "t4-2q-2");
  const vgpu::Discovery found = Discovered();
  ASSERT_EQ(found.mdevs.size(), 2u);
  StartNode();
  const std::map<std::string, Json> devices = SliceDevices(2);
  for (const vgpu::Mdev& mdev : found.mdevs) {
    ASSERT_TRUE(devices.contains(MdevDeviceName(mdev.uuid))) << mdev.uuid;
    const Json& attributes = devices.at(MdevDeviceName(mdev.uuid))["attributes"];
    EXPECT_EQ(attributes["mdevUUID"], Json({{"string", mdev.uuid}}));  // bare: the key KubeVirt reads
    EXPECT_EQ(attributes[std::string(kDriver) + "/resourceName"]["string"], "GRID_T4-2Q");
    EXPECT_EQ(attributes[std::string(kDriver) + "/vgpuType"]["string"], "GRID T4-2Q");
    EXPECT_EQ(attributes[std::string(kDriver) + "/productName"]["string"], "TU104GL [Tesla T4]");
    EXPECT_EQ(attributes[std::string(kDriver) + "/parentPciBusID"]["string"], kT4);
    EXPECT_EQ(attributes[std::string(kDriver) + "/iommuGroup"]["int"], mdev.iommu_group.value_or(-1));
    EXPECT_EQ(attributes["resource.kubernetes.io/numaNode"]["int"], 0);
    EXPECT_TRUE(attributes.contains("resource.kubernetes.io/pcieRoot"));
    // An mdev is no PCI function: a pciBusID would make KubeVirt take it for one if mdevUUID were ever missed.
    EXPECT_FALSE(attributes.contains("resource.kubernetes.io/pciBusID"));
    EXPECT_FALSE(devices.at(MdevDeviceName(mdev.uuid)).contains("taints"));
  }
  EXPECT_EQ(driver_->Devices().size(), 2u);
}

TEST_F(DraVgpuTest, SriovSliceDevicesCarryTheVfAddressTheProfileAndThePfsNumaNode) {
  StartSim("vgpu-sriov-l40s-h200.json", "h200-small-3");
  const vgpu::Discovery found = Discovered();
  ASSERT_EQ(found.vgpus.size(), 6u);  // three on each H200
  StartNode();
  const std::map<std::string, Json> devices = SliceDevices(6);
  absl::StatusOr<pci::Inventory> inventory = pci::Scan(Paths().sysfs_root, {.detail_vendor = 0x10de});
  ASSERT_TRUE(inventory.ok());
  for (const vgpu::SriovVgpu& vgpu : found.vgpus) {
    ASSERT_TRUE(devices.contains(VfDeviceName(vgpu.bdf))) << vgpu.bdf;
    const Json& attributes = devices.at(VfDeviceName(vgpu.bdf))["attributes"];
    EXPECT_EQ(attributes["resource.kubernetes.io/pciBusID"]["string"], vgpu.bdf);
    EXPECT_EQ(attributes[std::string(kDriver) + "/resourceName"]["string"], "NVIDIA_H200X-1-18C");
    EXPECT_EQ(attributes[std::string(kDriver) + "/vgpuType"]["string"], "NVIDIA H200X-1-18C");
    EXPECT_EQ(attributes[std::string(kDriver) + "/productName"]["string"], "GH100 [H200 SXM 141GB]");
    const pci::Function* pf = inventory->Find(vgpu.pf_bdf);
    ASSERT_NE(pf, nullptr);
    ASSERT_TRUE(pf->numa_node.has_value());
    EXPECT_EQ(attributes["resource.kubernetes.io/numaNode"]["int"], *pf->numa_node);
    EXPECT_TRUE(attributes.contains("resource.kubernetes.io/pcieRoot"));
    EXPECT_FALSE(attributes.contains("mdevUUID"));
  }
}

// --bind-on-prepare on a vm-vgpu node once bound every GPU of the node on each vGPU claim (its vGPUs gone with
// them): the driver now refuses to start that way, naming both, and writes nothing (issue 31, defect 1).
TEST_F(DraVgpuTest, RefusesBindOnPrepareOnAVgpuNode) {
  StartSim("vgpu-mdev-t4-a10.json", "t4-2q-2");
  DriverOptions options = Options();
  options.bind_on_prepare = true;
  Driver driver(options);
  const absl::Status started = driver.Start();
  EXPECT_EQ(started.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(started.message()), ::testing::HasSubstr("--bind-on-prepare"));
  EXPECT_THAT(std::string(started.message()), ::testing::HasSubstr("vm-vgpu"));
  EXPECT_THAT(WritesSinceApply(), ::testing::IsEmpty());
  EXPECT_EQ(Discovered().mdevs.size(), 2u);
}

TEST_F(DraVgpuTest, PreparesAnMdevClaimWithItsOwnGroupNodeAndTheMdevUuidInTheMetadata) {
  StartSim("vgpu-mdev-t4-a10.json", "t4-2q-2");
  const vgpu::Discovery found = Discovered();
  ASSERT_EQ(found.mdevs.size(), 2u);
  const vgpu::Mdev& first = found.mdevs[0];
  const vgpu::Mdev& second = found.mdevs[1];
  StartNode();
  AddClaim("vm", "uid-vm", {MdevDeviceName(first.uuid)});
  const drav1::NodePrepareResourceResponse vm = Prepare("vm", "uid-vm");
  ASSERT_EQ(vm.error(), "");
  ASSERT_EQ(vm.devices_size(), 1);
  EXPECT_EQ(vm.devices(0).device_name(), MdevDeviceName(first.uuid));
  const Json spec = CdiSpec("uid-vm");
  const std::string cdi_name = "uid-vm-" + MdevDeviceName(first.uuid);
  EXPECT_EQ(spec["devices"][0]["name"], cdi_name);
  EXPECT_EQ(spec["devices"][0]["containerEdits"]["deviceNodes"],
            Json::parse(absl::StrCat(R"([{"path":"/dev/vfio/vfio","permissions":"rw"},{"path":"/dev/vfio/)",
                                     Group(first), R"(","permissions":"rw"}])")));
  const Json device = MetadataDevice("vm", "vgpu0");
  EXPECT_EQ(device["name"], MdevDeviceName(first.uuid));
  EXPECT_EQ(device["attributes"], Json({{"mdevUUID", {{"string", first.uuid}}}}));
  EXPECT_FALSE(spec.contains("containerEdits"));  // no extended-resource env for a VM's own claim

  // A device another prepared claim holds is refused.
  AddClaim("thief", "uid-thief", {MdevDeviceName(first.uuid)});
  EXPECT_NE(Prepare("thief", "uid-thief").error().find("held by prepared claim vms/vm (uid-vm)"), std::string::npos);

  // The scheduler's claim for `nvidia.com/GRID_T4-2Q: 2`: the device plugin's variable, mdev UUIDs sorted.
  ASSERT_TRUE(kubelet_->Unprepare(kDriver, {MakeClaim("vms", "vm", "uid-vm")}).ok());
  AddClaim("pod", "uid-pod", {MdevDeviceName(second.uuid), MdevDeviceName(first.uuid)},
           {{"resource.kubernetes.io/extended-resource-claim", "true"}});
  ASSERT_EQ(Prepare("pod", "uid-pod").error(), "");
  EXPECT_EQ(CdiSpec("uid-pod")["containerEdits"]["env"],
            Json::array({absl::StrCat("MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-2Q=", first.uuid, ",", second.uuid)}));
  EXPECT_EQ(WritesSinceApply(), std::vector<std::string>{});
}

TEST_F(DraVgpuTest, PreparesAnSriovClaimWithTheVfsGroupNodeAndItsAddressInTheMetadata) {
  StartSim("vgpu-sriov-l40s-h200.json", "h200-small-3");
  const vgpu::Discovery found = Discovered();
  ASSERT_EQ(found.vgpus.size(), 6u);
  absl::StatusOr<pci::Inventory> inventory = pci::Scan(Paths().sysfs_root, {.detail_vendor = 0x10de});
  ASSERT_TRUE(inventory.ok());
  const vgpu::SriovVgpu& vf = found.vgpus[4];
  const pci::Function* fn = inventory->Find(vf.bdf);
  ASSERT_TRUE(fn != nullptr && fn->iommu_group.has_value());
  StartNode();
  AddClaim("vm", "uid-vm", {VfDeviceName(vf.bdf)});
  ASSERT_EQ(Prepare("vm", "uid-vm").error(), "");
  EXPECT_EQ(CdiSpec("uid-vm")["devices"][0]["containerEdits"]["deviceNodes"],
            Json::parse(absl::StrCat(R"([{"path":"/dev/vfio/vfio","permissions":"rw"},{"path":"/dev/vfio/)",
                                     *fn->iommu_group, R"(","permissions":"rw"}])")));
  const Json device = MetadataDevice("vm", "vgpu0");
  EXPECT_EQ(device["name"], VfDeviceName(vf.bdf));
  EXPECT_EQ(device["attributes"], Json({{"resource.kubernetes.io/pciBusID", {{"string", vf.bdf}}}}));

  AddClaim("pod", "uid-pod", {VfDeviceName(found.vgpus[1].bdf), VfDeviceName(found.vgpus[0].bdf)},
           {{"resource.kubernetes.io/extended-resource-claim", "true"}});
  ASSERT_EQ(Prepare("pod", "uid-pod").error(), "");
  EXPECT_EQ(CdiSpec("uid-pod")["containerEdits"]["env"],
            Json::array({absl::StrCat("PCI_RESOURCE_NVIDIA_COM_NVIDIA_H200X-1-18C=", found.vgpus[0].bdf, ",",
                                      found.vgpus[1].bdf)}));
  EXPECT_EQ(WritesSinceApply(), std::vector<std::string>{});
}

// A VF vGPU claim gets the nodes of its DeviceClass's backend only, as a whole GPU's (issue 32: on an iommufd host it
// used to get the group node, its cdev and /dev/iommu in one CDI spec, which Kata refuses); an mdev keeps its group.
TEST_F(DraVgpuTest, AnSriovClaimGetsItsDeviceClassesBackendOnly) {
  StartSim("vgpu-sriov-l40s-h200.json", "h200-small-3", /*iommufd=*/true);
  ASSERT_TRUE(std::filesystem::exists(Paths().dev_root / "iommu"));
  const vgpu::Discovery found = Discovered();
  ASSERT_EQ(found.vgpus.size(), 6u);
  absl::StatusOr<pci::Inventory> inventory = pci::Scan(Paths().sysfs_root, {.detail_vendor = 0x10de});
  ASSERT_TRUE(inventory.ok());
  const vgpu::SriovVgpu& vf = found.vgpus[4];
  const pci::Function* fn = inventory->Find(vf.bdf);
  ASSERT_TRUE(fn != nullptr && fn->iommu_group.has_value() && fn->vfio_cdevs.size() == 1u);
  StartNode();
  const auto paths = [&](const std::string& uid) {
    std::vector<std::string> out;
    const Json spec = CdiSpec(uid);
    for (const Json& node : spec["devices"][0]["containerEdits"]["deviceNodes"]) out.push_back(node["path"]);
    return out;
  };
  AddClaim("legacy", "uid-legacy", {VfDeviceName(vf.bdf)}, Json::object(), absl::StrCat("h200x-1-18c.", kDriver));
  ASSERT_EQ(Prepare("legacy", "uid-legacy").error(), "");
  EXPECT_EQ(paths("uid-legacy"),
            (std::vector<std::string>{"/dev/vfio/vfio", absl::StrCat("/dev/vfio/", *fn->iommu_group)}));
  ASSERT_TRUE(kubelet_->Unprepare(kDriver, {MakeClaim("vms", "legacy", "uid-legacy")}).ok());

  AddClaim("iommufd", "uid-iommufd", {VfDeviceName(vf.bdf)}, Json::object(),
           absl::StrCat("h200x-1-18c-iommufd.", kDriver));
  ASSERT_EQ(Prepare("iommufd", "uid-iommufd").error(), "");
  EXPECT_EQ(paths("uid-iommufd"),
            (std::vector<std::string>{absl::StrCat("/dev/vfio/devices/", fn->vfio_cdevs[0]), "/dev/iommu"}));
}

TEST_F(DraVgpuTest, AnMdevClaimGetsItsGroupNodeWhateverTheClass) {
  StartSim("vgpu-mdev-t4-a10.json", "t4-2q-2", /*iommufd=*/true);
  const vgpu::Discovery found = Discovered();
  ASSERT_EQ(found.mdevs.size(), 2u);
  StartNode();
  const vgpu::Mdev& mdev = found.mdevs[0];
  AddClaim("vm", "uid-vm", {MdevDeviceName(mdev.uuid)}, Json::object(), absl::StrCat("grid_t4-2q-iommufd.", kDriver));
  ASSERT_EQ(Prepare("vm", "uid-vm").error(), "");
  EXPECT_EQ(CdiSpec("uid-vm")["devices"][0]["containerEdits"]["deviceNodes"],
            Json::parse(absl::StrCat(R"([{"path":"/dev/vfio/vfio","permissions":"rw"},{"path":"/dev/vfio/)", Group(mdev),
                                     R"(","permissions":"rw"}])")));
}

TEST_F(DraVgpuTest, ARemovedMdevTurnsUnhealthyAndTaintedAndCannotBePrepared) {
  StartSim("vgpu-mdev-t4-a10.json", "t4-2q-2");
  const vgpu::Discovery found = Discovered();
  ASSERT_EQ(found.mdevs.size(), 2u);
  const vgpu::Mdev& removed = found.mdevs[1];
  StartNode();
  SliceDevices(2);
  ASSERT_TRUE(fs::WriteAttribute(Paths().sysfs_root / "bus/mdev/devices" / removed.uuid / "remove", "1").ok());

  const std::string name = MdevDeviceName(removed.uuid);
  EXPECT_TRUE(testing::WaitUntil([&] {
    const std::map<std::string, Json> devices = SliceDevices(2);
    if (!devices.contains(name)) return false;
    const Json taints = devices.at(name).value("taints", Json::array());
    return taints.size() == 1 && taints[0]["key"] == "gpu.vfio-agent.cozystack.io/unhealthy" &&
           taints[0]["effect"] == "NoSchedule" && !devices.at(MdevDeviceName(found.mdevs[0].uuid)).contains("taints");
  }));
  std::string reason;
  for (const GpuDevice& device : driver_->Devices()) {
    if (device.slice.name == name) reason = device.unhealthy_reason;
  }
  EXPECT_EQ(reason, absl::StrCat("mdev removed (no ", (Paths().sysfs_root / "bus/mdev/devices" / removed.uuid).string(), ")"));
  // The kubelet's health stream says so too.
  EXPECT_TRUE(testing::WaitUntil([&] {
    auto health = kubelet_->LatestHealth(kDriver);
    if (!health) return false;
    for (const auto& device : health->devices()) {
      if (device.device().device_name() == name) return device.health() == ::v1alpha1::UNHEALTHY;
    }
    return false;
  }));
  AddClaim("vm", "uid-vm", {name});
  EXPECT_NE(Prepare("vm", "uid-vm").error().find("not on this node now"), std::string::npos);
}

}  // namespace
}  // namespace vfio_agent::dra
