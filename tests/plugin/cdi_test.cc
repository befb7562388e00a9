#include "vfio_gpu_agent/plugin/cdi.h"

#include <fstream>
#include <sstream>

#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "support/sysfs_tree.h"

namespace vfio_agent::plugin {
namespace {

ResourceDevices OneGpu() {
  ResourceDevices r;
  r.resource_name = "nvidia.com/GA102GL_A10";
  PluginDevice d;
  d.id = "0000:3b:00.0";
  d.healthy = true;
  d.iommu_group = 73;
  d.vfio_cdevs = {"vfio4"};
  r.devices.push_back(d);
  return r;
}

TEST(CdiTest, SpecNamesEveryDeviceWithItsNodes) {
  google::protobuf::Struct spec;
  const std::string json = CdiSpecJson(OneGpu(), /*iommufd=*/true);
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &spec).ok()) << json;
  EXPECT_EQ(spec.fields().at("kind").string_value(), "nvidia.com/GA102GL_A10");
  EXPECT_EQ(spec.fields().at("cdiVersion").string_value(), "0.3.0");
  const auto& devices = spec.fields().at("devices").list_value();
  ASSERT_EQ(devices.values_size(), 1);
  const auto& device = devices.values(0).struct_value();
  EXPECT_EQ(device.fields().at("name").string_value(), "0000:3b:00.0");
  const auto& nodes = device.fields().at("containerEdits").struct_value().fields().at("deviceNodes").list_value();
  std::vector<std::string> paths;
  for (const auto& node : nodes.values()) paths.push_back(node.struct_value().fields().at("path").string_value());
  EXPECT_THAT(paths, ::testing::ElementsAre("/dev/vfio/devices/vfio4", "/dev/vfio/vfio", "/dev/vfio/73", "/dev/iommu"));
  EXPECT_EQ(json, CdiSpecJson(OneGpu(), true));  // deterministic bytes
}

TEST(CdiTest, WritesAtomicallyIntoTheDirectory) {
  testing::TempDir dir;
  ASSERT_TRUE(WriteCdiSpec(dir.path() / "cdi", OneGpu(), false).ok());
  const auto path = CdiSpecPath(dir.path() / "cdi", "nvidia.com/GA102GL_A10");
  EXPECT_EQ(path.filename(), "vfio-gpu-agent_nvidia.com_GA102GL_A10.json");
  std::ifstream in(path);
  std::stringstream content;
  content << in.rdbuf();
  EXPECT_EQ(content.str(), CdiSpecJson(OneGpu(), false));
  EXPECT_FALSE(std::filesystem::exists(path.string() + ".tmp"));
}

}  // namespace
}  // namespace vfio_agent::plugin
