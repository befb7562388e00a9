#include "vfio_gpu_agent/plugin/allocate.h"

#include <algorithm>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "resource_server.h"
#include "test_devices.h"

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
  std::vector<std::string> ids = {"0000:9a:00.0", "0000:3b:00.0", "0000:5d:00.0"};
  absl::StatusOr<ContainerAllocation> first = AllocateContainer(H200(), {.iommufd = true}, ids);
  ASSERT_TRUE(first.ok());
  std::sort(ids.begin(), ids.end());
  do {
    absl::StatusOr<ContainerAllocation> again = AllocateContainer(H200(), {.iommufd = true}, ids);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*again, *first);
  } while (std::next_permutation(ids.begin(), ids.end()));
}

TEST(AllocateTest, IommufdAddsOnlyTheRequestedFunctionsCdevsInPeerOrder) {
  absl::StatusOr<ContainerAllocation> got = AllocateContainer(H200(), {.iommufd = true}, {"0000:5d:00.0"});
  ASSERT_TRUE(got.ok());
  EXPECT_THAT(got->devices, ElementsAre(Node("/dev/vfio/devices/vfio1"), Node("/dev/vfio/vfio"),
                                        Node("/dev/vfio/74"), Node("/dev/iommu")));
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
