#include "vfio_gpu_agent/plugin/vgpu_devices.h"

#include <fstream>
#include <functional>
#include <mutex>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "support/sysfs_tree.h"
#include "support/wait.h"
#include "test_devices.h"
#include "vfio_gpu_agent/node/source.h"
#include "vfio_gpu_agent/plugin/agent.h"
#include "vfio_gpu_agent/plugin/allocate.h"
#include "vfio_gpu_agent/plugin/cdi.h"
#include "vgpu/vgpu_tree.h"

namespace vfio_agent::plugin {
namespace {

namespace vt = testing::vgpu_tree;

constexpr char kT4Parent[] = "0000:3b:00.0";
constexpr char kMdevA[] = "1b7e5c3a-0f4d-4a57-9b0e-3c8f1d2a6b01";
constexpr char kMdevB[] = "9a0c2e4f-6b8d-4f1a-8c3e-5d7f9b1a3c02";
constexpr char kMdevC[] = "c3d5e7f9-1a2b-4c3d-8e4f-5a6b7c8d9e03";
constexpr char kT4_1Q[] = "nvidia.com/GRID_T4-1Q";
constexpr char kL40sPf[] = "0000:5e:00.0";
constexpr char kVf1[] = "0000:5e:00.4";
constexpr char kVf2[] = "0000:5e:00.5";
constexpr char kL40s_1Q[] = "nvidia.com/NVIDIA_L40S-1Q";
constexpr char kL40s_4Q[] = "nvidia.com/NVIDIA_L40S-4Q";
constexpr char kL40sCatalog[] = "ID    : vGPU Name\n1155 : NVIDIA L40S-1Q\n1157 : NVIDIA L40S-4Q\n";

class VgpuSnapshotTest : public ::testing::Test {
 protected:
  VgpuSnapshotTest() : tree_(dir_.path() / "sys"), catalog_("") {
    paths_.sysfs_root = tree_.root();
    paths_.dev_root = dir_.path() / "dev";
    std::filesystem::create_directories(paths_.dev_root / "vfio/devices");
    std::ofstream(paths_.dev_root / "vfio/vfio") << "";
  }

  void Node(const std::string& relative) { std::ofstream(paths_.dev_root / relative) << ""; }
  void RemoveNode(const std::string& relative) { std::filesystem::remove(paths_.dev_root / relative); }

  // A T4 on nvidia (NUMA 1) with two GRID T4-1Q mdevs in groups 100 and 101, both nodes present.
  void AddT4WithMdevs() {
    tree_.AddDevice({.bdf = kT4Parent, .device = 0x1eb8, .numa_node = 1, .driver = "nvidia", .iommu_group = 12});
    vt::AddMdevParent(tree_, kT4Parent, {{"nvidia-222", "GRID T4-1Q", 14}, {"nvidia-223", "GRID T4-2Q", 8}});
    vt::AddMdev(tree_, kMdevB, kT4Parent, "nvidia-222", 101);
    vt::AddMdev(tree_, kMdevA, kT4Parent, "nvidia-222", 100);
    Node("vfio/100");
    Node("vfio/101");
  }

  // An L40S PF (NUMA 0) with two VFs typed NVIDIA L40S-1Q, groups 21 and 22, cdevs vfio3 and vfio4.
  void AddL40sWithVgpus() {
    tree_.AddDevice({.bdf = kL40sPf, .device = 0x26b9, .numa_node = 0, .driver = "nvidia", .iommu_group = 20});
    vt::SetCreatableTypes(tree_, kL40sPf, kL40sCatalog);
    int group = 21;
    for (const char* vf : {kVf1, kVf2}) {
      tree_.AddDevice({.bdf = vf, .device = 0x26b9, .numa_node = -1, .driver = "nvidia", .iommu_group = group,
                       .physfn = kL40sPf, .vfio_cdevs = {"vfio" + std::to_string(group - 18)}});
      vt::SetVgpuType(tree_, vf, "1155\n");
      Node("vfio/" + std::to_string(group));
      Node("vfio/devices/vfio" + std::to_string(group - 18));
      ++group;
    }
  }

  VgpuSnapshot Build() {
    absl::StatusOr<pci::Inventory> inventory = pci::Scan(paths_.sysfs_root, {.detail_vendor = 0x10de});
    EXPECT_TRUE(inventory.ok()) << inventory.status();
    absl::StatusOr<vgpu::Discovery> discovery = vgpu::Discover(paths_.sysfs_root, *inventory, catalog_);
    EXPECT_TRUE(discovery.ok()) << discovery.status();
    VgpuSnapshot built = BuildVgpuSnapshot(paths_, *inventory, *discovery, "nvidia.com", previous_);
    previous_ = built.snapshot;
    return built;
  }

  static PluginDevice Device(const VgpuSnapshot& s, const std::string& resource, const std::string& id) {
    return fixtures::DeviceIn(s.snapshot, resource, id);
  }

  // kHealthy, or why not.
  static std::string State(const VgpuSnapshot& s, const std::string& resource, const std::string& id) {
    const PluginDevice device = Device(s, resource, id);
    return device.healthy ? kHealthy : device.unhealthy_reason;
  }

  // Healthy; Unhealthy with `reason` after `fault`; healthy again after `repair`.
  void ExpectUnhealthyWhile(const std::string& resource, const std::string& id, const std::function<void()>& fault,
                            const std::string& reason, const std::function<void()>& repair) {
    EXPECT_EQ(State(Build(), resource, id), kHealthy);
    fault();
    EXPECT_EQ(State(Build(), resource, id), reason);
    repair();
    EXPECT_EQ(State(Build(), resource, id), kHealthy);
  }

  void ExpectGroupNodeRule(const std::string& resource, const std::string& id, int group) {
    const std::string node = "vfio/" + std::to_string(group);
    ExpectUnhealthyWhile(resource, id, [&] { RemoveNode(node); }, "no " + (paths_.dev_root / node).string(),
                         [&] { Node(node); });
  }

  static void ExpectHealthy(const PluginDevice& device, const std::string& id, int group, std::optional<int> numa) {
    EXPECT_EQ(device.id, id);
    EXPECT_TRUE(device.healthy) << device.unhealthy_reason;
    EXPECT_EQ(device.iommu_group, group);
    EXPECT_EQ(device.numa_node, numa);
  }

  // The one resource a node of one vGPU type advertises, with nothing to report, its env name and id kind.
  static const ResourceDevices& OnlyResource(const VgpuSnapshot& s, const std::string& resource,
                                             const std::string& env_name, DeviceIdKind kind) {
    EXPECT_THAT(s.problems, ::testing::IsEmpty());
    EXPECT_EQ(s.snapshot.resources.size(), 1u);
    const ResourceDevices& r = s.snapshot.resources.at(resource);
    EXPECT_EQ(r.env_name, env_name);
    EXPECT_EQ(r.id_kind, kind);
    return r;
  }

  testing::TempDir dir_;
  testing::SysfsTree tree_;
  vgpu::CatalogStore catalog_;
  HostPaths paths_;
  DeviceSnapshot previous_;
};

TEST_F(VgpuSnapshotTest, MdevsAreOneResourcePerTypeWithUuidIdsAndTheParentsNuma) {
  AddT4WithMdevs();
  const VgpuSnapshot s = Build();
  const ResourceDevices& r =
      OnlyResource(s, kT4_1Q, "MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-1Q", DeviceIdKind::kMdevUuid);
  ASSERT_EQ(r.devices.size(), 2u);
  ExpectHealthy(r.devices[0], kMdevA, 100, 1);  // the parent's NUMA node
  ExpectHealthy(r.devices[1], kMdevB, 101, 1);
}

TEST_F(VgpuSnapshotTest, MdevAllocateIsByteExact) {
  AddT4WithMdevs();
  std::ofstream(paths_.dev_root / "iommu") << "";  // an iommufd host: still no cdev or /dev/iommu for an mdev
  VgpuSnapshot s = Build();
  const ResourceDevices& r = s.snapshot.resources.at(kT4_1Q);
  absl::StatusOr<ContainerAllocation> a = AllocateContainer(
      r, {.node_set = pci::VfioNodeSet::kIommufd, .host_iommufd = true, .cdi = false}, {kMdevB, kMdevA});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->envs, (std::map<std::string, std::string>{
                         {"MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-1Q",
                          "1b7e5c3a-0f4d-4a57-9b0e-3c8f1d2a6b01,9a0c2e4f-6b8d-4f1a-8c3e-5d7f9b1a3c02"}}));
  EXPECT_EQ(a->devices, (std::vector<DeviceNode>{{"/dev/vfio/vfio", "/dev/vfio/vfio", "mrw"},
                                                 {"/dev/vfio/100", "/dev/vfio/100", "mrw"},
                                                 {"/dev/vfio/101", "/dev/vfio/101", "mrw"}}));
  EXPECT_THAT(a->cdi_devices, ::testing::IsEmpty());

  absl::StatusOr<ContainerAllocation> one = AllocateContainer(r, {}, {kMdevB});
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->envs.at("MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-1Q"), kMdevB);
  EXPECT_EQ(one->devices, (std::vector<DeviceNode>{{"/dev/vfio/vfio", "/dev/vfio/vfio", "mrw"},
                                                   {"/dev/vfio/101", "/dev/vfio/101", "mrw"}}));
}

TEST_F(VgpuSnapshotTest, MdevCdiSpecHasTheGroupNodeOnlyAsAllocate) {
  AddT4WithMdevs();
  const ResourceDevices r = Build().snapshot.resources.at(kT4_1Q);
  for (pci::VfioNodeSet set : {pci::VfioNodeSet::kLegacyAndCdevs, pci::VfioNodeSet::kIommufd}) {
    const std::string json = CdiSpecJson(r, set, /*host_iommufd=*/true);
    EXPECT_THAT(json, ::testing::HasSubstr("/dev/vfio/100"));
    EXPECT_THAT(json, ::testing::Not(::testing::HasSubstr("/dev/iommu")));
  }
}

TEST_F(VgpuSnapshotTest, MdevAllocateRefusesPciAddressesAndUnknownUuids) {
  AddT4WithMdevs();
  const ResourceDevices r = Build().snapshot.resources.at(kT4_1Q);
  absl::StatusOr<ContainerAllocation> bdf = AllocateContainer(r, {}, {kT4Parent});
  EXPECT_EQ(bdf.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bdf.status().message()), ::testing::HasSubstr("malformed device ids: \"0000:3b:00.0\""));
  absl::StatusOr<ContainerAllocation> unknown = AllocateContainer(r, {}, {kMdevC});
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.status().message()), ::testing::HasSubstr(kMdevC));
}

TEST_F(VgpuSnapshotTest, SriovVgpusAreVfBdfsWithPciResourceEnvAndThePfsNuma) {
  AddL40sWithVgpus();
  const VgpuSnapshot s = Build();
  const ResourceDevices& r =
      OnlyResource(s, kL40s_1Q, "PCI_RESOURCE_NVIDIA_COM_NVIDIA_L40S-1Q", DeviceIdKind::kPciAddress);
  ASSERT_EQ(r.devices.size(), 2u);
  ExpectHealthy(r.devices[0], kVf1, 21, 0);  // the PF's NUMA node: the VF itself says -1
  ExpectHealthy(r.devices[1], kVf2, 22, 0);
  EXPECT_THAT(r.devices[0].vfio_cdevs, ::testing::ElementsAre("vfio3"));
}

// A VF vGPU is handed its node set's nodes, one backend at a time (issue 32: iommufd used to add the cdev and
// /dev/iommu beside the group node).
TEST_F(VgpuSnapshotTest, SriovAllocateIsByteExactPerNodeSet) {
  AddL40sWithVgpus();
  const ResourceDevices r = Build().snapshot.resources.at(kL40s_1Q);
  absl::StatusOr<ContainerAllocation> legacy = AllocateContainer(r, {}, {kVf2, kVf1});
  ASSERT_TRUE(legacy.ok()) << legacy.status();
  EXPECT_EQ(legacy->envs, (std::map<std::string, std::string>{
                              {"PCI_RESOURCE_NVIDIA_COM_NVIDIA_L40S-1Q", "0000:5e:00.4,0000:5e:00.5"}}));
  EXPECT_EQ(legacy->devices, (std::vector<DeviceNode>{{"/dev/vfio/vfio", "/dev/vfio/vfio", "mrw"},
                                                      {"/dev/vfio/21", "/dev/vfio/21", "mrw"},
                                                      {"/dev/vfio/22", "/dev/vfio/22", "mrw"}}));
  absl::StatusOr<ContainerAllocation> cdevs = AllocateContainer(
      r, {.node_set = pci::VfioNodeSet::kLegacyAndCdevs, .host_iommufd = true, .cdi = false}, {kVf1});
  ASSERT_TRUE(cdevs.ok()) << cdevs.status();
  EXPECT_EQ(cdevs->devices, (std::vector<DeviceNode>{{"/dev/vfio/vfio", "/dev/vfio/vfio", "mrw"},
                                                     {"/dev/vfio/21", "/dev/vfio/21", "mrw"},
                                                     {"/dev/vfio/devices/vfio3", "/dev/vfio/devices/vfio3", "mrw"}}));
  absl::StatusOr<ContainerAllocation> iommufd = AllocateContainer(
      r, {.node_set = pci::VfioNodeSet::kIommufd, .host_iommufd = true, .cdi = false}, {kVf1});
  ASSERT_TRUE(iommufd.ok()) << iommufd.status();
  EXPECT_EQ(iommufd->envs, (std::map<std::string, std::string>{{"PCI_RESOURCE_NVIDIA_COM_NVIDIA_L40S-1Q", kVf1}}));
  EXPECT_EQ(iommufd->devices, (std::vector<DeviceNode>{{"/dev/vfio/devices/vfio3", "/dev/vfio/devices/vfio3", "mrw"},
                                                       {"/dev/iommu", "/dev/iommu", "mrw"}}));
}

TEST_F(VgpuSnapshotTest, MdevHealthGroupNodeParentDriverRemoval) {
  AddT4WithMdevs();
  ExpectGroupNodeRule(kT4_1Q, kMdevA, 100);

  ExpectUnhealthyWhile(
      kT4_1Q, kMdevA, [&] { tree_.BindDriver(kT4Parent, ""); }, "parent 0000:3b:00.0 lost its driver",
      [&] { tree_.BindDriver(kT4Parent, "nvidia"); });

  vt::RemoveMdev(tree_, kMdevA);
  const std::string removed = "mdev removed (no " + (tree_.root() / "bus/mdev/devices" / kMdevA).string() + ")";
  VgpuSnapshot s = Build();
  EXPECT_EQ(State(s, kT4_1Q, kMdevA), removed);
  EXPECT_EQ(State(s, kT4_1Q, kMdevB), kHealthy);
  EXPECT_EQ(State(Build(), kT4_1Q, kMdevA), removed);  // stays listed

  // A new mdev of the type: the vGPUs were recreated, the removed one is not coming back.
  vt::AddMdev(tree_, kMdevC, kT4Parent, "nvidia-222", 102);
  Node("vfio/102");
  s = Build();
  const ResourceDevices& r = s.snapshot.resources.at(kT4_1Q);
  ASSERT_EQ(r.devices.size(), 2u);
  EXPECT_EQ(r.devices[0].id, kMdevB);
  EXPECT_EQ(r.devices[1].id, kMdevC);
  EXPECT_TRUE(r.devices[1].healthy);
}

TEST_F(VgpuSnapshotTest, SriovHealthDriverTypeRetypeAndGroupNode) {
  AddL40sWithVgpus();
  ExpectGroupNodeRule(kL40s_1Q, kVf1, 21);

  ExpectUnhealthyWhile(
      kL40s_1Q, kVf1, [&] { tree_.BindDriver(kVf1, "vfio-pci"); }, "driver vfio-pci",
      [&] { tree_.BindDriver(kVf1, "nvidia"); });

  vt::SetVgpuType(tree_, kVf1, "0\n");
  EXPECT_EQ(State(Build(), kL40s_1Q, kVf1), "nvidia/current_vgpu_type is 0 (vGPU deleted)");

  vt::SetVgpuType(tree_, kVf1, "1157\n");
  const VgpuSnapshot s = Build();
  EXPECT_EQ(State(s, kL40s_1Q, kVf1), "retyped to NVIDIA L40S-4Q (type 1157)");
  EXPECT_EQ(State(s, kL40s_4Q, kVf1), kHealthy);
  EXPECT_EQ(State(s, kL40s_1Q, kVf2), kHealthy);
}

TEST_F(VgpuSnapshotTest, AnUnresolvedVfIsAProblemNeverAResource) {
  AddL40sWithVgpus();
  vt::SetVgpuType(tree_, kVf2, "1414\n");  // not in the card's catalog
  VgpuSnapshot s = Build();
  ASSERT_EQ(s.snapshot.resources.size(), 1u);
  EXPECT_EQ(s.snapshot.resources.at(kL40s_1Q).Find(kVf2), nullptr);
  ASSERT_EQ(s.problems.size(), 1u);
  EXPECT_THAT(s.problems[0], ::testing::StartsWith("0000:5e:00.5: not advertised: vGPU type 1414 of 0000:5e:00.5"));
}

TEST_F(VgpuSnapshotTest, BothFrameworksTurnEveryVgpuUnhealthyAndAdvertiseNothingNew) {
  AddT4WithMdevs();
  ASSERT_TRUE(Device(Build(), kT4_1Q, kMdevA).healthy);
  AddL40sWithVgpus();
  VgpuSnapshot s = Build();
  EXPECT_EQ(s.snapshot.resources.count(kL40s_1Q), 0u);
  const PluginDevice a = Device(s, kT4_1Q, kMdevA);
  EXPECT_FALSE(a.healthy);
  EXPECT_THAT(a.unhealthy_reason, ::testing::HasSubstr("both vGPU frameworks on one node"));
  ASSERT_EQ(s.problems.size(), 1u);
  EXPECT_THAT(s.problems[0], ::testing::HasSubstr("vGPUs not served: both vGPU frameworks on one node"));
}

}  // namespace
}  // namespace vfio_agent::plugin

namespace vfio_agent::plugin {
namespace {

// The agent in vm-vgpu mode on a plain tree (no kubelet: what it advertises is read from Snapshot()).
class VgpuAgentTest : public VgpuSnapshotTest {
 protected:
  ServeOptions Options() {
    ServeOptions options;
    options.paths = paths_;
    options.paths.kubelet_dir = dir_.path() / "kubelet";
    options.udev = false;
    // Long: only the inotify watch of <dev_root>/vfio can pick the new mdev up in time.
    options.rescan_interval = std::chrono::minutes(10);
    options.workload = Workload::kVmVgpu;
    options.vgpu_catalog_file = dir_.path() / "state/vgpu-catalog.txt";
    return options;
  }
};

TEST_F(VgpuAgentTest, ServesVgpusAndPicksUpANewMdevFromItsGroupNode) {
  AddT4WithMdevs();
  Agent agent(Options());
  ASSERT_TRUE(agent.Start().ok());
  EXPECT_EQ(agent.Snapshot().resources.at(kT4_1Q).devices.size(), 2u);
  std::vector<ResourceStatus> resources = agent.Resources();
  ASSERT_EQ(resources.size(), 1u);
  EXPECT_EQ(resources[0].socket.filename(), "kubevirt-GRID_T4-1Q.sock");

  vt::AddMdev(tree_, kMdevC, kT4Parent, "nvidia-222", 102);
  Node("vfio/102");  // what the kernel does last: the VFIO group node of the new mdev
  EXPECT_TRUE(testing::WaitUntil([&] {
    const DeviceSnapshot s = agent.Snapshot();
    const PluginDevice* c = s.resources.at(kT4_1Q).Find(kMdevC);
    return c != nullptr && c->healthy;
  }));
  agent.Stop();
}

// `run`: the agent serves the process's one node::Source, which `run`'s loop rescans. It takes each state the owner
// scans and scans nothing of its own, not even for a device event: the owner follows those.
TEST_F(VgpuAgentTest, OnASharedSourceTheAgentAdvertisesTheOwnersScansAndScansNothingItself) {
  AddT4WithMdevs();
  ServeOptions options = Options();
  node::Source source({.paths = options.paths,
                       .policy = options.policy,
                       .workload = options.workload,
                       .vgpu_catalog_file = options.vgpu_catalog_file});
  source.Open();
  ASSERT_TRUE(source.Rescan().ok());
  options.source = &source;
  Agent agent(options);
  const uint64_t scans = pci::ScansStarted();
  ASSERT_TRUE(agent.Start().ok());
  EXPECT_EQ(agent.Snapshot().resources.at(kT4_1Q).devices.size(), 2u);

  vt::AddMdev(tree_, kMdevC, kT4Parent, "nvidia-222", 102);
  Node("vfio/102");  // a device event the owner follows, not the agent
  ASSERT_TRUE(source.Rescan().ok());
  EXPECT_TRUE(testing::WaitUntil([&] {
    const DeviceSnapshot s = agent.Snapshot();
    const PluginDevice* c = s.resources.at(kT4_1Q).Find(kMdevC);
    return c != nullptr && c->healthy;
  }));
  EXPECT_EQ(pci::ScansStarted() - scans, 1u) << "the agent scanned sysfs on its own";
  agent.Stop();
  // Stopped, it is no longer told: a scan after Stop reaches no subscriber of it.
  EXPECT_TRUE(source.Rescan().ok());
}

TEST_F(VgpuAgentTest, RemembersSriovNamesAcrossARestartWhenTheCardIsFull) {
  AddL40sWithVgpus();
  {
    Agent first(Options());
    ASSERT_TRUE(first.Start().ok());
    EXPECT_EQ(first.Snapshot().resources.at(kL40s_1Q).devices.size(), 2u);
  }
  for (const char* fn : {kL40sPf, kVf1, kVf2}) vt::SetCreatableTypes(tree_, fn, "ID    : vGPU Name\n");
  Agent second(Options());
  ASSERT_TRUE(second.Start().ok());
  const DeviceSnapshot s = second.Snapshot();
  ASSERT_EQ(s.resources.count(kL40s_1Q), 1u);
  EXPECT_EQ(s.resources.at(kL40s_1Q).devices.size(), 2u);
}

class ProblemRecorder final : public AgentObserver {
 public:
  void OnAllocate(const std::string&, bool, std::chrono::nanoseconds) override {}
  void OnKubeletRestart() override {}
  void OnVgpuProblem(const std::string& problem) override {
    std::lock_guard lock(mu_);
    problems_.push_back(problem);
  }
  std::vector<std::string> problems() const {
    std::lock_guard lock(mu_);
    return problems_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> problems_;
};

TEST_F(VgpuAgentTest, AnUnresolvedVfIsReportedToTheObserverOnceWhileItLasts) {
  AddL40sWithVgpus();
  vt::SetVgpuType(tree_, kVf2, "1414\n");
  ProblemRecorder recorder;
  ServeOptions options = Options();
  options.observer = &recorder;
  Agent agent(options);
  ASSERT_TRUE(agent.Start().ok());
  ASSERT_EQ(recorder.problems().size(), 1u);
  EXPECT_THAT(recorder.problems()[0], ::testing::HasSubstr("vGPU type 1414 of 0000:5e:00.5"));
  // Another scan (seen through a change it brings) does not report it again.
  RemoveNode("vfio/21");
  EXPECT_TRUE(testing::WaitUntil([&] { return !agent.Snapshot().resources.at(kL40s_1Q).devices[0].healthy; }));
  EXPECT_EQ(recorder.problems().size(), 1u);
  agent.Stop();
}

}  // namespace
}  // namespace vfio_agent::plugin
