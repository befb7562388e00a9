#include "vfio_gpu_agent/fabric/partitions.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fabric_fixture.h"

namespace vfio_agent::fabric {
namespace {

using ::testing::ElementsAre;
using vfio_agent::testing::HgxTable;
using vfio_agent::testing::Module;

std::set<std::string> AllGpus() { return {vfio_agent::testing::HgxGpus().begin(), vfio_agent::testing::HgxGpus().end()}; }

std::vector<std::string> Sorted(std::vector<std::string> ids) {
  std::sort(ids.begin(), ids.end());
  return ids;
}

TEST(BdfFromFmBusIdTest, ReadsNvmlStyleAndShortDomains) {
  EXPECT_EQ(*BdfFromFmBusId("00000000:1B:00.0"), "0000:1b:00.0");
  EXPECT_EQ(*BdfFromFmBusId("0001:db:1f.7"), "0001:db:1f.7");
  for (const char* bad : {"", "1B:00.0", "00000000:1B:00", "00000000:1B:20.0", "00000000:1B:00.8", "100000000:1B:00.0",
                          "0000:1g:00.0", "00010000:1B:00.0"}) {
    EXPECT_FALSE(BdfFromFmBusId(bad).ok()) << bad;
  }
}

TEST(PartitionTableTest, ExactMatchesTheWholeSetOnly) {
  const PartitionTable table = HgxTable();
  const Partition* pair = table.Exact({Module(1), Module(2)});
  ASSERT_NE(pair, nullptr);
  EXPECT_EQ(pair->id, 3u);
  EXPECT_EQ(table.Exact({Module(2), Module(3)}), nullptr);  // no partition pairs modules 2 and 3
  EXPECT_EQ(table.Exact({Module(1), Module(2), Module(3)}), nullptr);
  EXPECT_EQ(table.Exact(AllGpus())->id, 0u);
  EXPECT_THAT(table.Sizes(), ElementsAre(1, 2, 4, 8));
}

TEST(PreferredPartitionTest, PairsFollowModulesNotPciOrder) {
  // Everything free: every pair breaks the 8 and one 4; the NUMA tie-break then decides, and the lowest id last.
  // Module 1 and 2 sit at PCI indexes 4 and 6, not 0 and 1.
  auto chosen = PreferredPartition(HgxTable(), AllGpus(), {}, 2, {});
  ASSERT_TRUE(chosen);
  EXPECT_EQ(*chosen, Sorted({Module(1), Module(2)}));
  EXPECT_NE(*chosen, Sorted({vfio_agent::testing::HgxGpus()[0], vfio_agent::testing::HgxGpus()[1]}));
}

TEST(PreferredPartitionTest, TakesThePairThatBreaksNoFreeLargerPartition) {
  // Module 1 is held: the 8 and the first 4 are no longer free. (3,4) breaks nothing free; (5,6) and (7,8) would
  // break the free 4 of modules 5-8.
  std::set<std::string> free = AllGpus();
  free.erase(Module(1));
  auto chosen = PreferredPartition(HgxTable(), free, {}, 2, {});
  ASSERT_TRUE(chosen);
  EXPECT_EQ(*chosen, Sorted({Module(3), Module(4)}));
  // A single GPU: module 2, whose pair is already broken, rather than one of a free 4.
  auto single = PreferredPartition(HgxTable(), free, {}, 1, {});
  ASSERT_TRUE(single);
  EXPECT_THAT(*single, ElementsAre(Module(2)));
}

TEST(PreferredPartitionTest, NumaBreaksTiesBetweenEquallyGoodPartitions) {
  std::map<std::string, int> numa;
  for (uint32_t module = 1; module <= 8; ++module) numa[Module(module)] = module == 2 ? 1 : 0;
  auto chosen = PreferredPartition(HgxTable(), AllGpus(), {}, 2, numa);
  ASSERT_TRUE(chosen);
  EXPECT_EQ(*chosen, Sorted({Module(3), Module(4)}));  // (1,2) spans two nodes
}

TEST(PreferredPartitionTest, HonoursMustIncludeAndRefusesSizesNoPartitionHas) {
  auto chosen = PreferredPartition(HgxTable(), AllGpus(), {Module(6)}, 4, {});
  ASSERT_TRUE(chosen);
  EXPECT_EQ(*chosen, Sorted({Module(5), Module(6), Module(7), Module(8)}));
  EXPECT_FALSE(PreferredPartition(HgxTable(), AllGpus(), {}, 3, {}));
  // Only 3 of the first 4 free, and both 4s need a held GPU: no 4 at all.
  std::set<std::string> free = AllGpus();
  free.erase(Module(1));
  free.erase(Module(5));
  EXPECT_FALSE(PreferredPartition(HgxTable(), free, {}, 4, {}));
}

}  // namespace
}  // namespace vfio_agent::fabric
