#include "driver_loader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "support/sysfs_tree.h"

namespace vfio_agent::binding {
namespace {

using ::testing::HasSubstr;

// libkmod is opened on first use, not linked: a lookup in an empty module tree must get as far as libkmod's
// own answer (module not found), which fails with "cannot load modules" if the library could not be opened.
// Nothing is inserted: the tree has no modules.
TEST(LoadModuleTest, OpensLibkmodAndLooksTheModuleUpInTheGivenTree) {
  vfio_agent::testing::TempDir modules("va-modules");
  absl::Status status = LoadModule(modules.path(), "vfio-pci");
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_THAT(status.message(), HasSubstr("vfio-pci"));
  EXPECT_THAT(status.message(), HasSubstr(modules.path().string()));
}

}  // namespace
}  // namespace vfio_agent::binding
