#include "vfio_gpu_agent/kube/claim_routing.h"

#include <string>

#include "gtest/gtest.h"

namespace vfio_agent::kube {
namespace {

TEST(Sha256Test, KnownDigests) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // 119 bytes: the padding spills into a second block.
  EXPECT_EQ(Sha256Hex(std::string(119, 'q')), "c8bc8a6e9626586bb888ad131d44ed2bd37fc608e902904ade3c566c4208e6ca");
}

TEST(ClaimNodeLabelValueTest, AValidLabelValueIsTheNodeName) {
  EXPECT_EQ(ClaimNodeLabelValue("gpu-node-1"), "gpu-node-1");
  EXPECT_EQ(ClaimNodeLabelValue("node.example.com"), "node.example.com");
  EXPECT_EQ(ClaimNodeLabelValue(std::string(63, 'a')), std::string(63, 'a'));
}

TEST(ClaimNodeLabelValueTest, ALongNodeNameIsHashed) {
  // Digests from Python's hashlib, the router's and the agent's rule in one place.
  const std::string long_name = std::string(64, 'a') + ".example.com";
  EXPECT_EQ(ClaimNodeLabelValue(long_name), "h-c29954a80b6a8191369c4b6ec438c54facd2175e");
  EXPECT_EQ(ClaimNodeLabelValue(std::string(200, 'x')), "h-aa20c23e3201834050679e1d88941b9a6fed0557");
  EXPECT_TRUE(IsValidLabelValue(ClaimNodeLabelValue(long_name)));
  EXPECT_EQ(ClaimNodeLabelValue(""), "h-" + Sha256Hex("").substr(0, 40));
}

TEST(ClaimNodeLabelValueTest, InvalidCharactersAreHashed) {
  EXPECT_EQ(ClaimNodeLabelValue("-node"), "h-" + Sha256Hex("-node").substr(0, 40));
  EXPECT_EQ(ClaimNodeLabelValue("node/1"), "h-" + Sha256Hex("node/1").substr(0, 40));
}

TEST(IsValidLabelValueTest, ApimachineryRules) {
  EXPECT_TRUE(IsValidLabelValue(""));
  EXPECT_TRUE(IsValidLabelValue("a_b.c-d"));
  EXPECT_FALSE(IsValidLabelValue("a_"));
  EXPECT_FALSE(IsValidLabelValue(std::string(64, 'a')));
  EXPECT_FALSE(IsValidLabelValue("a b"));
}

}  // namespace
}  // namespace vfio_agent::kube
