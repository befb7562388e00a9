// The DRA driver's device model and its health stream: attributes from sysfs and pci.ids, the health rule shared
// with the device plugin, and DRAResourceHealth.NodeWatchResources through kubelet-dra-sim (the kubelet opens it
// after registering the driver) while a GPU is unbound, hot-unplugged and back.
#include "vfio_gpu_agent/dra/devices.h"

#include <fstream>

#include <gtest/gtest.h>

#include "kube_api_sim.h"
#include "kubelet_dra_sim.h"
#include "support/sysfs_tree.h"
#include "support/wait.h"
#include "vfio_gpu_agent/dra/device_names.h"
#include "vfio_gpu_agent/dra/driver.h"
#include "vfio_gpu_agent/pci/inventory.h"

namespace vfio_agent::dra {
namespace {

using kubeletsim::dra::KubeletDraSim;
using namespace std::chrono_literals;

const std::string kHealthDriver(kDefaultDriverName);
constexpr char kNodeName[] = "node-a";
constexpr char kGpuA[] = "0000:18:00.0";  // group 10, NUMA 0
constexpr char kGpuB[] = "0000:9a:00.0";  // group 11, NUMA 1

class DraDevicesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(dir_.path() / "dev/vfio");
    std::filesystem::create_directories(dir_.path() / "proc/sys/kernel/random");
    std::ofstream(dir_.path() / "proc/sys/kernel/random/boot_id") << "boot-1\n";
    std::ofstream(dir_.path() / "pci.ids") << "10de  NVIDIA Corporation\n\t2335  GH100 [H200 SXM 141GB]\n";
    auto db = names::LoadPciIds(dir_.path() / "pci.ids");
    ASSERT_TRUE(db.ok()) << db.status();
    db_ = *std::move(db);
    AddGpu(kGpuA, 10, 0);
    AddGpu(kGpuB, 11, 1);
  }

  void AddGpu(const std::string& bdf, int group, int numa) {
    tree_.AddDevice({.bdf = bdf, .numa_node = numa, .driver = "vfio-pci", .iommu_group = group});
    std::ofstream(dir_.path() / "dev/vfio" / std::to_string(group));
  }

  HostPaths Paths() const {
    return {.sysfs_root = dir_.path() / "sys", .dev_root = dir_.path() / "dev", .proc_root = dir_.path() / "proc"};
  }

  DriverOptions Options() const {
    DriverOptions options;
    options.registry_dir = dir_.path() / "plugins_registry";
    options.plugins_dir = dir_.path() / "plugins";
    options.cdi_dir = dir_.path() / "cdi";
    options.paths = Paths();
    options.node_name = kNodeName;
    options.pci_ids = db_.get();
    return options;
  }

  std::vector<GpuDevice> Build(const std::vector<GpuDevice>& previous = {}) const {
    auto inventory = pci::Scan(Paths().sysfs_root, {});
    EXPECT_TRUE(inventory.ok()) << inventory.status();
    const names::NameResolver names(db_.get(), "nvidia.com", {});
    return BuildDevices(Paths(), *inventory, pci::Select(*inventory, {}), names, db_.get(), kHealthDriver, previous);
  }

  // Hot unplug as sysfs shows it: the device leaves bus/pci/devices and its group node goes.
  void Unplug(const std::string& bdf, int group) {
    std::filesystem::rename(dir_.path() / "sys/bus/pci/devices" / bdf, dir_.path() / "sys/bus/pci" / bdf);
    std::filesystem::remove(dir_.path() / "dev/vfio" / std::to_string(group));
  }
  void Replug(const std::string& bdf, int group) {
    std::filesystem::rename(dir_.path() / "sys/bus/pci" / bdf, dir_.path() / "sys/bus/pci/devices" / bdf);
    std::ofstream(dir_.path() / "dev/vfio" / std::to_string(group));
  }

  testing::TempDir dir_{"va-dra-devices"};
  testing::SysfsTree tree_{dir_.path() / "sys"};
  std::unique_ptr<names::PciIdsDatabase> db_;
};

std::string Attr(const GpuDevice& device, const std::string& key) {
  auto it = device.slice.attributes.find(key);
  if (it == device.slice.attributes.end()) return "<absent>";
  const kube::DeviceAttribute& value = it->second;
  return value.kind == kube::DeviceAttribute::Kind::kInt ? std::to_string(value.number) : value.text;
}

TEST_F(DraDevicesTest, OneDevicePerGpuNamedFromItsAddressWithTheAttributesADeviceClassSelects) {
  const std::vector<GpuDevice> devices = Build();
  ASSERT_EQ(devices.size(), 2u);
  const GpuDevice& a = devices[0];
  EXPECT_EQ(a.bdf, kGpuA);
  EXPECT_EQ(a.slice.name, "gpu-0000-18-00-0");
  EXPECT_TRUE(a.healthy()) << a.unhealthy_reason;
  EXPECT_TRUE(a.slice.taints.empty());
  EXPECT_EQ(Attr(a, "resource.kubernetes.io/pciBusID"), kGpuA);
  EXPECT_EQ(Attr(a, "resource.kubernetes.io/pcieRoot"), "pci0000:18");
  EXPECT_EQ(Attr(a, "resource.kubernetes.io/numaNode"), "0");
  EXPECT_EQ(Attr(a, "gpu.vfio-agent.cozystack.io/resourceName"), "GH100_H200_SXM_141GB");
  EXPECT_EQ(Attr(a, "gpu.vfio-agent.cozystack.io/productName"), "GH100 [H200 SXM 141GB]");
  EXPECT_EQ(Attr(a, "gpu.vfio-agent.cozystack.io/vendorID"), "0x10de");
  EXPECT_EQ(Attr(a, "gpu.vfio-agent.cozystack.io/deviceID"), "0x2335");
  EXPECT_EQ(Attr(a, "gpu.vfio-agent.cozystack.io/iommuGroup"), "10");
  EXPECT_EQ(a.slice.attributes.size(), 8u);
  EXPECT_EQ(devices[1].slice.name, "gpu-0000-9a-00-0");
  EXPECT_EQ(Attr(devices[1], "resource.kubernetes.io/numaNode"), "1");
  EXPECT_EQ(Attr(devices[1], "resource.kubernetes.io/pcieRoot"), "pci0000:9a");
}

TEST_F(DraDevicesTest, AnUnhealthyGpuCarriesANoScheduleTaintAndAGoneOneStaysUntilBack) {
  tree_.BindDriver(kGpuB, "nvidia");
  std::filesystem::remove(dir_.path() / "dev/vfio/11");
  std::vector<GpuDevice> devices = Build();
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[1].unhealthy_reason, "driver nvidia");
  ASSERT_EQ(devices[1].slice.taints.size(), 1u);
  EXPECT_EQ(devices[1].slice.taints[0].key, "gpu.vfio-agent.cozystack.io/unhealthy");
  EXPECT_EQ(devices[1].slice.taints[0].effect, "NoSchedule");  // never NoExecute: a running VM stays

  std::filesystem::remove(dir_.path() / "dev/vfio/10");
  EXPECT_EQ(Build()[0].unhealthy_reason, "no " + (dir_.path() / "dev/vfio/10").string());

  const std::vector<GpuDevice> before = Build();
  Unplug(kGpuA, 10);
  devices = Build(before);
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[0].slice.name, "gpu-0000-18-00-0");
  EXPECT_EQ(devices[0].unhealthy_reason, "gone from sysfs");
  EXPECT_EQ(Attr(devices[0], "resource.kubernetes.io/pciBusID"), kGpuA);  // its last attributes
  ASSERT_EQ(devices[0].slice.taints.size(), 1u);
  // Without a previous list (an agent started after the GPU left) there is nothing to keep.
  EXPECT_EQ(Build().size(), 1u);
}

// The first message a health stream carries, and every change after it, through the kubelet's side.
class DraHealthStreamTest : public DraDevicesTest {
 protected:
  void StartNode(kubeletsim::dra::Options::HealthApi release = kubeletsim::dra::Options::HealthApi::k136) {
    driver_ = std::make_unique<Driver>(Options());
    ASSERT_TRUE(driver_->Start().ok());
    kubelet_ = std::make_unique<KubeletDraSim>(
        kubeletsim::dra::Options{.registry_dir = Options().registry_dir, .health_api = release});
    ASSERT_TRUE(kubelet_->Start().ok());
    ASSERT_TRUE(kubelet_->WaitFor([](const KubeletDraSim& k) { return k.Count("health-message") > 0; }, 30s));
  }

  // device name -> health, as the kubelet last heard it ("" before any message).
  std::map<std::string, std::string> Health() const {
    std::map<std::string, std::string> health;
    const auto latest = kubelet_->LatestHealth(kHealthDriver);
    if (!latest) return health;
    for (const auto& device : latest->devices()) {
      EXPECT_EQ(device.device().pool_name(), kNodeName);
      // Resent once a minute: the kubelet's default of 30 s would turn the devices Unknown in between.
      EXPECT_GE(device.health_check_timeout_seconds(), 120);
      health[device.device().device_name()] =
          ::v1alpha1::HealthStatus_Name(device.health()) + (device.message().empty() ? "" : ": " + device.message());
    }
    return health;
  }

  bool HealthIs(const std::map<std::string, std::string>& expected) const {
    return testing::WaitUntil([&] { return Health() == expected; });
  }

  std::unique_ptr<Driver> driver_;
  std::unique_ptr<KubeletDraSim> kubelet_;
};

TEST_F(DraHealthStreamTest, TheKubeletGetsEveryDeviceAndEveryChangeOnOneOpenStream) {
  StartNode();
  EXPECT_TRUE(HealthIs({{"gpu-0000-18-00-0", "HEALTHY"}, {"gpu-0000-9a-00-0", "HEALTHY"}}));
  EXPECT_EQ(driver_->HealthStreams(), 1);

  // Knocked off vfio-pci: its group node goes, which wakes the driver.
  tree_.BindDriver(kGpuB, "nvidia");
  std::filesystem::remove(dir_.path() / "dev/vfio/11");
  EXPECT_TRUE(HealthIs({{"gpu-0000-18-00-0", "HEALTHY"}, {"gpu-0000-9a-00-0", "UNHEALTHY: driver nvidia"}}));

  Unplug(kGpuA, 10);
  EXPECT_TRUE(HealthIs({{"gpu-0000-18-00-0", "UNHEALTHY: gone from sysfs"},
                        {"gpu-0000-9a-00-0", "UNHEALTHY: driver nvidia"}}));
  Replug(kGpuA, 10);
  tree_.BindDriver(kGpuB, "vfio-pci");
  std::ofstream(dir_.path() / "dev/vfio/11");
  EXPECT_TRUE(HealthIs({{"gpu-0000-18-00-0", "HEALTHY"}, {"gpu-0000-9a-00-0", "HEALTHY"}}));

  // The stream the kubelet opened is the one that carried all of it.
  EXPECT_EQ(kubelet_->Count("health-stream"), 1);
  EXPECT_EQ(kubelet_->Count("health-end"), 0);
  EXPECT_EQ(driver_->Devices().size(), 2u);
}

// Kubernetes 1.37 prefers dra-health v1 when the driver lists it; 1.36 knows v1alpha1 only. One list feeds both.
TEST_F(DraHealthStreamTest, A137KubeletGetsItsStreamOnV1AndA136KubeletOnV1alpha1) {
  using Release = kubeletsim::dra::Options::HealthApi;
  for (Release release : {Release::k137, Release::k136}) {
    const std::string service = release == Release::k137 ? "v1.DRAResourceHealth" : "v1alpha1.DRAResourceHealth";
    SCOPED_TRACE(service);
    tree_.BindDriver(kGpuB, "vfio-pci");
    std::ofstream(dir_.path() / "dev/vfio/11");
    StartNode(release);
    EXPECT_EQ(kubelet_->Plugins().at(kHealthDriver).health_service, service);
    EXPECT_TRUE(HealthIs({{"gpu-0000-18-00-0", "HEALTHY"}, {"gpu-0000-9a-00-0", "HEALTHY"}}));
    tree_.BindDriver(kGpuB, "nvidia");
    std::filesystem::remove(dir_.path() / "dev/vfio/11");
    EXPECT_TRUE(HealthIs({{"gpu-0000-18-00-0", "HEALTHY"}, {"gpu-0000-9a-00-0", "UNHEALTHY: driver nvidia"}}));
    EXPECT_EQ(kubelet_->Count("health-end"), 0);  // the driver serves the version this kubelet opened
    EXPECT_EQ(driver_->HealthStreams(), 1);
    kubelet_.reset();
    driver_.reset();
  }
}

TEST_F(DraHealthStreamTest, StopEndsTheStreamAndAKubeletRestartOpensANewOne) {
  StartNode();
  ASSERT_TRUE(kubelet_->Restart().ok());
  ASSERT_TRUE(kubelet_->WaitFor([](const KubeletDraSim& k) { return k.Count("health-stream") == 2; }, 30s));
  EXPECT_TRUE(HealthIs({{"gpu-0000-18-00-0", "HEALTHY"}, {"gpu-0000-9a-00-0", "HEALTHY"}}));
  ASSERT_TRUE(testing::WaitUntil([&] { return driver_->HealthStreams() == 1; }));
  // A driver that stops ends its stream (a server's Shutdown would otherwise wait for it forever).
  driver_->Stop();
  EXPECT_EQ(driver_->HealthStreams(), 0);
}

// The node's ResourceSlices, kept by the running driver on the fake API server.
class DraSlicesTest : public DraHealthStreamTest {
 protected:
  void SetUp() override {
    DraHealthStreamTest::SetUp();
    if (HasFatalFailure()) return;
    if (!sim::KubeApiSim::Available()) GTEST_SKIP() << "python3 not found";
    auto api = sim::KubeApiSim::Start(dir_.path());
    ASSERT_TRUE(api.ok()) << api.status();
    api_ = *std::move(api);
    auto kubeconfig = api_->WriteKubeconfig(dir_.path() / "kubeconfig");
    ASSERT_TRUE(kubeconfig.ok()) << kubeconfig.status();
    auto publisher = kube::ConnectResourceSlicePublisher(*kubeconfig, "", {.driver = kHealthDriver, .node_name = kNodeName});
    ASSERT_TRUE(publisher.ok()) << publisher.status();
    publisher_ = *std::move(publisher);
  }

  // The driver publishes through publisher_, which goes before the base class's members.
  void TearDown() override { driver_.reset(); }

  DriverOptions Options() const {
    DriverOptions options = DraHealthStreamTest::Options();
    options.publish_slices = [this](std::vector<kube::SliceDevice> devices) {
      return publisher_->Publish(std::move(devices));
    };
    options.watch_slices = [this](std::function<void()> changed) { return publisher_->Watch(std::move(changed)); };
    return options;
  }

  void StartNode() {
    driver_ = std::make_unique<Driver>(Options());
    ASSERT_TRUE(driver_->Start().ok());
    kubelet_ = std::make_unique<KubeletDraSim>(kubeletsim::dra::Options{.registry_dir = Options().registry_dir});
    ASSERT_TRUE(kubelet_->Start().ok());
  }

  // device name -> its taint effects ("" when untainted), over every slice of the node.
  std::map<std::string, std::string> SliceDevices() const {
    std::map<std::string, std::string> devices;
    auto slices = api_->Slices();
    if (!slices.ok() || !slices->is_array()) return devices;
    for (const nlohmann::json& slice : *slices) {
      for (const nlohmann::json& device : slice["spec"].value("devices", nlohmann::json::array())) {
        std::string taints;
        for (const nlohmann::json& taint : device.value("taints", nlohmann::json::array())) {
          if (!taints.empty()) taints += ",";
          taints += taint.value("key", "") + (taint.contains("value") ? "=" + taint.value("value", "") : "") + ":" +
                    taint.value("effect", "");
        }
        devices[device.value("name", "")] = taints;
      }
    }
    return devices;
  }

  size_t Writes() const {
    return api_->Count("POST", "/apis/resource.k8s.io/v1/resourceslices", "201") +
           api_->Count("PUT", "/apis/resource.k8s.io/v1/resourceslices", "200");
  }
  size_t Lists() const { return api_->Count("GET", "/apis/resource.k8s.io/v1/resourceslices", "200"); }
  size_t Watches() const {
    size_t count = 0;
    for (const sim::KubeApiRequest& request : api_->Log()) count += request.watch ? 1 : 0;
    return count;
  }

  std::unique_ptr<sim::KubeApiSim> api_;
  std::unique_ptr<kube::ResourceSlicePublisher> publisher_;
};

TEST_F(DraSlicesTest, OneDevicePerGpuInTheNodesPoolTaintedWhileUnhealthyAndNoWriteWhenNothingChanged) {
  StartNode();
  const std::map<std::string, std::string> healthy = {{"gpu-0000-18-00-0", ""}, {"gpu-0000-9a-00-0", ""}};
  ASSERT_TRUE(testing::WaitUntil([&] { return SliceDevices() == healthy; }));
  auto slices = api_->Slices();
  ASSERT_TRUE(slices.ok());
  ASSERT_EQ(slices->size(), 1u);
  const nlohmann::json& slice = (*slices)[0];
  EXPECT_EQ(slice["spec"]["nodeName"], kNodeName);
  EXPECT_EQ(slice["spec"]["driver"], kHealthDriver);
  EXPECT_EQ(slice["spec"]["pool"]["name"], kNodeName);
  EXPECT_EQ(slice["metadata"]["ownerReferences"][0]["kind"], "Node");
  const nlohmann::json& device = slice["spec"]["devices"][0];
  EXPECT_EQ(device["attributes"]["resource.kubernetes.io/pciBusID"]["string"], kGpuA);
  EXPECT_EQ(device["attributes"]["gpu.vfio-agent.cozystack.io/resourceName"]["string"], "GH100_H200_SXM_141GB");
  EXPECT_EQ(device["attributes"]["gpu.vfio-agent.cozystack.io/iommuGroup"]["int"], 10);

  // Unbound: tainted NoSchedule (never NoExecute) under its kind's key, the driver it is on as the value; back on
  // vfio-pci: untainted.
  tree_.BindDriver(kGpuB, "nvidia");
  std::filesystem::remove(dir_.path() / "dev/vfio/11");
  EXPECT_TRUE(testing::WaitUntil([&] {
    return SliceDevices() == std::map<std::string, std::string>{
                                 {"gpu-0000-18-00-0", ""},
                                 {"gpu-0000-9a-00-0", "gpu.vfio-agent.cozystack.io/not-vfio=nvidia:NoSchedule"}};
  }));
  tree_.BindDriver(kGpuB, "vfio-pci");
  std::ofstream(dir_.path() / "dev/vfio/11");
  ASSERT_TRUE(testing::WaitUntil([&] { return SliceDevices() == healthy && driver_->SliceError().empty(); }));

  // A device event that changes nothing, and the driver's own re-lists: no write. The re-lists are the watch's
  // after a 410 Gone and the pass it asks for (the registration burst may be over by now, and the resync of a
  // driver that watches is 10 minutes away).
  ASSERT_TRUE(testing::WaitUntil([&] { return driver_->Devices().size() == 2 && driver_->Devices()[1].healthy(); }));
  const size_t writes = Writes();
  const size_t lists = Lists();
  std::ofstream(dir_.path() / "dev/vfio/unrelated");
  ASSERT_TRUE(api_->Control("compact").ok());
  ASSERT_TRUE(api_->Control("close-watches").ok());
  ASSERT_TRUE(testing::WaitUntil([&] { return Lists() >= lists + 2; }));
  EXPECT_EQ(Writes(), writes);
  EXPECT_EQ(SliceDevices(), healthy);
}

// One key per failure kind with a value that says which; a warning that does not stop a VM is a None taint (and
// the health stream's message); a gone GPU is NoSchedule unless the operator asked for NoExecute.
TEST_F(DraSlicesTest, EachFailureKindHasItsKeyWarningsAreNoneAndNoExecuteOnlyWhenAskedForAGoneGpu) {
  for (const bool no_execute : {false, true}) {
    SCOPED_TRACE(no_execute ? "--dra-taint-no-execute" : "default");
    DriverOptions options = Options();
    options.taints.no_execute_when_gone = no_execute;
    // GPU A has no reset method (the kernel then shows neither reset nor reset_method).
    const std::filesystem::path a = dir_.path() / "sys/bus/pci/devices" / kGpuA;
    std::filesystem::remove(a / "reset_method");
    std::filesystem::remove(a / "reset");
    driver_ = std::make_unique<Driver>(options);
    ASSERT_TRUE(driver_->Start().ok());
    kubelet_ = std::make_unique<KubeletDraSim>(kubeletsim::dra::Options{.registry_dir = options.registry_dir});
    ASSERT_TRUE(kubelet_->Start().ok());
    EXPECT_TRUE(testing::WaitUntil([&] {
      return SliceDevices() == std::map<std::string, std::string>{
                                   {"gpu-0000-18-00-0", "gpu.vfio-agent.cozystack.io/no-reset-method=none:None"},
                                   {"gpu-0000-9a-00-0", ""}};
    }));
    EXPECT_TRUE(HealthIs({{"gpu-0000-18-00-0", "HEALTHY: warning gpu.vfio-agent.cozystack.io/no-reset-method=none"},
                          {"gpu-0000-9a-00-0", "HEALTHY"}}));

    Unplug(kGpuB, 11);
    const std::string gone = no_execute ? "gpu.vfio-agent.cozystack.io/gone=sysfs:NoExecute"
                                        : "gpu.vfio-agent.cozystack.io/gone=sysfs:NoSchedule";
    EXPECT_TRUE(testing::WaitUntil([&] {
      return SliceDevices() == std::map<std::string, std::string>{
                                   {"gpu-0000-18-00-0", "gpu.vfio-agent.cozystack.io/no-reset-method=none:None"},
                                   {"gpu-0000-9a-00-0", gone}};
    }));
    // The health stream says the same reason the taint's key and value come from.
    EXPECT_TRUE(HealthIs({{"gpu-0000-18-00-0", "HEALTHY: warning gpu.vfio-agent.cozystack.io/no-reset-method=none"},
                          {"gpu-0000-9a-00-0", "UNHEALTHY: gone from sysfs"}}));
    kubelet_.reset();
    driver_.reset();
    Replug(kGpuB, 11);
    ASSERT_TRUE(api_->Control(std::string("delete-slices ") + kNodeName).ok());
  }
}

TEST_F(DraSlicesTest, AKubeletRestartThatDeletesTheSlicesHasThemBackWithinFiveSeconds) {
  StartNode();
  ASSERT_TRUE(testing::WaitUntil([&] { return SliceDevices().size() == 2; }));
  ASSERT_TRUE(testing::WaitUntil([&] { return driver_->Registration().notifications == 1; }));
  const size_t lists = Lists();
  ASSERT_TRUE(kubelet_->Restart().ok());
  ASSERT_TRUE(testing::WaitUntil([&] { return driver_->Registration().notifications == 2; }));
  // The kubelet deletes them after it registered us, once the driver's re-list on registration has passed: the
  // driver looks again in the seconds after a registration, not only then.
  ASSERT_TRUE(testing::WaitUntil([&] { return Lists() > lists; }));
  ASSERT_TRUE(api_->Control(std::string("delete-slices ") + kNodeName).ok());
  const auto deleted = std::chrono::steady_clock::now();
  ASSERT_TRUE(testing::WaitUntil([&] { return SliceDevices().size() == 2; }));
  EXPECT_LT(std::chrono::steady_clock::now() - deleted, 5s);
}

// Slices deleted (kubectl, a kubelet's start) or changed by anyone else come back through the driver's watch. The
// resync is an hour and no kubelet registers the driver (no re-list burst), so only the watch can bring them back
// within the wait's limit.
TEST_F(DraSlicesTest, SlicesDeletedOrChangedByOthersComeBackThroughTheWatchNotTheResync) {
  DriverOptions options = Options();
  options.slice_resync_interval = std::chrono::hours(1);
  driver_ = std::make_unique<Driver>(options);
  ASSERT_TRUE(driver_->Start().ok());
  const std::map<std::string, std::string> healthy = {{"gpu-0000-18-00-0", ""}, {"gpu-0000-9a-00-0", ""}};
  ASSERT_TRUE(testing::WaitUntil([&] { return SliceDevices() == healthy && Watches() == 1; }));

  ASSERT_TRUE(api_->Control(std::string("delete-slices ") + kNodeName).ok());
  ASSERT_TRUE(testing::WaitUntil([&] { return SliceDevices() == healthy; }));

  auto slices = api_->Slices();
  ASSERT_TRUE(slices.ok() && slices->size() == 1u);
  const std::string name = (*slices)[0]["metadata"]["name"];
  ASSERT_TRUE(api_->Control("patch-slice " + name + R"( {"spec":{"devices":[{"name":"gpu-0000-18-00-0"}]}})").ok());
  ASSERT_TRUE(testing::WaitUntil([&] { return SliceDevices() == healthy && driver_->SliceError().empty(); }));
  EXPECT_EQ(Watches(), 1u);  // one long request all along
}

// At rest a driver that watches its slices leaves them to the watch: it lists them every kWatchedSliceResync (10
// minutes) at the most, whatever shorter slice_resync_interval it has (30 s by default: 21 of the agent's 27
// requests in 10 minutes at rest on a real API server). The resync asked for here is 20 ms and the driver's own
// rescan, also every 20 ms, is the test's clock: 25 rescans span 25 resyncs, each a list when the resync ignored
// the watch. The watch still puts a deletion back.
TEST_F(DraSlicesTest, AtRestAWatchingDriverSendsNoSliceListWhereTheResyncWouldHaveListed) {
  DriverOptions options = Options();
  options.slice_resync_interval = 20ms;
  options.rescan_interval = 20ms;
  driver_ = std::make_unique<Driver>(options);
  ASSERT_TRUE(driver_->Start().ok());
  const std::map<std::string, std::string> healthy = {{"gpu-0000-18-00-0", ""}, {"gpu-0000-9a-00-0", ""}};
  ASSERT_TRUE(testing::WaitUntil([&] { return SliceDevices() == healthy && Watches() == 1; }));
  const size_t lists = Lists();
  const uint64_t scans = pci::ScansStarted();
  ASSERT_TRUE(testing::WaitUntil([&] { return pci::ScansStarted() >= scans + 25; }));
  EXPECT_EQ(Lists(), lists);

  ASSERT_TRUE(api_->Control(std::string("delete-slices ") + kNodeName).ok());
  ASSERT_TRUE(testing::WaitUntil([&] { return SliceDevices() == healthy; }));
  EXPECT_EQ(Watches(), 1u);
}

}  // namespace
}  // namespace vfio_agent::dra
