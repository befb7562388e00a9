#include "vfio_gpu_agent/vgpu/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace vfio_agent::vgpu {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

// vgpu-device-manager's own example shape: per-index entries, an all-GPU entry with a device filter, and a config
// that asks for no vGPU.
constexpr char kConfig[] = R"(version: v1
vgpu-configs:
  T4-small:
    - devices: [0]
      vgpu-devices:
        "T4-1Q": 16
    - devices: [1]
      vgpu-devices:
        "T4-2Q": 8
  mixed:
    - devices: all
      device-filter: ["0x1EB810DE"]
      vgpu-devices:
        T4-4Q: 4
    - devices: all
      device-filter: 0x223610DE
      vgpu-devices:
        A10-4Q: 3
        A10-6Q: 2
  h200-mig:
    - devices: all
      vgpu-devices: {H200X-1-18C: 7}
  none:
    - devices: all
      vgpu-devices: {}
)";

const std::vector<ConfigGpu> kNode = {
    {.index = 0, .bdf = "0000:3b:00.0", .vendor_id = 0x10de, .device_id = 0x1eb8},  // T4
    {.index = 1, .bdf = "0000:5e:00.0", .vendor_id = 0x10de, .device_id = 0x1eb8},  // T4
    {.index = 2, .bdf = "0000:86:00.0", .vendor_id = 0x10de, .device_id = 0x2236},  // A10
};

TEST(VgpuConfigTest, ParsesTheFormatOfVgpuDeviceManager) {
  absl::StatusOr<VgpuConfigFile> file = ParseVgpuConfig(kConfig);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->configs.size(), 4u);
  const std::vector<ConfigEntry>& small = file->configs.at("T4-small");
  ASSERT_EQ(small.size(), 2u);
  EXPECT_THAT(*small[0].devices, ElementsAre(0));
  EXPECT_THAT(small[0].vgpu_devices, ElementsAre(Pair("T4-1Q", 16)));
  const std::vector<ConfigEntry>& mixed = file->configs.at("mixed");
  EXPECT_FALSE(mixed[0].devices.has_value());
  EXPECT_THAT(mixed[0].device_filter, ElementsAre(0x1EB810DEu));
  EXPECT_THAT(mixed[1].device_filter, ElementsAre(0x223610DEu));
  EXPECT_THAT(mixed[1].vgpu_devices, ElementsAre(Pair("A10-4Q", 3), Pair("A10-6Q", 2)));
  EXPECT_THAT(file->configs.at("h200-mig")[0].vgpu_devices, ElementsAre(Pair("H200X-1-18C", 7)));
  EXPECT_THAT(file->configs.at("none")[0].vgpu_devices, IsEmpty());
}

TEST(VgpuConfigTest, RefusesWhatVgpuDeviceManagerRefuses) {
  const std::pair<const char*, const char*> kBad[] = {
      {"version: v2\nvgpu-configs: {a: [{devices: all, vgpu-devices: {}}]}", "unknown version"},
      {"vgpu-configs: {a: [{devices: all, vgpu-devices: {}}]}", "missing version"},
      {"version: v1\nvgpu-configs: {}", "at least one config"},
      {"version: v1\nvgpu-configs: {a: []}", "vGPU config a: needs at least one entry"},
      {"version: v1\nextra: 1\nvgpu-configs: {a: [{devices: all, vgpu-devices: {}}]}", "unexpected field 'extra'"},
      {"version: v1\nvgpu-configs: {a: [{vgpu-devices: {}}]}", "entry 0: missing required field devices"},
      {"version: v1\nvgpu-configs: {a: [{devices: all}]}", "missing required field vgpu-devices"},
      {"version: v1\nvgpu-configs: {a: [{devices: some, vgpu-devices: {}}]}", "\"all\" or a list"},
      {"version: v1\nvgpu-configs: {a: [{devices: [x], vgpu-devices: {}}]}", "is not a GPU index"},
      {"version: v1\nvgpu-configs: {a: [{devices: all, vgpu-devices: {T4-1Q: 0}}]}", "count 0"},
      {"version: v1\nvgpu-configs: {a: [{devices: all, vgpu-devices: {'GRID T4-1Q': 1}}]}", "is not a vGPU type"},
      {"version: v1\nvgpu-configs: {a: [{devices: all, vgpu-devices: {A100-1-5C: 1, A100-5C: 1}}]}",
       "cannot share a GPU"},
      {"version: v1\nvgpu-configs: {a: [{devices: all, device-filter: 10DE, vgpu-devices: {}}]}", "not a PCI id"},
      {"version: v1\nvgpu-configs: {a: [{devices: all, device-filter: '0x1FFFFFFFF', vgpu-devices: {}}]}",
       "not a PCI id"},
      {"version: v1\nvgpu-configs: [", "not YAML"},
  };
  for (const auto& [text, why] : kBad) {
    absl::StatusOr<VgpuConfigFile> file = ParseVgpuConfig(text);
    EXPECT_FALSE(file.ok()) << text;
    EXPECT_THAT(file.status().message(), HasSubstr(why)) << text;
  }
}

TEST(VgpuConfigTest, ShortTypeNameIsTheLastWord) {
  EXPECT_EQ(ShortTypeName("NVIDIA A10-4Q"), "A10-4Q");
  EXPECT_EQ(ShortTypeName("GRID T4-1Q"), "T4-1Q");
  EXPECT_EQ(ShortTypeName("  NVIDIA H200X-1-18C\n"), "H200X-1-18C");
  EXPECT_EQ(ShortTypeName("A16-2B"), "A16-2B");
}

TEST(VgpuConfigTest, DesiredTypesFollowIndicesAndDeviceFilters) {
  absl::StatusOr<VgpuConfigFile> file = ParseVgpuConfig(kConfig);
  ASSERT_TRUE(file.ok()) << file.status();
  auto small = DesiredTypes(*file, "T4-small", kNode);
  ASSERT_TRUE(small.ok()) << small.status();
  // GPU 2 is in no entry: the config leaves it alone.
  EXPECT_THAT(*small, UnorderedElementsAre(Pair("0000:3b:00.0", ElementsAre(Pair("T4-1Q", 16))),
                                           Pair("0000:5e:00.0", ElementsAre(Pair("T4-2Q", 8)))));
  auto mixed = DesiredTypes(*file, "mixed", kNode);
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  EXPECT_THAT(*mixed, UnorderedElementsAre(Pair("0000:3b:00.0", ElementsAre(Pair("T4-4Q", 4))),
                                           Pair("0000:5e:00.0", ElementsAre(Pair("T4-4Q", 4))),
                                           Pair("0000:86:00.0", ElementsAre(Pair("A10-4Q", 3), Pair("A10-6Q", 2)))));
  auto none = DesiredTypes(*file, "none", kNode);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->size(), 3u);
  EXPECT_THAT(none->at("0000:86:00.0"), IsEmpty());
}

TEST(VgpuConfigTest, UnknownConfigAndOverlappingEntriesAreErrors) {
  absl::StatusOr<VgpuConfigFile> file = ParseVgpuConfig(
      "version: v1\nvgpu-configs:\n  twice:\n    - {devices: all, vgpu-devices: {T4-1Q: 1}}\n"
      "    - {devices: [1], vgpu-devices: {T4-2Q: 1}}\n");
  ASSERT_TRUE(file.ok()) << file.status();
  auto unknown = DesiredTypes(*file, "T4-large", kNode);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.status().message(), HasSubstr("it has: twice"));
  auto twice = DesiredTypes(*file, "twice", kNode);
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(twice.status().message(), HasSubstr("GPU 1 (0000:5e:00.0) is matched by entries 0 and 1"));
}

TEST(VgpuPlanTest, OnlyTheDifferenceChanges) {
  const std::vector<ExistingVgpu> existing = {
      {.id = "u1", .type = "A10-4Q"}, {.id = "u2", .type = "A10-4Q"}, {.id = "u3", .type = "A10-4Q"}};
  EXPECT_TRUE(PlanGpu(existing, {{"A10-4Q", 3}}).empty());
  const GpuChange more = PlanGpu(existing, {{"A10-4Q", 5}});
  EXPECT_THAT(more.remove, IsEmpty());
  EXPECT_THAT(more.create, ElementsAre(Pair("A10-4Q", 2)));
  const GpuChange fewer = PlanGpu(existing, {{"A10-4Q", 1}});
  EXPECT_THAT(fewer.remove, ElementsAre("u1", "u2"));
  EXPECT_THAT(fewer.create, IsEmpty());
}

TEST(VgpuPlanTest, AHeldVgpuIsNeverRemovedAndItsRoomIsWaitedFor) {
  const std::vector<ExistingVgpu> existing = {{.id = "u1", .type = "A10-4Q", .held = true},
                                              {.id = "u2", .type = "A10-4Q"},
                                              {.id = "u3", .type = "A10-4Q", .held = true}};
  // One fewer of the same type: the free one goes, whatever the ids' order.
  const GpuChange one_fewer = PlanGpu(existing, {{"A10-4Q", 2}});
  EXPECT_THAT(one_fewer.remove, ElementsAre("u2"));
  EXPECT_THAT(one_fewer.deferred, IsEmpty());
  // Fewer still: the free one goes first, then a held one is deferred, not removed.
  const GpuChange fewer = PlanGpu(existing, {{"A10-4Q", 1}});
  EXPECT_THAT(fewer.remove, ElementsAre("u2"));
  EXPECT_THAT(fewer.deferred, ElementsAre("u1"));
  // Another type: the free one goes now; the new type is created only once the held ones are freed.
  const GpuChange retype = PlanGpu(existing, {{"A10-6Q", 2}});
  EXPECT_THAT(retype.remove, ElementsAre("u2"));
  EXPECT_THAT(retype.deferred, ElementsAre("u1", "u3"));
  EXPECT_THAT(retype.create, IsEmpty());
  const GpuChange freed = PlanGpu({{.id = "u4", .type = "A10-4Q"}}, {{"A10-6Q", 2}});
  EXPECT_THAT(freed.remove, ElementsAre("u4"));
  EXPECT_THAT(freed.create, ElementsAre(Pair("A10-6Q", 2)));
}

TEST(VgpuPlanTest, AnEmptyConfigRemovesEveryFreeVgpu) {
  const GpuChange change = PlanGpu({{.id = "0000:3b:00.5", .type = "H200X-1-18C"},
                                    {.id = "0000:3b:00.4", .type = "H200X-1-18C"}},
                                   {});
  EXPECT_THAT(change.remove, ElementsAre("0000:3b:00.4", "0000:3b:00.5"));
  EXPECT_THAT(change.create, IsEmpty());
}

}  // namespace
}  // namespace vfio_agent::vgpu
