// The static tree's vGPU helpers lay what the FUSE simulator serves: the same links (compared with the
// simulated kernel's own snapshot of the same node) and the same creatable_vgpu_types text.
#include <filesystem>
#include <fstream>
#include <sstream>

#include "gtest/gtest.h"
#include "kernel.h"
#include "node_spec.h"
#include "support/sysfs_tree.h"
#include "tree.h"
#include "vgpu.h"

namespace vfio_agent::testing {
namespace {

namespace stdfs = std::filesystem;

std::string ReadFile(const stdfs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

constexpr const char* kT4Node = R"({"iommu": true, "drivers": ["nvidia", "vfio-pci"], "devices": [
  {"bdf": "0000:3b:00.0", "vendor": "10de", "device": "1eb8", "class": "030200", "iommu_group": 33, "driver": "nvidia",
   "vgpu": {"framework": "mdev", "types": [{"id": "nvidia-230", "name": "GRID T4-1Q", "max_instances": 16}]}}]})";
constexpr const char* kUuid = "c0ffee00-0000-4000-8000-000000000001";

TEST(SysfsTreeVgpuTest, MdevLayoutMatchesTheSimulator) {
  auto node = sim::ParseNode(kT4Node, "inline");
  ASSERT_TRUE(node.ok()) << node.status();
  TempDir sim_dev("sysfs-tree-test-dev");
  sim::Kernel kernel(*node, sim_dev.path());
  ASSERT_TRUE(kernel.Start().ok());
  ASSERT_EQ(kernel.Write(sim::Attr::kMdevCreate, "0000:3b:00.0/nvidia-230", kUuid), 0);
  const auto snapshot = kernel.Snapshot();

  TempDir dir;
  SysfsTree tree(dir.path());
  tree.AddDevice({.bdf = "0000:3b:00.0", .device = 0x1eb8, .driver = "nvidia", .iommu_group = 33});
  tree.AddMdevParent("0000:3b:00.0", {{.id = "nvidia-230", .name = "GRID T4-1Q", .available_instances = 15,
                                       .description = "max_instance=16"}});
  tree.AddMdev({.uuid = kUuid, .parent = "0000:3b:00.0", .type_id = "nvidia-230", .iommu_group = 34});

  const std::string mdev = std::string("/devices/pci0000:3b/0000:3b:00.0/") + kUuid;
  for (const std::string& link :
       {std::string("/class/mdev_bus/0000:3b:00.0"), std::string("/bus/mdev/devices/") + kUuid, mdev + "/mdev_type",
        mdev + "/iommu_group", mdev + "/driver", mdev + "/subsystem",
        std::string("/kernel/iommu_groups/34/devices/") + kUuid,
        std::string("/devices/pci0000:3b/0000:3b:00.0/mdev_supported_types/nvidia-230/devices/") + kUuid}) {
    SCOPED_TRACE(link);
    auto it = snapshot->find(link);
    ASSERT_NE(it, snapshot->end());
    EXPECT_EQ(stdfs::read_symlink(dir.path() / link.substr(1)).string(), it->second.content);
  }
  for (const std::string& file : {std::string("name"), std::string("available_instances"), std::string("device_api"),
                                  std::string("description")}) {
    const std::string path = "/devices/pci0000:3b/0000:3b:00.0/mdev_supported_types/nvidia-230/" + file;
    EXPECT_EQ(ReadFile(dir.path() / path.substr(1)), snapshot->at(path).content) << file;
  }
  EXPECT_EQ(ReadFile(dir.path() / mdev.substr(1) / "uevent"), snapshot->at(mdev + "/uevent").content);

  tree.RemoveMdev(kUuid);
  EXPECT_FALSE(stdfs::exists(dir.path() / "bus/mdev/devices" / kUuid));
  EXPECT_FALSE(stdfs::exists(tree.DeviceDir("0000:3b:00.0") / kUuid));
  EXPECT_FALSE(stdfs::exists(dir.path() / "kernel/iommu_groups/34"));
  EXPECT_TRUE(stdfs::exists(dir.path() / "class/mdev_bus/0000:3b:00.0"));
}

TEST(SysfsTreeVgpuTest, SriovVgpuFilesMatchTheSimulatorsFormat) {
  TempDir dir;
  SysfsTree tree(dir.path());
  tree.AddDevice({.bdf = "0000:86:00.0", .driver = "nvidia", .iommu_group = 77});
  tree.AddDevice({.bdf = "0000:86:00.4", .driver = "nvidia", .iommu_group = 91, .physfn = "0000:86:00.0"});
  tree.SetVgpuCatalog("0000:86:00.0", {{1414, "NVIDIA H200X-1-18C"}, {1428, "NVIDIA H200X-141C"}});
  tree.SetVgpuCatalog("0000:86:00.4", {});
  tree.SetCurrentVgpuType("0000:86:00.4", 1428);

  const sim::VgpuTypeSpec small{"1414", "NVIDIA H200X-1-18C", 7, ""}, whole{"1428", "NVIDIA H200X-141C", 1, ""};
  EXPECT_EQ(ReadFile(tree.DeviceDir("0000:86:00.0") / "nvidia/creatable_vgpu_types"),
            sim::CreatableVgpuTypesText({&small, &whole}));
  EXPECT_EQ(ReadFile(tree.DeviceDir("0000:86:00.0") / "nvidia/creatable_vgpu_types"),
            "ID    : vGPU Name\n1414  : NVIDIA H200X-1-18C\n1428  : NVIDIA H200X-141C\n");
  EXPECT_EQ(ReadFile(tree.DeviceDir("0000:86:00.4") / "nvidia/creatable_vgpu_types"), "ID    : vGPU Name\n");
  EXPECT_EQ(ReadFile(tree.DeviceDir("0000:86:00.4") / "nvidia/current_vgpu_type"), "1428\n");
  EXPECT_EQ(stdfs::read_symlink(tree.DeviceDir("0000:86:00.4") / "physfn").string(), "../0000:86:00.0");
}

}  // namespace
}  // namespace vfio_agent::testing
