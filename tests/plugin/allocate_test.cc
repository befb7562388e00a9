#include "vfio_gpu_agent/plugin/allocate.h"

#include <algorithm>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "resource_server.h"
#include "test_devices.h"
#include "support/sysfs_tree.h"
#include "vfio_gpu_agent/plugin/vfio_backend.h"

namespace vfio_agent::plugin {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

using fixtures::Gpu;

ResourceDevices H200() {
  ResourceDevices r;
  r.resource_name = "nvidia.com/GH100_H200_SXM_141GB";
  r.env_name = "PCI_RESOURCE_NVIDIA_COM_GH100_H200_SXM_141GB";
  r.devices = {Gpu("0000:3b:00.0", 73, 0, {"vfio0"}), Gpu("0000:5d:00.0", 74, 0, {"vfio1"}),
               Gpu("0000:5d:00.1", 74, 0, {"vfio2"}), Gpu("0000:9a:00.0", 80, 1, {"vfio3"})};
  return r;
}

DeviceNode Node(const std::string& path) { return {path, path, "mrw"}; }

// peer-device-plugin.md 2.3: one BDF in group 73, no iommufd, compared on the wire message.
TEST(AllocateTest, MatchesPeerContractFieldByField) {
  absl::StatusOr<ContainerAllocation> got = AllocateContainer(H200(), {}, {"0000:3b:00.0"});
  ASSERT_TRUE(got.ok()) << got.status();
  v1beta1::ContainerAllocateResponse wire = internal::ToProto(*got);
  ASSERT_EQ(wire.envs_size(), 1);
  EXPECT_EQ(wire.envs().at("PCI_RESOURCE_NVIDIA_COM_GH100_H200_SXM_141GB"), "0000:3b:00.0");
  ASSERT_EQ(wire.devices_size(), 2);
  EXPECT_EQ(wire.devices(0).container_path(), "/dev/vfio/vfio");
  EXPECT_EQ(wire.devices(0).host_path(), "/dev/vfio/vfio");
  EXPECT_EQ(wire.devices(0).permissions(), "mrw");
  EXPECT_EQ(wire.devices(1).container_path(), "/dev/vfio/73");
  EXPECT_EQ(wire.devices(1).host_path(), "/dev/vfio/73");
  EXPECT_EQ(wire.devices(1).permissions(), "mrw");
  EXPECT_EQ(wire.mounts_size(), 0);
  EXPECT_EQ(wire.annotations_size(), 0);
  EXPECT_EQ(wire.cdi_devices_size(), 0);
}

TEST(AllocateTest, SortsIdsAndDeduplicatesGroupNodes) {
  absl::StatusOr<ContainerAllocation> got =
      AllocateContainer(H200(), {}, {"0000:9a:00.0", "0000:5d:00.1", "0000:3b:00.0", "0000:5d:00.0"});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->envs.at("PCI_RESOURCE_NVIDIA_COM_GH100_H200_SXM_141GB"),
            "0000:3b:00.0,0000:5d:00.0,0000:5d:00.1,0000:9a:00.0");
  EXPECT_THAT(got->devices, ElementsAre(Node("/dev/vfio/vfio"), Node("/dev/vfio/73"), Node("/dev/vfio/74"),
                                        Node("/dev/vfio/80")));
}

TEST(AllocateTest, IsAPureFunctionOfTheIdSet) {
  for (pci::VfioNodeSet set : {pci::VfioNodeSet::kLegacy, pci::VfioNodeSet::kLegacyAndCdevs, pci::VfioNodeSet::kIommufd}) {
    std::vector<std::string> ids = {"0000:9a:00.0", "0000:3b:00.0", "0000:5d:00.0"};
    const AllocateConfig config{.node_set = set, .host_iommufd = true};
    absl::StatusOr<ContainerAllocation> first = AllocateContainer(H200(), config, ids);
    ASSERT_TRUE(first.ok());
    std::sort(ids.begin(), ids.end());
    do {
      absl::StatusOr<ContainerAllocation> again = AllocateContainer(H200(), config, ids);
      ASSERT_TRUE(again.ok());
      EXPECT_EQ(*again, *first);
    } while (std::next_permutation(ids.begin(), ids.end()));
  }
}

// One backend's nodes per node set, never the legacy group and /dev/iommu together (issue 32). The legacy sets are
// KubeVirt's PCI plugin's list byte for byte: per device /dev/vfio/vfio, /dev/vfio/<group>, then (from v1.9) the
// device's cdevs; never /dev/iommu, which KubeVirt's own iommufd plugin serves.
TEST(AllocateTest, EachNodeSetHandsOutOneBackendsNodesInKubevirtOrder) {
  const std::vector<std::string> ids = {"0000:5d:00.0", "0000:3b:00.0"};
  absl::StatusOr<ContainerAllocation> legacy =
      AllocateContainer(H200(), {.node_set = pci::VfioNodeSet::kLegacy, .host_iommufd = true}, ids);
  ASSERT_TRUE(legacy.ok()) << legacy.status();
  EXPECT_THAT(legacy->devices, ElementsAre(Node("/dev/vfio/vfio"), Node("/dev/vfio/73"), Node("/dev/vfio/74")));

  absl::StatusOr<ContainerAllocation> cdevs =
      AllocateContainer(H200(), {.node_set = pci::VfioNodeSet::kLegacyAndCdevs, .host_iommufd = true}, ids);
  ASSERT_TRUE(cdevs.ok()) << cdevs.status();
  EXPECT_THAT(cdevs->devices, ElementsAre(Node("/dev/vfio/vfio"), Node("/dev/vfio/73"), Node("/dev/vfio/devices/vfio0"),
                                          Node("/dev/vfio/74"), Node("/dev/vfio/devices/vfio1")));
  // Without /dev/iommu the cdevs are still what KubeVirt's plugin lists (sysfs vfio-dev).
  absl::StatusOr<ContainerAllocation> no_iommufd =
      AllocateContainer(H200(), {.node_set = pci::VfioNodeSet::kLegacyAndCdevs, .host_iommufd = false}, ids);
  ASSERT_TRUE(no_iommufd.ok()) << no_iommufd.status();
  EXPECT_EQ(no_iommufd->devices, cdevs->devices);

  absl::StatusOr<ContainerAllocation> iommufd =
      AllocateContainer(H200(), {.node_set = pci::VfioNodeSet::kIommufd, .host_iommufd = true}, ids);
  ASSERT_TRUE(iommufd.ok()) << iommufd.status();
  EXPECT_THAT(iommufd->devices,
              ElementsAre(Node("/dev/vfio/devices/vfio0"), Node("/dev/iommu"), Node("/dev/vfio/devices/vfio1")));
}

TEST(AllocateTest, IommufdFailsNamingTheDeviceWithoutACdevOrAHostWithoutIommu) {
  ResourceDevices r = H200();
  r.devices[1].vfio_cdevs.clear();
  absl::StatusOr<ContainerAllocation> got =
      AllocateContainer(r, {.node_set = pci::VfioNodeSet::kIommufd, .host_iommufd = true}, {"0000:5d:00.0"});
  ASSERT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(got.status().message(), HasSubstr("0000:5d:00.0"));
  EXPECT_THAT(got.status().message(), HasSubstr("no VFIO cdev"));
  got = AllocateContainer(H200(), {.node_set = pci::VfioNodeSet::kIommufd, .host_iommufd = false}, {"0000:3b:00.0"});
  ASSERT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(got.status().message(), HasSubstr("/dev/iommu"));
}

// --vfio-backend: legacy and iommufd are what they say; auto is what KubeVirt's PCI plugin hands out for the
// release its CR shows, and the newest release's set while that is unknown.
TEST(VfioBackendTest, ResolvesTheChoiceAgainstTheKubevirtRelease) {
  using pci::VfioNodeSet;
  const auto release = [](const char* text) { return kube::ParseKubevirtRelease(text); };
  EXPECT_EQ(ResolveNodeSet(VfioBackendChoice::kLegacy, release("v1.9.0")), VfioNodeSet::kLegacy);
  EXPECT_EQ(ResolveNodeSet(VfioBackendChoice::kIommufd, release("v1.8.1")), VfioNodeSet::kIommufd);
  EXPECT_EQ(ResolveNodeSet(VfioBackendChoice::kIommufd, std::nullopt), VfioNodeSet::kIommufd);
  EXPECT_EQ(ResolveNodeSet(VfioBackendChoice::kAuto, release("v1.8.1")), VfioNodeSet::kLegacy);
  EXPECT_EQ(ResolveNodeSet(VfioBackendChoice::kAuto, release("v0.59.0")), VfioNodeSet::kLegacy);
  EXPECT_EQ(ResolveNodeSet(VfioBackendChoice::kAuto, release("v1.9.0-alpha.0")), VfioNodeSet::kLegacyAndCdevs);
  EXPECT_EQ(ResolveNodeSet(VfioBackendChoice::kAuto, release("v1.10.2")), VfioNodeSet::kLegacyAndCdevs);
  EXPECT_EQ(ResolveNodeSet(VfioBackendChoice::kAuto, release("v2.0.0")), VfioNodeSet::kLegacyAndCdevs);
  EXPECT_EQ(ResolveNodeSet(VfioBackendChoice::kAuto, std::nullopt), VfioNodeSet::kLegacyAndCdevs);
  EXPECT_EQ(ParseVfioBackendChoice("auto"), VfioBackendChoice::kAuto);
  EXPECT_EQ(ParseVfioBackendChoice("iommufd"), VfioBackendChoice::kIommufd);
  EXPECT_EQ(ParseVfioBackendChoice("legacy"), VfioBackendChoice::kLegacy);
  EXPECT_EQ(ParseVfioBackendChoice("both"), std::nullopt);
}

TEST(VfioBackendTest, IommufdIsRefusedOnAHostWithoutDevIommuNamingIt) {
  vfio_agent::testing::TempDir dir("va-backend");
  const absl::Status refused = CheckHostSupports(VfioBackendChoice::kIommufd, dir.path());
  ASSERT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr((dir.path() / "iommu").string()));
  EXPECT_TRUE(CheckHostSupports(VfioBackendChoice::kAuto, dir.path()).ok());
  EXPECT_TRUE(CheckHostSupports(VfioBackendChoice::kLegacy, dir.path()).ok());
  std::ofstream(dir.path() / "iommu") << "";
  EXPECT_TRUE(CheckHostSupports(VfioBackendChoice::kIommufd, dir.path()).ok());
}

// A device the node's set gives no nodes is not advertised Healthy: the kubelet would place a VM on it and its
// Allocate fail.
TEST(VfioBackendTest, ApplyNodeSetTurnsDevicesWithoutTheSetsNodesUnhealthy) {
  vfio_agent::testing::TempDir dev("va-backend-dev");
  std::filesystem::create_directories(dev.path() / "vfio");
  for (int group : {73, 74, 80}) std::ofstream(dev.path() / "vfio" / std::to_string(group)) << "";
  DeviceSnapshot snapshot;
  snapshot.iommufd = true;
  ResourceDevices& r = snapshot.resources["nvidia.com/GH100_H200_SXM_141GB"] = H200();
  r.devices[1].vfio_cdevs.clear();
  DeviceSnapshot legacy = snapshot;
  ApplyNodeSet(legacy, pci::VfioNodeSet::kLegacyAndCdevs, dev.path());
  EXPECT_EQ(legacy.node_set, pci::VfioNodeSet::kLegacyAndCdevs);
  for (const PluginDevice& device : legacy.resources.begin()->second.devices) EXPECT_TRUE(device.healthy) << device.id;
  // An iommufd host without group 80's node (the node's health lets the cdev stand in): not for the legacy sets.
  std::filesystem::remove(dev.path() / "vfio/80");
  DeviceSnapshot cdev_only = snapshot;
  ApplyNodeSet(cdev_only, pci::VfioNodeSet::kLegacy, dev.path());
  EXPECT_FALSE(cdev_only.resources.begin()->second.devices[3].healthy);
  EXPECT_THAT(cdev_only.resources.begin()->second.devices[3].unhealthy_reason, HasSubstr("no /dev/vfio/80"));
  ApplyNodeSet(snapshot, pci::VfioNodeSet::kIommufd, dev.path());
  EXPECT_TRUE(snapshot.resources.begin()->second.devices[3].healthy);
  const std::vector<PluginDevice>& devices = snapshot.resources.begin()->second.devices;
  EXPECT_FALSE(devices[1].healthy);
  EXPECT_THAT(devices[1].unhealthy_reason, HasSubstr("no VFIO cdev"));
  EXPECT_TRUE(devices[0].healthy);
}

TEST(AllocateTest, RejectsUnknownAndMalformedIdsNamingThem) {
  absl::StatusOr<ContainerAllocation> got =
      AllocateContainer(H200(), {}, {"0000:3b:00.0", "0000:ff:00.0", "not-a-bdf", ""});
  ASSERT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(got.status().message(), HasSubstr("0000:ff:00.0"));
  EXPECT_THAT(got.status().message(), HasSubstr("\"not-a-bdf\""));
  EXPECT_THAT(got.status().message(), HasSubstr("\"\""));
  EXPECT_THAT(got.status().message(), ::testing::Not(HasSubstr("0000:3b:00.0")));
}

TEST(AllocateTest, RejectsUnhealthyDevicesWithTheReason) {
  ResourceDevices r = H200();
  r.devices[3].healthy = false;
  r.devices[3].unhealthy_reason = "driver nvidia";
  absl::StatusOr<ContainerAllocation> got = AllocateContainer(r, {}, {"0000:9a:00.0"});
  ASSERT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(got.status().message(), HasSubstr("0000:9a:00.0 (driver nvidia)"));
}

TEST(AllocateTest, EmptyRequestGivesAnEmptyResponse) {
  absl::StatusOr<ContainerAllocation> got = AllocateContainer(H200(), {}, {});
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->envs.empty());
  EXPECT_TRUE(got->devices.empty());
}

TEST(AllocateTest, CdiNamesOnePerRequestedDevice) {
  absl::StatusOr<ContainerAllocation> got = AllocateContainer(H200(), {.cdi = true}, {"0000:5d:00.0", "0000:3b:00.0"});
  ASSERT_TRUE(got.ok());
  EXPECT_THAT(got->cdi_devices, ElementsAre("nvidia.com/GH100_H200_SXM_141GB=0000:3b:00.0",
                                            "nvidia.com/GH100_H200_SXM_141GB=0000:5d:00.0"));
}

// Two HGX boards' switches, groups 40 and 41; the ids come sorted as in a snapshot.
ResourceDevices NvSwitches() {
  ResourceDevices r;
  r.resource_name = "nvidia.com/GH100_H100_NVSWITCH";
  r.env_name = "PCI_RESOURCE_NVIDIA_COM_GH100_H100_NVSWITCH";
  r.devices = fixtures::NvSwitchGroup({"0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0"}, 40);
  for (PluginDevice& d : fixtures::NvSwitchGroup({"0000:85:00.0", "0000:86:00.0"}, 41)) r.devices.push_back(d);
  return r;
}

TEST(AllocateTest, AWholeNvSwitchGroupGoesToOneVm) {
  absl::StatusOr<ContainerAllocation> got =
      AllocateContainer(NvSwitches(), {}, {"0000:08:00.0", "0000:06:00.0", "0000:05:00.0", "0000:07:00.0"});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->envs.at("PCI_RESOURCE_NVIDIA_COM_GH100_H100_NVSWITCH"),
            "0000:05:00.0,0000:06:00.0,0000:07:00.0,0000:08:00.0");
  EXPECT_THAT(got->devices, ElementsAre(Node("/dev/vfio/vfio"), Node("/dev/vfio/40")));
  // Both boards' switches at once: two whole groups.
  EXPECT_TRUE(AllocateContainer(NvSwitches(), {},
                                {"0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0", "0000:85:00.0",
                                 "0000:86:00.0"})
                  .ok());
}

TEST(AllocateTest, PartOfAnNvSwitchGroupIsRefusedNamingTheMissingMembers) {
  absl::StatusOr<ContainerAllocation> got =
      AllocateContainer(NvSwitches(), {}, {"0000:07:00.0", "0000:05:00.0", "0000:85:00.0", "0000:86:00.0"});
  ASSERT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
  EXPECT_THAT(got.status().message(),
              HasSubstr("nvidia.com/GH100_H100_NVSWITCH: IOMMU group 40 (/dev/vfio/40): 0000:05:00.0, 0000:07:00.0 "
                        "requested without 0000:06:00.0, 0000:08:00.0"));
  // The complete group is not blamed.
  EXPECT_THAT(got.status().message(), ::testing::Not(HasSubstr("group 41")));

  absl::StatusOr<ContainerAllocation> one = AllocateContainer(NvSwitches(), {}, {"0000:86:00.0"});
  ASSERT_EQ(one.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(one.status().message(), HasSubstr("IOMMU group 41 (/dev/vfio/41): 0000:86:00.0 requested without "
                                                "0000:85:00.0"));
}

TEST(ListAndWatchTest, OmitsTopologyWithoutNumaAndKeepsNodeIds) {
  ResourceDevices r = H200();
  r.devices[0].numa_node = std::nullopt;
  r.devices[1].healthy = false;
  v1beta1::ListAndWatchResponse wire = internal::ToListAndWatch(r);
  ASSERT_EQ(wire.devices_size(), 4);
  EXPECT_EQ(wire.devices(0).id(), "0000:3b:00.0");
  EXPECT_FALSE(wire.devices(0).has_topology());
  EXPECT_EQ(wire.devices(0).health(), "Healthy");
  EXPECT_EQ(wire.devices(1).health(), "Unhealthy");
  ASSERT_EQ(wire.devices(3).topology().nodes_size(), 1);
  EXPECT_EQ(wire.devices(3).topology().nodes(0).id(), 1);
}

TEST(OptionsTest, PreferredAllocationAvailableAndNoPreStart) {
  v1beta1::DevicePluginOptions options = internal::PluginOptions();
  EXPECT_FALSE(options.pre_start_required());
  EXPECT_TRUE(options.get_preferred_allocation_available());
}

}  // namespace
}  // namespace vfio_agent::plugin
