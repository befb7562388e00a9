#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "names_testdata.h"
#include "vfio_gpu_agent/names/resource_names.h"

namespace vfio_agent::names {
namespace {

using ::testing::HasSubstr;


TEST(ParseOverrideTest, ParsesVendorDeviceAndName) {
  absl::StatusOr<NameOverride> o = ParseOverride("10de:2335=GH100_H200_SXM_141GB");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->vendor_id, 0x10de);
  EXPECT_EQ(o->device_id, 0x2335);
  EXPECT_EQ(o->name, "GH100_H200_SXM_141GB");
}

TEST(ParseOverrideTest, AcceptsUpperCaseHexAndSpaces) {
  absl::StatusOr<NameOverride> o = ParseOverride(" 10DE:26B9 = L40S ");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->vendor_id, 0x10de);
  EXPECT_EQ(o->device_id, 0x26b9);
  EXPECT_EQ(o->name, "L40S");
}

TEST(ParseOverrideTest, KeepsNamesTheResolverMustRepair) {
  // Validity is checked (and reported) by the resolver, like derived names.
  absl::StatusOr<NameOverride> o = ParseOverride("10de:2335=bad name_");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->name, "bad name_");
}

TEST(ParseOverrideTest, RejectsMalformedText) {
  for (const char* text : {"", "10de:2335", "10de=FOO", "10de:2335:1=FOO", "10dex:2335=FOO", "10de:12345=FOO",
                           "10de:=FOO", ":2335=FOO", "10de:2335=", "10de:2335=  ", "10de:2335=nvidia.com/FOO"}) {
    absl::StatusOr<NameOverride> o = ParseOverride(text);
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(o.status().message(), HasSubstr(text));
  }
  EXPECT_THAT(ParseOverride("10de:2335=nvidia.com/FOO").status().message(), HasSubstr("without the domain"));
}

TEST(LoadOverrideFileTest, ReadsLinesSkippingCommentsAndBlanks) {
  absl::StatusOr<std::vector<NameOverride>> overrides = LoadOverrideFile(testdata::kDir / "overrides.txt");
  ASSERT_TRUE(overrides.ok()) << overrides.status();
  ASSERT_EQ(overrides->size(), 2u);
  EXPECT_EQ((*overrides)[0].device_id, 0x2335);
  EXPECT_EQ((*overrides)[0].name, "H200");
  EXPECT_EQ((*overrides)[1].device_id, 0x26b9);
  EXPECT_EQ((*overrides)[1].name, "L40S_CUSTOM");
}

TEST(LoadOverrideFileTest, ErrorNamesPathAndLine) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("va_names_overrides_" + std::to_string(::getpid()));
  std::ofstream(path) << "# header\n10de:2335=OK\n\n10de-2236=BROKEN\n";
  absl::StatusOr<std::vector<NameOverride>> overrides = LoadOverrideFile(path);
  std::filesystem::remove(path);
  EXPECT_EQ(overrides.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(overrides.status().message(), HasSubstr(path.string() + ":4:"));
  EXPECT_THAT(overrides.status().message(), HasSubstr("10de-2236=BROKEN"));
}

TEST(LoadOverrideFileTest, FifoAndDeviceAreRefusedWithoutBlocking) {
  const std::filesystem::path fifo =
      std::filesystem::temp_directory_path() / ("va_overrides_fifo_" + std::to_string(::getpid()));
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  absl::StatusOr<std::vector<NameOverride>> piped = LoadOverrideFile(fifo);
  std::filesystem::remove(fifo);
  EXPECT_EQ(piped.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(piped.status().message(), HasSubstr("FIFO"));
  absl::StatusOr<std::vector<NameOverride>> zero = LoadOverrideFile("/dev/zero");
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(zero.status().message(), HasSubstr("/dev/zero"));
}

TEST(LoadOverrideFileTest, MissingFileIsNotFoundWithThePath) {
  const std::filesystem::path path = testdata::kDir / "no-such-overrides.txt";
  absl::StatusOr<std::vector<NameOverride>> overrides = LoadOverrideFile(path);
  EXPECT_EQ(overrides.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(overrides.status().message(), HasSubstr(path.string()));
}

}  // namespace
}  // namespace vfio_agent::names
