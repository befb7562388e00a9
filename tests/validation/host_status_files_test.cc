// The GPU Operator status files: both written atomically while layers 1-2 pass, vfio-pci-ready removed when
// they stop passing, nothing else in the directory touched.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <fstream>

#include "support/sysfs_tree.h"
#include "vfio_gpu_agent/common/fs.h"
#include "vfio_gpu_agent/validation/check.h"
#include "vfio_gpu_agent/validation/validate.h"

namespace vfio_agent::validation {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> Names(const std::filesystem::path& dir) { return fs::ListDir(dir).value_or(std::vector<std::string>{}); }

struct timespec Mtime(const std::filesystem::path& path) {
  struct stat st {};
  ::stat(path.c_str(), &st);
  return st.st_mtim;
}

TEST(HostStatusFilesTest, ReadyWritesBothFilesAndLeavesOthersAlone) {
  vfio_agent::testing::TempDir dir;
  std::ofstream(dir.path() / "toolkit-ready") << "operator's\n";
  const struct timespec before = Mtime(dir.path() / "toolkit-ready");

  ASSERT_TRUE(WriteStatusFiles(dir.path(), true).ok());
  EXPECT_THAT(Names(dir.path()), ElementsAre("toolkit-ready", "vfio-pci-ready", "workload-type"));
  std::ifstream workload(dir.path() / "workload-type");
  std::string content((std::istreambuf_iterator<char>(workload)), std::istreambuf_iterator<char>());
  EXPECT_EQ(content, "vm-passthrough\n");
  EXPECT_EQ(std::filesystem::file_size(dir.path() / "vfio-pci-ready"), 0u);
  EXPECT_EQ(fs::ReadTrimmed(dir.path() / "toolkit-ready").value_or(""), "operator's");
  const struct timespec after = Mtime(dir.path() / "toolkit-ready");
  EXPECT_EQ(before.tv_sec, after.tv_sec);
  EXPECT_EQ(before.tv_nsec, after.tv_nsec);
}

TEST(HostStatusFilesTest, NotReadyRemovesTheReadyFileAndKeepsTheWorkloadType) {
  vfio_agent::testing::TempDir dir;
  ASSERT_TRUE(WriteStatusFiles(dir.path(), true).ok());
  ASSERT_TRUE(WriteStatusFiles(dir.path(), false).ok());
  EXPECT_THAT(Names(dir.path()), ElementsAre("workload-type"));
  ASSERT_TRUE(WriteStatusFiles(dir.path(), false).ok());  // already gone: no error
  ASSERT_TRUE(WriteStatusFiles(dir.path(), true).ok());   // and back
  EXPECT_THAT(Names(dir.path()), ElementsAre("vfio-pci-ready", "workload-type"));
}

TEST(HostStatusFilesTest, UnchangedFilesAreNotRewritten) {
  vfio_agent::testing::TempDir dir;
  ASSERT_TRUE(WriteStatusFiles(dir.path(), true).ok());
  struct stat first {};
  ::stat((dir.path() / "workload-type").c_str(), &first);
  ASSERT_TRUE(WriteStatusFiles(dir.path(), true).ok());
  struct stat second {};
  ::stat((dir.path() / "workload-type").c_str(), &second);
  EXPECT_EQ(first.st_ino, second.st_ino);  // a rewrite would have renamed a new inode into place
}

TEST(HostStatusFilesTest, WrongWorkloadTypeIsReplacedAtomically) {
  vfio_agent::testing::TempDir dir;
  std::ofstream(dir.path() / "workload-type") << "container\n";
  ASSERT_TRUE(WriteStatusFiles(dir.path(), false).ok());
  EXPECT_EQ(fs::ReadTrimmed(dir.path() / "workload-type").value_or(""), "vm-passthrough");
  EXPECT_THAT(Names(dir.path()), ElementsAre("workload-type"));  // no temporary file left behind
}

// The mode switch in both directions: each mode's files replace the other's (issue 19), as the GPU Operator's
// vgpu-manager and vgpu-devices validators write them (empty files, workload-type "vm-vgpu\n").
TEST(HostStatusFilesTest, VgpuFilesReplaceThePassthroughOnesAndFollowReadiness) {
  vfio_agent::testing::TempDir dir;
  ASSERT_TRUE(WriteStatusFiles(dir.path(), true).ok());
  ASSERT_TRUE(WriteVgpuStatusFiles(dir.path(), true, false).ok());
  EXPECT_THAT(Names(dir.path()), ElementsAre("vgpu-manager-ready", "workload-type"));
  std::ifstream workload(dir.path() / "workload-type");
  std::string content((std::istreambuf_iterator<char>(workload)), std::istreambuf_iterator<char>());
  EXPECT_EQ(content, "vm-vgpu\n");
  ASSERT_TRUE(WriteVgpuStatusFiles(dir.path(), true, true).ok());
  EXPECT_THAT(Names(dir.path()), ElementsAre("vgpu-devices-ready", "vgpu-manager-ready", "workload-type"));
  EXPECT_EQ(std::filesystem::file_size(dir.path() / "vgpu-devices-ready"), 0u);
  ASSERT_TRUE(WriteVgpuStatusFiles(dir.path(), false, true).ok());  // no devices are ready without their manager
  EXPECT_THAT(Names(dir.path()), ElementsAre("workload-type"));
  ASSERT_TRUE(WriteStatusFiles(dir.path(), true).ok());
  EXPECT_EQ(fs::ReadTrimmed(dir.path() / "workload-type").value_or(""), "vm-passthrough");
}

TEST(HostStatusFilesTest, CreatesTheDirectoryAndReportsAnUnusableOne) {
  vfio_agent::testing::TempDir dir;
  ASSERT_TRUE(WriteStatusFiles(dir.path() / "run/nvidia/validations", true).ok());
  EXPECT_THAT(Names(dir.path() / "run/nvidia/validations"), ElementsAre("vfio-pci-ready", "workload-type"));

  std::ofstream(dir.path() / "a-file") << "x";
  const absl::Status status = WriteStatusFiles(dir.path() / "a-file", true);
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("a-file"));
}

TEST(HostStatusFilesTest, ParseLayersAcceptsNamesAndAll) {
  auto layers = ParseLayers("platform, devices");
  ASSERT_TRUE(layers.ok());
  EXPECT_THAT(*layers, ElementsAre(Layer::kPlatform, Layer::kDevices));
  EXPECT_EQ(ParseLayers("all")->size(), 8u);
  EXPECT_TRUE(ParseLayers("fabric")->contains(Layer::kFabric));
  EXPECT_TRUE(ParseLayers("vgpu")->contains(Layer::kVgpu));
  EXPECT_TRUE(ParseLayers("api")->contains(Layer::kApi));
  EXPECT_FALSE(ParseLayers("platform,firmware").ok());
  EXPECT_FALSE(ParseLayers("").ok());
}

}  // namespace
}  // namespace vfio_agent::validation
