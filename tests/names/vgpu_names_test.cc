#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "vfio_gpu_agent/names/resource_names.h"

namespace vfio_agent::names {
namespace {

using ::testing::HasSubstr;

TEST(VgpuResourceNameTest, WhitespaceRunsBecomeOneUnderscoreCaseAndDashKept) {
  EXPECT_EQ(*VgpuResourceName("nvidia.com", "GRID T4-1Q"), "nvidia.com/GRID_T4-1Q");
  EXPECT_EQ(*VgpuResourceName("nvidia.com", "NVIDIA H200X-1-18C"), "nvidia.com/NVIDIA_H200X-1-18C");
  EXPECT_EQ(*VgpuResourceName("nvidia.com", "NVIDIA A10-24Q"), "nvidia.com/NVIDIA_A10-24Q");
  EXPECT_EQ(*VgpuResourceName("nvidia.com", "  GRID \t T4-1Q\n"), "nvidia.com/GRID_T4-1Q");
  EXPECT_EQ(*VgpuResourceName("gpu.example.io", "NVIDIA L40S-1Q"), "gpu.example.io/NVIDIA_L40S-1Q");
}

TEST(VgpuResourceNameTest, ATypeGivingAnInvalidNameIsRefusedNamingIt) {
  absl::StatusOr<std::string> name = VgpuResourceName("nvidia.com", "GRID T4 (1Q)");
  ASSERT_FALSE(name.ok());
  EXPECT_EQ(name.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(name.status().message()), HasSubstr("\"GRID T4 (1Q)\""));
  EXPECT_FALSE(VgpuResourceName("nvidia.com", "   ").ok());
}

TEST(KubevirtMdevEnvNameTest, MdevPrefixUpperCaseDashKept) {
  EXPECT_EQ(KubevirtMdevEnvName("nvidia.com/GRID_T4-1Q"), "MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-1Q");
  EXPECT_EQ(KubevirtMdevEnvName("nvidia.com/NVIDIA_A10-24Q"), "MDEV_PCI_RESOURCE_NVIDIA_COM_NVIDIA_A10-24Q");
  // SR-IOV vGPUs are PCI devices to KubeVirt.
  EXPECT_EQ(KubevirtEnvName("nvidia.com/NVIDIA_H200X-1-18C"), "PCI_RESOURCE_NVIDIA_COM_NVIDIA_H200X-1-18C");
}

}  // namespace
}  // namespace vfio_agent::names
