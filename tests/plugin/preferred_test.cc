#include <algorithm>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_devices.h"
#include "vfio_gpu_agent/plugin/allocate.h"

namespace vfio_agent::plugin {
namespace {

using ::testing::ElementsAre;
using ::testing::IsSupersetOf;

using fixtures::Gpu;

// HGX-like: GPUs 0-3 on NUMA 0, 4-7 on NUMA 1, one group each.
ResourceDevices Hgx() {
  ResourceDevices r;
  r.resource_name = "nvidia.com/GH100_H200_SXM_141GB";
  const char* bdfs[] = {"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0",
                        "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0"};
  for (int i = 0; i < 8; ++i) r.devices.push_back(Gpu(bdfs[i], 10 + i, i < 4 ? 0 : 1));
  return r;
}

std::vector<std::string> Ids(const ResourceDevices& r) {
  std::vector<std::string> ids;
  for (const auto& d : r.devices) ids.push_back(d.id);
  return ids;
}

TEST(PreferredTest, StaysOnOneNumaNode) {
  const ResourceDevices r = Hgx();
  EXPECT_THAT(PreferredAllocation(r, Ids(r), {}, 4),
              ElementsAre("0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0"));
}

TEST(PreferredTest, FollowsTheMustIncludeDevicesNode) {
  const ResourceDevices r = Hgx();
  EXPECT_THAT(PreferredAllocation(r, Ids(r), {"0000:ab:00.0"}, 3),
              ElementsAre("0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0"));
}

TEST(PreferredTest, PicksTheTightestNodeThatFits) {
  const ResourceDevices r = Hgx();
  // Node 0 has 1 free, node 1 has 3 free: a 2-GPU request fits only node 1; a 1-GPU request goes to node 0
  // and keeps node 1 whole for a bigger pod.
  std::vector<std::string> available = {"0000:18:00.0", "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0"};
  EXPECT_THAT(PreferredAllocation(r, available, {}, 2), ElementsAre("0000:9a:00.0", "0000:ab:00.0"));
  EXPECT_THAT(PreferredAllocation(r, available, {}, 1), ElementsAre("0000:18:00.0"));
}

TEST(PreferredTest, SpansFewestNodesWhenNoneFits) {
  const ResourceDevices r = Hgx();
  std::vector<std::string> available = {"0000:18:00.0", "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0"};
  EXPECT_THAT(PreferredAllocation(r, available, {}, 4), ElementsAre("0000:18:00.0", "0000:9a:00.0", "0000:ab:00.0",
                                                                    "0000:ba:00.0"));
  std::vector<std::string> got = PreferredAllocation(r, Ids(r), {"0000:18:00.0", "0000:9a:00.0"}, 3);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_THAT(got, IsSupersetOf({"0000:18:00.0", "0000:9a:00.0"}));
}

TEST(PreferredTest, KeepsMultiGpuGroupsWholeAndUnsplit) {
  ResourceDevices r;
  r.devices = {Gpu("0000:01:00.0", 1, std::nullopt), Gpu("0000:02:00.0", 2, std::nullopt),
               Gpu("0000:02:00.1", 2, std::nullopt), Gpu("0000:03:00.0", 3, std::nullopt)};
  // Two GPUs: the group that holds both, not two singletons.
  EXPECT_THAT(PreferredAllocation(r, Ids(r), {}, 2), ElementsAre("0000:02:00.0", "0000:02:00.1"));
  // One GPU: a singleton group, not half of group 2.
  EXPECT_THAT(PreferredAllocation(r, Ids(r), {}, 1), ElementsAre("0000:01:00.0"));
  // A must-include device pulls its group sibling.
  EXPECT_THAT(PreferredAllocation(r, Ids(r), {"0000:02:00.1"}, 2), ElementsAre("0000:02:00.0", "0000:02:00.1"));
}

TEST(PreferredTest, AvoidsGroupsAlreadySplitWithAnotherRequest) {
  ResourceDevices r;
  r.devices = {Gpu("0000:01:00.0", 1, std::nullopt), Gpu("0000:01:00.1", 1, std::nullopt),
               Gpu("0000:02:00.0", 2, std::nullopt)};
  // 01:00.0 is in use by another pod: taking 01:00.1 would share group 1 with it.
  EXPECT_THAT(PreferredAllocation(r, {"0000:01:00.1", "0000:02:00.0"}, {}, 1), ElementsAre("0000:02:00.0"));
}

// Allocate refuses part of an NVSwitch group, so the preferred answer must be whole groups; BDF order alone would
// split both boards here, whose switches interleave on the bus.
TEST(PreferredTest, HandsOutWholeNvSwitchGroups) {
  ResourceDevices r;
  r.devices = fixtures::NvSwitchGroup({"0000:05:00.0", "0000:07:00.0", "0000:09:00.0", "0000:0b:00.0"}, 40, 0);
  for (PluginDevice& d : fixtures::NvSwitchGroup({"0000:06:00.0", "0000:08:00.0", "0000:0a:00.0", "0000:0c:00.0"}, 41, 0)) {
    r.devices.push_back(d);
  }
  std::sort(r.devices.begin(), r.devices.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  EXPECT_THAT(PreferredAllocation(r, Ids(r), {}, 4),
              ElementsAre("0000:05:00.0", "0000:07:00.0", "0000:09:00.0", "0000:0b:00.0"));
  // A must-include switch brings its own group, not the lower one.
  EXPECT_THAT(PreferredAllocation(r, Ids(r), {"0000:0a:00.0"}, 4),
              ElementsAre("0000:06:00.0", "0000:08:00.0", "0000:0a:00.0", "0000:0c:00.0"));
  // Group 40 already split by another pod: the other board.
  EXPECT_THAT(PreferredAllocation(r, {"0000:06:00.0", "0000:07:00.0", "0000:08:00.0", "0000:09:00.0", "0000:0a:00.0",
                                      "0000:0b:00.0", "0000:0c:00.0"},
                                  {}, 4),
              ElementsAre("0000:06:00.0", "0000:08:00.0", "0000:0a:00.0", "0000:0c:00.0"));
  EXPECT_EQ(PreferredAllocation(r, Ids(r), {}, 8), Ids(r));
}

TEST(PreferredTest, ExactSizeAlwaysAndNeverFromOutsideAvailable) {
  const ResourceDevices r = Hgx();
  for (int size = 1; size <= 8; ++size) {
    std::vector<std::string> got = PreferredAllocation(r, Ids(r), {"0000:db:00.0"}, size);
    EXPECT_EQ(got.size(), static_cast<size_t>(size));
    EXPECT_THAT(got, ::testing::Contains("0000:db:00.0"));
  }
  EXPECT_EQ(PreferredAllocation(r, {"0000:18:00.0", "0000:2a:00.0"}, {}, 5).size(), 2u);
  // Ids the snapshot does not know are still candidates, but last.
  EXPECT_THAT(PreferredAllocation(r, {"0000:ff:00.0", "0000:18:00.0"}, {}, 1), ElementsAre("0000:18:00.0"));
}

TEST(PreferredTest, AnswerDoesNotDependOnInputOrder) {
  const ResourceDevices r = Hgx();
  std::vector<std::string> available = Ids(r);
  std::vector<std::string> must = {"0000:ab:00.0", "0000:2a:00.0"};
  const std::vector<std::string> expected = PreferredAllocation(r, available, must, 5);
  std::mt19937 rng(7);
  for (int i = 0; i < 50; ++i) {
    std::shuffle(available.begin(), available.end(), rng);
    std::shuffle(must.begin(), must.end(), rng);
    EXPECT_EQ(PreferredAllocation(r, available, must, 5), expected);
  }
}

}  // namespace
}  // namespace vfio_agent::plugin
