#include "vfio_gpu_agent/cli/flags.h"

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "support/sysfs_tree.h"

#include "vfio_gpu_agent/cli/commands.h"
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

// A --pci-ids the user named is used or refused, never quietly replaced: a name must not depend on whether
// that file happened to be readable.
TEST(CommonOptionsTest, NamedPciIdsThatCannotBeReadIsAUsageError) {
  vfio_agent::testing::TempDir dir;
  const std::filesystem::path fifo = dir.path() / "pci.ids.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::filesystem::path empty = dir.path() / "empty.ids";
  std::ofstream(empty) << "";
  for (const std::string& bad : {std::string("/dev/zero"), fifo.string(), (dir.path() / "missing.ids").string(),
                                 dir.path().string(), empty.string()}) {
    FlagValues values;
    bool help = false;
    FakeEnv env;
    ASSERT_TRUE(ParseFlags({"--pci-ids=" + bad}, CommonFlagSpecs(), &values, &help, env.fn()).ok());
    absl::StatusOr<CommonOptions> options = CommonOptionsFromFlags(values);
    EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(options.status().message().find("--pci-ids " + bad), std::string::npos) << options.status();
  }
}

TEST(CommonOptionsTest, NamedPciIdsIsLoadedOnceAndServesEveryCommand) {
  vfio_agent::testing::TempDir dir;
  const std::filesystem::path ids = dir.path() / "pci.ids";
  std::ofstream(ids) << "10de  NVIDIA Corporation\n\t2236  GA102GL [A10]\n";
  FlagValues values;
  bool help = false;
  FakeEnv env;
  ASSERT_TRUE(ParseFlags({"--pci-ids=" + ids.string()}, CommonFlagSpecs(), &values, &help, env.fn()).ok());
  absl::StatusOr<CommonOptions> options = CommonOptionsFromFlags(values);
  ASSERT_TRUE(options.ok()) << options.status();
  ASSERT_NE(options->named_pci_ids, nullptr);
  EXPECT_EQ(LoadNameDatabase(*options), options->named_pci_ids);
  EXPECT_EQ(LazyNameDatabase(*options), options->named_pci_ids);
  EXPECT_EQ(LazyNameDatabase(*options)->DeviceName(0x10de, 0x2236), std::optional<std::string>("GA102GL [A10]"));
}

// The same rule seen from outside, for every command: exit 2 with the path and why.
TEST(CommonOptionsTest, EveryCommandExitsTwoOnAnUnreadableNamedPciIds) {
  for (const char* command : {"inspect", "bind", "unbind --all", "serve", "run", "validate", "kubevirt-config"}) {
    const std::string cmd = absl::StrCat(VFIO_AGENT_BINARY, " ", command, " --pci-ids /dev/zero 2>&1");
    FILE* pipe = popen(cmd.c_str(), "r");
    ASSERT_NE(pipe, nullptr);
    std::string out;
    std::array<char, 4096> buf{};
    size_t n;
    while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
    const int status = pclose(pipe);
    ASSERT_TRUE(WIFEXITED(status)) << command;
    EXPECT_EQ(WEXITSTATUS(status), 2) << command << ": " << out;
    EXPECT_NE(out.find("--pci-ids /dev/zero"), std::string::npos) << command << ": " << out;
    EXPECT_NE(out.find("not a regular file"), std::string::npos) << command << ": " << out;
  }
}

// `serve`'s flags (the DRA ones included) parsed as the command parses them.
absl::StatusOr<ParsedCommand> ParseServe(const std::vector<std::string>& args) {
  std::vector<FlagSpec> specs = CommonFlagSpecs();
  for (FlagSpec& spec : ServeFlags()) specs.push_back(std::move(spec));
  for (FlagSpec& spec : DraFlags()) specs.push_back(std::move(spec));
  specs.push_back({"kubeconfig", "FILE", "", ""});  // as `serve` and `run` add them
  specs.push_back({"node-name", "NAME", "", ""});
  ParsedCommand cmd;
  bool help = false;
  FakeEnv env;
  if (absl::Status parsed = ParseFlags(args, specs, &cmd.flags, &help, env.fn()); !parsed.ok()) return parsed;
  absl::StatusOr<CommonOptions> common = CommonOptionsFromFlags(cmd.flags);
  if (!common.ok()) return common.status();
  cmd.common = *std::move(common);
  return cmd;
}

// --workload: vm-passthrough by default, vm-vgpu carried into serve's options with the catalog under
// --state-dir, anything else a usage error; vm-vgpu has no Fabric Manager mode.
TEST(ServeOptionsTest, WorkloadModeAndStateDir) {
  auto serve_options = [](const std::vector<std::string>& args) -> absl::StatusOr<plugin::ServeOptions> {
    absl::StatusOr<ParsedCommand> cmd = ParseServe(args);
    if (!cmd.ok()) return cmd.status();
    return ServeOptionsFromFlags(*cmd, nullptr);
  };
  absl::StatusOr<plugin::ServeOptions> passthrough = serve_options({});
  ASSERT_TRUE(passthrough.ok()) << passthrough.status();
  EXPECT_EQ(passthrough->workload, Workload::kVmPassthrough);
  absl::StatusOr<plugin::ServeOptions> vgpu = serve_options({"--workload=vm-vgpu", "--state-dir=/var/lib/x"});
  ASSERT_TRUE(vgpu.ok()) << vgpu.status();
  EXPECT_EQ(vgpu->workload, Workload::kVmVgpu);
  EXPECT_EQ(vgpu->vgpu_catalog_file, "/var/lib/x/vgpu-catalog.txt");
  absl::StatusOr<plugin::ServeOptions> bad = serve_options({"--workload=vm-vGPU"});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--workload: workload \"vm-vGPU\": vm-passthrough or vm-vgpu"),
            std::string::npos) << bad.status();
  absl::StatusOr<plugin::ServeOptions> fabric =
      serve_options({"--workload=vm-vgpu", "--fabric-manager=unix:/run/nvidia-fabricmanager/socket"});
  EXPECT_EQ(fabric.status().code(), absl::StatusCode::kInvalidArgument);
}

// The DRA driver's HGX mode takes the device plugin's fabric flags, checked by the same parser.
TEST(ServeOptionsTest, TheDraDriverTakesTheFabricFlags) {
  absl::StatusOr<ParsedCommand> cmd =
      ParseServe({"--kubelet-api=dra", "--fabric-manager=unix:/run/nvidia-fabricmanager/socket",
                  "--fabric-fail-mode=open", "--fabric-library=/opt/libnvfm.so.1", "--fabric-interval=200"});
  ASSERT_TRUE(cmd.ok()) << cmd.status();
  absl::StatusOr<dra::DriverOptions> options = DraOptionsFromFlags(*cmd, nullptr);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->fabric.address, "unix:/run/nvidia-fabricmanager/socket");
  EXPECT_TRUE(options->fabric.fail_open);
  EXPECT_EQ(options->fabric_library, "/opt/libnvfm.so.1");
  EXPECT_EQ(options->fabric_interval, std::chrono::milliseconds(200));
  // The partition table a restarted FM is told from lives in --state-dir.
  EXPECT_EQ(options->fabric.checkpoint, "/var/lib/vfio-gpu-agent/fabric-partitions.txt");
  absl::StatusOr<ParsedCommand> off = ParseServe({"--kubelet-api=dra"});
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(DraOptionsFromFlags(*off, nullptr)->fabric.address, "");
  absl::StatusOr<ParsedCommand> bad = ParseServe({"--kubelet-api=dra", "--fabric-manager=unix:/x", "--nvswitches"});
  ASSERT_TRUE(bad.ok()) << bad.status();
  EXPECT_EQ(DraOptionsFromFlags(*bad, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
}

// --bind-on-prepare binds whole GPUs; on a vm-vgpu node it once moved every GPU of the node (and its vGPUs) on each
// claim. The command line refuses the pair, naming both (issue 31, defect 1).
TEST(ServeOptionsTest, BindOnPrepareIsRefusedOnAVgpuNode) {
  absl::StatusOr<ParsedCommand> cmd = ParseServe({"--kubelet-api=dra", "--bind-on-prepare", "--workload=vm-vgpu"});
  ASSERT_TRUE(cmd.ok()) << cmd.status();
  absl::StatusOr<dra::DriverOptions> options = DraOptionsFromFlags(*cmd, nullptr);
  EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(options.status().message().find("--bind-on-prepare"), std::string::npos) << options.status();
  EXPECT_NE(options.status().message().find("vm-vgpu"), std::string::npos) << options.status();
  absl::StatusOr<ParsedCommand> passthrough = ParseServe({"--kubelet-api=dra", "--bind-on-prepare"});
  ASSERT_TRUE(passthrough.ok()) << passthrough.status();
  EXPECT_TRUE(DraOptionsFromFlags(*passthrough, nullptr).ok());
}

// One rule for the node's name in every command: --node-name, else NODE_NAME; never the host name, which a DRA
// driver once took for its slices' pool while the reporter of the same `run` had no name at all (issue 31,
// defect 11). With an API to write to, no name is a usage error naming both ways to give it.
TEST(ServeOptionsTest, TheDraPoolIsTheNodeNameNeverTheHostName) {
  vfio_agent::testing::TempDir dir;
  std::ofstream(dir.path() / "kubeconfig") << "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
                                           << "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:1'}}]\n"
                                           << "users: [{name: u, user: {token: t}}]\n"
                                           << "contexts: [{name: c, context: {cluster: k, user: u}}]\n";
  const std::string kubeconfig = "--kubeconfig=" + (dir.path() / "kubeconfig").string();
  ::unsetenv("NODE_NAME");
  absl::StatusOr<ParsedCommand> unnamed = ParseServe({"--kubelet-api=dra", kubeconfig});
  ASSERT_TRUE(unnamed.ok()) << unnamed.status();
  absl::StatusOr<dra::DriverOptions> refused = DraOptionsFromFlags(*unnamed, nullptr);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_NE(refused.status().message().find("NODE_NAME"), std::string::npos) << refused.status();
  EXPECT_NE(refused.status().message().find("--node-name"), std::string::npos) << refused.status();

  absl::StatusOr<ParsedCommand> named = ParseServe({"--kubelet-api=dra", kubeconfig, "--node-name=node-a"});
  ASSERT_TRUE(named.ok()) << named.status();
  absl::StatusOr<dra::DriverOptions> options = DraOptionsFromFlags(*named, nullptr);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->node_name, "node-a");
  ::setenv("NODE_NAME", "node-b", 1);
  absl::StatusOr<dra::DriverOptions> downward = DraOptionsFromFlags(*unnamed, nullptr);
  ::unsetenv("NODE_NAME");
  ASSERT_TRUE(downward.ok()) << downward.status();
  EXPECT_EQ(downward->node_name, "node-b");
}

}  // namespace
}  // namespace vfio_agent::cli
