#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "vfio_gpu_agent/names/resource_names.h"

namespace vfio_agent::names {
namespace {

using ::testing::HasSubstr;

struct SlugCase {
  const char* pci_ids_name;
  const char* slug;
};

class SlugTest : public ::testing::TestWithParam<SlugCase> {};

TEST_P(SlugTest, MatchesPeerPlugin) { EXPECT_EQ(Slug(GetParam().pci_ids_name), GetParam().slug); }

INSTANTIATE_TEST_SUITE_P(
    Examples, SlugTest,
    ::testing::Values(SlugCase{"GA102GL [A10]", "GA102GL_A10"}, SlugCase{"TU104GL [Tesla T4]", "TU104GL_TESLA_T4"},
                      SlugCase{"GA100GL [A30 PCIe]", "GA100GL_A30_PCIE"},
                      SlugCase{"GH100 [H200 SXM 141GB]", "GH100_H200_SXM_141GB"},
                      // '/' becomes '_' before whitespace runs collapse, so " / " is three '_'.
                      SlugCase{"GH100 [GH200 120GB / 480GB]", "GH100_GH200_120GB___480GB"},
                      SlugCase{"GA107GL [A2 / A16]", "GA107GL_A2___A16"},
                      SlugCase{"GA100 [A100-SXM-64GB]", "GA100_A100SXM64GB"},
                      SlugCase{"GH100[H100 SXM5 80GB]", "GH100H100_SXM5_80GB"},
                      SlugCase{"NF200 PCIe 2.0 switch", "NF200_PCIE_2_0_SWITCH"},
                      SlugCase{"  A \t\t B  ", "A_B"},
                      // Dropped characters split whitespace runs, as in the peer (collapse before drop).
                      SlugCase{"A ( B", "A__B"},
                      SlugCase{"GA104 [RTX A4500 Embedded GPU ]", "GA104_RTX_A4500_EMBEDDED_GPU_"},
                      SlugCase{"x_y+z,'w'", "X_YZW"}, SlugCase{"[]()", ""}, SlugCase{"", ""}));

TEST(ValidateExtendedResourceNameTest, AcceptsKubeletExamples) {
  for (const char* name : {"example.com/foo", "nvidia.com/GP102GL_TESLA_P40", "kubernetes.io.example.com/x",
                           "nvidia.com/a", "nvidia.com/A-b.c_9", "a/b"}) {
    EXPECT_TRUE(ValidateExtendedResourceName(name).ok()) << name;
  }
}

TEST(ValidateExtendedResourceNameTest, RejectsKubeletExamples) {
  for (const char* name : {"foo", "kubernetes.io/foo", "gpu.kubernetes.io/foo", "requests.example.com/foo",
                           "Example.com/foo", "example.com/", "example.com/a/b", "/foo", "nvidia.com/_A",
                           "nvidia.com/A_", "nvidia.com/A B", "nvidia.com/A[1]", "-nvidia.com/A", "nvidia..com/A",
                           "nvidia_com/A"}) {
    absl::Status status = ValidateExtendedResourceName(name);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(status.message(), HasSubstr(name));
  }
}

TEST(ValidateExtendedResourceNameTest, NamePartLengthLimitIs63) {
  EXPECT_TRUE(ValidateExtendedResourceName("nvidia.com/" + std::string(63, 'A')).ok());
  absl::Status too_long = ValidateExtendedResourceName("nvidia.com/" + std::string(64, 'A'));
  EXPECT_EQ(too_long.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_long.message(), HasSubstr("64 characters"));
}

TEST(ValidateExtendedResourceNameTest, DomainLengthLimitIs244) {
  auto domain_of_length = [](size_t n) {
    std::string domain;
    for (size_t i = 0; i + 1 < n; ++i) domain.push_back(i % 2 == 0 ? 'a' : '.');
    return domain + "b";
  };
  ASSERT_EQ(domain_of_length(244).size(), 244u);
  EXPECT_TRUE(ValidateExtendedResourceName(domain_of_length(244) + "/x").ok());
  EXPECT_FALSE(ValidateExtendedResourceName(domain_of_length(245) + "/x").ok());
}

TEST(ValidateResourceDomainTest, ChecksTheDomainAlone) {
  EXPECT_TRUE(ValidateResourceDomain("nvidia.com").ok());
  EXPECT_TRUE(ValidateResourceDomain("gpu.example-corp.io").ok());
  EXPECT_FALSE(ValidateResourceDomain("").ok());
  EXPECT_FALSE(ValidateResourceDomain("NVIDIA.com").ok());
  EXPECT_FALSE(ValidateResourceDomain("gpu.kubernetes.io").ok());
  EXPECT_FALSE(ValidateResourceDomain("requests.nvidia.com").ok());
  EXPECT_FALSE(ValidateResourceDomain("nvidia.com/").ok());
}

TEST(ValidateResourceNamePartTest, ChecksTheNameAlone) {
  EXPECT_TRUE(ValidateResourceNamePart("GH100_H200_SXM_141GB").ok());
  EXPECT_TRUE(ValidateResourceNamePart("26b5").ok());
  EXPECT_FALSE(ValidateResourceNamePart("").ok());
  EXPECT_FALSE(ValidateResourceNamePart("GA104_RTX_A4500_EMBEDDED_GPU_").ok());
  EXPECT_FALSE(ValidateResourceNamePart("a/b").ok());
}

TEST(KubevirtEnvNameTest, UpperCasesAndReplacesSlashAndDot) {
  EXPECT_EQ(KubevirtEnvName("nvidia.com/GA102GL_A10"), "PCI_RESOURCE_NVIDIA_COM_GA102GL_A10");
  EXPECT_EQ(KubevirtEnvName("nvidia.com/GH100_H200_SXM_141GB"), "PCI_RESOURCE_NVIDIA_COM_GH100_H200_SXM_141GB");
  EXPECT_EQ(KubevirtEnvName("nvidia.com/26b5"), "PCI_RESOURCE_NVIDIA_COM_26B5");
  // KubeVirt keeps other characters such as '-'.
  EXPECT_EQ(KubevirtEnvName("gpu.example.io/a-b.c"), "PCI_RESOURCE_GPU_EXAMPLE_IO_A-B_C");
}

TEST(PinnedNamesTest, IsCozystacksTableVerbatim) {
  const std::map<uint16_t, std::string> expected = {
      {0x2335, "GH100_H200_SXM_141GB"},         {0x2330, "GH100_H100_SXM5_80GB"},
      {0x2331, "GH100_H100_PCIE"},              {0x2321, "GH100_H100L_94GB"},
      {0x26b9, "AD102GL_L40S"},                 {0x26b5, "AD102GL_L40"},
      {0x27b8, "AD104GL_L4"},                   {0x20b2, "GA100_A100_SXM4_80GB"},
      {0x20b0, "GA100_A100_SXM4_40GB"},         {0x20b5, "GA100_A100_PCIE_80GB"},
      {0x20f1, "GA100_A100_PCIE_40GB"},         {0x20b7, "GA100GL_A30_PCIE"},
      {0x2235, "GA102GL_A40"},                  {0x2236, "GA102GL_A10"},
      {0x1eb8, "TU104GL_TESLA_T4"},             {0x1db1, "GV100GL_TESLA_V100_SXM2_16GB"},
      {0x1db5, "GV100GL_TESLA_V100_SXM2_32GB"}, {0x1db4, "GV100GL_TESLA_V100_PCIE_16GB"},
      {0x1df6, "GV100GL_TESLA_V100S_PCIE_32GB"},
  };
  EXPECT_EQ(PinnedNames(), expected);
  for (const auto& [device, name] : PinnedNames()) {
    EXPECT_TRUE(ValidateExtendedResourceName("nvidia.com/" + name).ok()) << name;
  }
}

TEST(NameSourceNameTest, NamesEverySource) {
  EXPECT_STREQ(NameSourceName(NameSource::kOverride), "override");
  EXPECT_STREQ(NameSourceName(NameSource::kPinned), "pinned");
  EXPECT_STREQ(NameSourceName(NameSource::kPciIds), "pci.ids");
  EXPECT_STREQ(NameSourceName(NameSource::kDeviceId), "device-id");
}

}  // namespace
}  // namespace vfio_agent::names
