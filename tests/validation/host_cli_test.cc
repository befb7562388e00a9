// `vfio-gpu-agent validate` as a process: exit codes, the human and JSON reports, and the status files.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "host_node.h"

namespace vfio_agent::validation::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

struct AgentRun {
  int exit_code = -1;
  std::string out;
};

AgentRun Agent(const std::string& args) {
  const std::string command = absl::StrCat(VA_AGENT_BIN, " validate ", args, " --log-level error 2>/dev/null");
  AgentRun run;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  char buffer[4096];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) run.out.append(buffer, n);
  const int status = ::pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

std::string Roots(const HostPaths& paths) {
  return absl::StrCat("--sysfs-root ", paths.sysfs_root.string(), " --dev-root ", paths.dev_root.string(),
                      " --proc-root ", paths.proc_root.string(), " --kubelet-dir ", paths.kubelet_dir.string(),
                      " --pod-resources-socket ", paths.pod_resources_socket.string());
}

TEST(HostCliTest, HealthyNodeExitsZeroAndWritesTheStatusFiles) {
  auto node = HostNode::Start(kH200Node);
  ASSERT_TRUE(node.ok()) << node.status();
  ASSERT_TRUE((*node)->BindNvidia(true).ok());
  vfio_agent::testing::TempDir status;
  const AgentRun run = Agent(absl::StrCat(Roots((*node)->paths), " --nvswitches --layers platform,devices --status-dir ",
                                     status.path().string()));
  EXPECT_EQ(run.exit_code, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("\nplatform\n  pass  iommu.enabled"));
  EXPECT_THAT(run.out, HasSubstr("\ndevices\n"));
  EXPECT_THAT(run.out, HasSubstr("0 failed"));
  EXPECT_THAT(run.out, HasSubstr("workload-type, vfio-pci-ready"));
  EXPECT_TRUE(std::filesystem::exists(status.path() / "vfio-pci-ready"));
}

TEST(HostCliTest, BrokenNodeExitsOneWithEvidenceAndFixAndRemovesTheReadyFile) {
  auto node = HostNode::Start(kH200Node, [](Json& n) { n["platform"]["interrupt_remapping"] = false; });
  ASSERT_TRUE(node.ok()) << node.status();
  ASSERT_TRUE((*node)->BindNvidia(true).ok());
  vfio_agent::testing::TempDir status;
  std::ofstream(status.path() / "vfio-pci-ready") << "";
  const AgentRun run = Agent(absl::StrCat(Roots((*node)->paths), " --nvswitches --layers platform,devices --status-dir ",
                                     status.path().string()));
  EXPECT_EQ(run.exit_code, 1) << run.out;
  EXPECT_THAT(run.out, HasSubstr("  FAIL  iommu.interrupt_remapping  node"));
  EXPECT_THAT(run.out, HasSubstr("          evidence: "));
  EXPECT_THAT(run.out, HasSubstr("          fix: "));
  EXPECT_THAT(run.out, HasSubstr("BROKEN at iommu.interrupt_remapping"));
  EXPECT_FALSE(std::filesystem::exists(status.path() / "vfio-pci-ready"));
  EXPECT_TRUE(std::filesystem::exists(status.path() / "workload-type"));
}

// A CR argument that never ends (or never opens: a FIFO without a writer) is refused at once, naming it.
TEST(HostCliTest, KubevirtCrThatIsNotARegularFileIsAUsageError) {
  vfio_agent::testing::TempDir dir;
  const std::filesystem::path fifo = dir.path() / "cr.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& file : {std::string("/dev/zero"), fifo.string()}) {
    const AgentRun run = Agent(absl::StrCat("--kubevirt-cr ", file, " --layers kubevirt 2>&1"));
    EXPECT_EQ(run.exit_code, 2) << file << ": " << run.out;
  }
}

TEST(HostCliTest, JsonFollowsTheSchema) {
  auto node = HostNode::Start(kH200Node, [](Json& n) { n["platform"]["phys_bits"] = 40; });
  ASSERT_TRUE(node.ok()) << node.status();
  ASSERT_TRUE((*node)->BindNvidia(true).ok());
  const AgentRun run = Agent(absl::StrCat(Roots((*node)->paths), " --nvswitches --layers platform,devices --json"));
  EXPECT_EQ(run.exit_code, 0) << run.out;  // a warning does not fail
  const Json report = Json::parse(run.out);
  EXPECT_EQ(report["schema"], "vfio-gpu-agent.validate/v1");
  EXPECT_EQ(report["layers"], Json::array({"platform", "devices"}));
  EXPECT_EQ(report["hostReady"], true);
  EXPECT_EQ(report["counts"]["warn"], 1);
  const Json* mmio = nullptr;
  for (const Json& check : report["checks"]) {
    if (check["id"] == "device.mmio_window") mmio = &check;
  }
  ASSERT_NE(mmio, nullptr);
  EXPECT_EQ((*mmio)["layer"], "DEVICES");
  EXPECT_EQ((*mmio)["result"], "WARN");
  EXPECT_EQ((*mmio)["subject"], "node");
  EXPECT_FALSE((*mmio)["fix"].get<std::string>().empty());
  EXPECT_TRUE((*mmio)["evidence"][0].contains("source"));
}

TEST(HostCliTest, UsageErrorsExitTwoAndAnUnreadableHostExitsThree) {
  EXPECT_EQ(Agent("--layers firmware").exit_code, 2);
  EXPECT_EQ(Agent("--no-such-flag").exit_code, 2);
  EXPECT_EQ(Agent("--kubevirt-cr /nonexistent/kubevirt.yaml").exit_code, 2);
  vfio_agent::testing::TempDir empty;
  EXPECT_EQ(Agent(absl::StrCat("--sysfs-root ", empty.path().string(), " --layers platform,devices")).exit_code, 3);
}

}  // namespace
}  // namespace vfio_agent::validation::testing
