// Inputs tests/fuzz/fuzz_kubevirt_cr found that made yaml-cpp 0.7 loop forever inside ParseKubevirtCr: each must
// now be refused at once, while kubectl's own YAML and JSON still parse.
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kubevirt_cr.h"

namespace vfio_agent::validation {
namespace {

TEST(KubevirtCrFuzzRegression, TextsThatHungYamlCppAreRefused) {
  const std::string hung[] = {
      ",k",                                               // flow entry as the first token
      "{a: 1}, x",                                        // after a top-level flow collection
      "\"x\",",                                           // after a top-level quoted scalar
      std::string("\0\0\0, x", 6),                        // NULs, which yaml-cpp skips
      "!,",                                               // after a tag
      "a: 1\n---\n  name: x\n!, y\n",                      // after a tag on a later line of a document
      // a ',' line after flows left open in earlier documents
      "ad\n-apiVeruioe bnuk:vir\xf3[io/v2\n{iirt\nmet[d\n---\n  nam,ert\nmet[d\n---\n  na:irt\nmet[d\n---\n"
      "  name: kubevirt\n , name",
      "kind: KubeVirt\nmetadata:\n  name: kubevirt\n  , namespace: kubevirt\n",  // a line starting with ','
      "{\"apiVersion\": v1\", \"kind\"}, \"spec\": {}",  // a quote inside a plain scalar, then ','
  };
  for (const std::string& text : hung) {
    auto cr = ParseKubevirtCr(text);
    ASSERT_FALSE(cr.ok()) << text;
    EXPECT_EQ(cr.status().code(), absl::StatusCode::kInvalidArgument) << text;
  }
}

TEST(KubevirtCrFuzzRegression, KubectlYamlAndJsonStillParse) {
  const std::string yaml =
      "apiVersion: kubevirt.io/v1\nkind: KubeVirt\nmetadata:\n  name: kubevirt\n  namespace: kubevirt\n"
      "  annotations:\n    note: |\n      a, b\n      , c\nspec:\n  configuration:\n    permittedHostDevices:\n"
      "      pciHostDevices:\n      - pciVendorSelector: \"10DE:2335\"\n"
      "        resourceName: nvidia.com/GH100_H200_SXM_141GB  # pinned\n        externalResourceProvider: true\n";
  auto from_yaml = ParseKubevirtCr(yaml);
  ASSERT_TRUE(from_yaml.ok()) << from_yaml.status();
  ASSERT_EQ(from_yaml->pci_host_devices.size(), 1u);
  EXPECT_EQ(from_yaml->pci_host_devices[0].resource_name, "nvidia.com/GH100_H200_SXM_141GB");

  const std::string json =
      "{\"apiVersion\":\"v1\",\"kind\":\"List\",\"items\":[{\"apiVersion\":\"kubevirt.io/v1\",\"kind\":\"KubeVirt\","
      "\"metadata\":{\"name\":\"kubevirt\",\"namespace\":\"kubevirt\"},\"spec\":{\"configuration\":"
      "{\"permittedHostDevices\":{\"pciHostDevices\":[{\"pciVendorSelector\":\"10DE:26B9\","
      "\"resourceName\":\"nvidia.com/AD102GL_L40S\"}]}}}}]}\n";
  auto from_json = ParseKubevirtCr(json);
  ASSERT_TRUE(from_json.ok()) << from_json.status();
  ASSERT_EQ(from_json->pci_host_devices.size(), 1u);
  EXPECT_EQ(from_json->pci_host_devices[0].pci_vendor_selector, "10DE:26B9");
}

}  // namespace
}  // namespace vfio_agent::validation
