#include "vfio_gpu_agent/cli/flags.h"

#include <gtest/gtest.h>

#include <map>

#include "vfio_gpu_agent/cli/common_options.h"

namespace vfio_agent::cli {
namespace {

std::vector<FlagSpec> Specs() {
  return {{"sysfs-root", "DIR", "", "/sys"}, {"json", "", "", ""}, {"resource-name", "X", "", "", true}};
}

struct FakeEnv {
  std::map<std::string, std::string> vars;
  std::function<const char*(const char*)> fn() {
    return [this](const char* name) -> const char* {
      auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  }
};

TEST(FlagsTest, ParsesBothValueFormsAndSwitches) {
  FlagValues values;
  bool help = true;
  FakeEnv env;
  ASSERT_TRUE(ParseFlags({"--sysfs-root=/tmp/a", "--json", "pos"}, Specs(), &values, &help, env.fn()).ok());
  EXPECT_FALSE(help);
  EXPECT_EQ(values.Get("sysfs-root"), "/tmp/a");
  EXPECT_TRUE(values.GetBool("json"));
  ASSERT_EQ(values.positional().size(), 1u);
  EXPECT_EQ(values.positional()[0], "pos");

  FlagValues spaced;
  ASSERT_TRUE(ParseFlags({"--sysfs-root", "/tmp/b", "--no-json"}, Specs(), &spaced, &help, env.fn()).ok());
  EXPECT_EQ(spaced.Get("sysfs-root"), "/tmp/b");
  EXPECT_FALSE(spaced.GetBool("json"));
}

TEST(FlagsTest, RejectsUnknownMissingValueAndRepeatOfSingleFlag) {
  FlagValues values;
  bool help = false;
  FakeEnv env;
  EXPECT_EQ(ParseFlags({"--bogus"}, Specs(), &values, &help, env.fn()).code(), absl::StatusCode::kInvalidArgument);
  FlagValues v2;
  auto missing = ParseFlags({"--sysfs-root"}, Specs(), &v2, &help, env.fn());
  EXPECT_NE(missing.message().find("needs a value"), std::string_view::npos) << missing;
  FlagValues v3;
  EXPECT_FALSE(ParseFlags({"--sysfs-root=a", "--sysfs-root=b"}, Specs(), &v3, &help, env.fn()).ok());
  FlagValues v4;
  EXPECT_FALSE(ParseFlags({"--json=maybe"}, Specs(), &v4, &help, env.fn()).ok());
}

TEST(FlagsTest, EnvironmentFillsAbsentFlagsAndCommandLineWins) {
  FakeEnv env;
  env.vars["VFIO_GPU_AGENT_SYSFS_ROOT"] = "/env/sys";
  env.vars["VFIO_GPU_AGENT_JSON"] = "true";
  env.vars["VFIO_GPU_AGENT_RESOURCE_NAME"] = "10de:2335=A, 10de:2236=B";
  FlagValues values;
  bool help = false;
  ASSERT_TRUE(ParseFlags({}, Specs(), &values, &help, env.fn()).ok());
  EXPECT_EQ(values.Get("sysfs-root"), "/env/sys");
  EXPECT_TRUE(values.GetBool("json"));
  EXPECT_EQ(values.All("resource-name"), (std::vector<std::string>{"10de:2335=A", "10de:2236=B"}));

  FlagValues cli;
  ASSERT_TRUE(ParseFlags({"--sysfs-root=/cli"}, Specs(), &cli, &help, env.fn()).ok());
  EXPECT_EQ(cli.Get("sysfs-root"), "/cli");
}

TEST(FlagsTest, EnvVarNameAndHelp) {
  EXPECT_EQ(EnvVarName("sysfs-root"), "VFIO_GPU_AGENT_SYSFS_ROOT");
  std::string help = FormatHelp("inspect", "summary", Specs());
  EXPECT_NE(help.find("--sysfs-root DIR"), std::string::npos);
  EXPECT_NE(help.find("VFIO_GPU_AGENT_SYSFS_ROOT"), std::string::npos);
  EXPECT_NE(help.find("(default: /sys)"), std::string::npos);
}

TEST(CommonOptionsTest, BuildsPolicyAndRootsFromFlags) {
  FlagValues values;
  bool help = false;
  FakeEnv env;
  ASSERT_TRUE(ParseFlags({"--vendor=0x1af4", "--classes=02,0c03", "--sysfs-root=/s", "--resource-name=10de:2335=X"},
                         CommonFlagSpecs(), &values, &help, env.fn())
                  .ok());
  auto options = CommonOptionsFromFlags(values);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->policy.vendor_id, 0x1af4);
  ASSERT_EQ(options->policy.classes.size(), 2u);
  EXPECT_TRUE(options->policy.classes[0].Matches(0x020000));
  EXPECT_TRUE(options->policy.classes[1].Matches(0x0c0330));
  EXPECT_FALSE(options->policy.classes[1].Matches(0x0c8000));
  EXPECT_EQ(options->paths.sysfs_root, "/s");
  EXPECT_EQ(options->paths.dev_root, "/dev");
  ASSERT_EQ(options->name_overrides.size(), 1u);
  EXPECT_EQ(options->name_overrides[0].device_id, 0x2335);
}

TEST(CommonOptionsTest, RejectsBadVendor) {
  for (const char* bad : {"--vendor=xyz", "--vendor=12345", "--vendor="}) {
    FlagValues values;
    bool help = false;
    FakeEnv env;
    ASSERT_TRUE(ParseFlags({bad}, CommonFlagSpecs(), &values, &help, env.fn()).ok());
    EXPECT_FALSE(CommonOptionsFromFlags(values).ok()) << bad;
  }
}

// Issue 9: a --resource-domain the kubelet would refuse is a usage error at start, not a Register that fails
// forever; a good one is kept as given.
TEST(CommonOptionsTest, RejectsAnInvalidResourceDomain) {
  for (const char* bad : {"--resource-domain=Bad_Domain", "--resource-domain=gpu.kubernetes.io",
                          "--resource-domain=requests.example.com", "--resource-domain=", "--resource-domain=a..b"}) {
    FlagValues values;
    bool help = false;
    FakeEnv env;
    ASSERT_TRUE(ParseFlags({bad}, CommonFlagSpecs(), &values, &help, env.fn()).ok());
    absl::StatusOr<CommonOptions> options = CommonOptionsFromFlags(values);
    EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(options.status().message().find("--resource-domain"), std::string::npos) << options.status();
  }
  FlagValues values;
  bool help = false;
  FakeEnv env;
  ASSERT_TRUE(ParseFlags({"--resource-domain=gpu.example.io"}, CommonFlagSpecs(), &values, &help, env.fn()).ok());
  absl::StatusOr<CommonOptions> options = CommonOptionsFromFlags(values);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->resource_domain, "gpu.example.io");
}

// An override file that is not a regular file is refused with its path, not read forever or waited on.
TEST(CommonOptionsTest, RejectsAnOverrideFileThatIsNotARegularFile) {
  FlagValues values;
  bool help = false;
  FakeEnv env;
  ASSERT_TRUE(ParseFlags({"--resource-name-file=/dev/zero"}, CommonFlagSpecs(), &values, &help, env.fn()).ok());
  absl::StatusOr<CommonOptions> options = CommonOptionsFromFlags(values);
  EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(options.status().message().find("/dev/zero"), std::string::npos) << options.status();
}

}  // namespace
}  // namespace vfio_agent::cli
