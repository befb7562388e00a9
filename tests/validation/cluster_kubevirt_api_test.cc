// Layer 5 in a cluster: `vfio-gpu-agent validate` as a process reads the KubeVirt CR from the fake API server
// (tests/sim/kube_api_sim) when no --kubevirt-cr is given, and turns every answer into the layer's result.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "kube_api_sim.h"
#include "validation/cluster_node.h"

namespace vfio_agent::validation::testing {
namespace {

using Json = nlohmann::json;
using sim::KubeApiSim;
using ::testing::HasSubstr;

constexpr char kKubevirts[] = "/apis/kubevirt.io/v1/kubevirts";

// One KubeVirt CR permitting `resource` for the H200 (10DE:2335), with the gates the layer wants.
std::string Crs(const std::string& resource) {
  const Json cr = {
      {"apiVersion", "kubevirt.io/v1"},
      {"kind", "KubeVirt"},
      {"metadata", {{"name", "kubevirt"}, {"namespace", "cozy-kubevirt"}}},
      {"spec",
       {{"configuration",
         {{"developerConfiguration", {{"featureGates", {"GPU", "HostDevices"}}}},
          {"permittedHostDevices",
           {{"pciHostDevices",
             {{{"pciVendorSelector", resource == kH200 ? "10DE:2335" : "10DE:2236"},
               {"resourceName", resource},
               {"externalResourceProvider", true}}}}}}}}}}};
  return Json::array({cr}).dump();
}

struct AgentRun {
  int exit_code = -1;
  std::string out;
  Json report;
  std::chrono::milliseconds took{0};
};

class ClusterKubevirtApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!KubeApiSim::Available()) GTEST_SKIP() << "python3 not found";
    auto node = ClusterNode::Create();
    ASSERT_TRUE(node.ok()) << node.status();
    node_ = *std::move(node);
    auto api = KubeApiSim::Start(dir_.path());
    ASSERT_TRUE(api.ok()) << api.status();
    api_ = *std::move(api);
    auto kubeconfig = api_->WriteKubeconfig(dir_.path() / "kubeconfig");
    ASSERT_TRUE(kubeconfig.ok()) << kubeconfig.status();
    kubeconfig_ = kubeconfig->string();
  }

  // `validate --json` on the simulated node; `env` is put before it (`env -u ...` / `env NAME=VALUE ...`), and the
  // in-cluster variables are removed unless `env` sets them.
  AgentRun Validate(const std::string& args, const std::string& env = "env -u KUBERNETES_SERVICE_HOST") {
    const std::string command =
        absl::StrCat(env, " ", VA_AGENT_BIN, " validate --sysfs-root ", node_->paths.sysfs_root.string(),
                     " --dev-root ", node_->paths.dev_root.string(), " --json ", args, " --log-level error 2>/dev/null");
    AgentRun run;
    const auto start = std::chrono::steady_clock::now();
    FILE* pipe = ::popen(command.c_str(), "r");
    if (pipe == nullptr) return run;
    char buffer[4096];
    size_t n = 0;
    while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) run.out.append(buffer, n);
    const int status = ::pclose(pipe);
    run.took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    run.report = Json::parse(run.out, nullptr, /*allow_exceptions=*/false);
    return run;
  }

  // The first kubevirt.permitted check with this subject, or null.
  static const Json* Permitted(const AgentRun& run, const std::string& subject) {
    if (!run.report.is_object() || !run.report.contains("checks")) return nullptr;
    for (const Json& check : run.report["checks"]) {
      if (check["id"] == "kubevirt.permitted" && check["subject"] == subject) return &check;
    }
    return nullptr;
  }

  static std::string Evidence(const Json& check) {
    std::string text;
    for (const Json& e : check.value("evidence", Json::array())) {
      text += absl::StrCat(e.value("source", ""), " = ", e.value("value", ""), "\n");
    }
    return text;
  }

  std::string Kubeconfig() const { return absl::StrCat("--layers kubevirt --kubeconfig ", kubeconfig_); }

  vfio_agent::testing::TempDir dir_{"va-kubevirt-api"};
  std::unique_ptr<ClusterNode> node_;
  std::unique_ptr<KubeApiSim> api_;
  std::string kubeconfig_;
};

TEST_F(ClusterKubevirtApiTest, ACrPermittingOurNamePasses) {
  ASSERT_TRUE(api_->Control(absl::StrCat("kubevirts ", Crs(kH200))).ok());
  const AgentRun run = Validate(Kubeconfig());
  EXPECT_EQ(run.exit_code, 0) << run.out;
  const Json* permitted = Permitted(run, kH200);
  ASSERT_NE(permitted, nullptr) << run.out;
  EXPECT_EQ((*permitted)["result"], "PASS");
  EXPECT_THAT(Evidence(*permitted), HasSubstr("kubevirt cozy-kubevirt/kubevirt"));
  EXPECT_EQ(api_->Count("GET", kKubevirts, "200"), 1u);
}

TEST_F(ClusterKubevirtApiTest, ACrLackingOurNameFailsWithTheFix) {
  ASSERT_TRUE(api_->Control(absl::StrCat("kubevirts ", Crs("nvidia.com/GA102GL_A10"))).ok());
  const AgentRun run = Validate(Kubeconfig());
  EXPECT_EQ(run.exit_code, 1) << run.out;
  const Json* permitted = Permitted(run, kH200);
  ASSERT_NE(permitted, nullptr) << run.out;
  EXPECT_EQ((*permitted)["result"], "FAIL");
  EXPECT_THAT((*permitted)["fix"].get<std::string>(), HasSubstr("vfio-gpu-agent kubevirt-config"));
  EXPECT_EQ(api_->Count("GET", kKubevirts, "200"), 1u);
}

TEST_F(ClusterKubevirtApiTest, KubevirtNotInstalledFails) {
  // The sim serves no kubevirt.io until told: a cluster without KubeVirt answers 404.
  const AgentRun run = Validate(Kubeconfig());
  EXPECT_EQ(run.exit_code, 1) << run.out;
  const Json* permitted = Permitted(run, "node");
  ASSERT_NE(permitted, nullptr) << run.out;
  EXPECT_EQ((*permitted)["result"], "FAIL");
  EXPECT_THAT((*permitted)["message"].get<std::string>(), HasSubstr("KubeVirt is not installed"));
  EXPECT_THAT(Evidence(*permitted), HasSubstr(absl::StrCat("GET ", api_->url(), kKubevirts, " = ")));
  EXPECT_THAT((*permitted)["fix"].get<std::string>(), HasSubstr("--layers platform,devices,plugin,kubelet"));
  EXPECT_EQ(api_->Count("GET", kKubevirts, "404"), 1u);
}

TEST_F(ClusterKubevirtApiTest, AnEmptyListIsNoKubevirtCr) {
  ASSERT_TRUE(api_->Control("kubevirts []").ok());
  const AgentRun run = Validate(Kubeconfig());
  EXPECT_EQ(run.exit_code, 1) << run.out;
  const Json* permitted = Permitted(run, "node");
  ASSERT_NE(permitted, nullptr) << run.out;
  EXPECT_EQ((*permitted)["result"], "FAIL");
  EXPECT_THAT((*permitted)["message"].get<std::string>(), HasSubstr("no KubeVirt CR in the cluster"));
}

TEST_F(ClusterKubevirtApiTest, ForbiddenNamesTheRbacRule) {
  ASSERT_TRUE(api_->Control(absl::StrCat("kubevirts ", Crs(kH200))).ok());
  ASSERT_TRUE(api_->Control("deny list kubevirts.kubevirt.io").ok());
  const AgentRun run = Validate(Kubeconfig());
  EXPECT_EQ(run.exit_code, 1) << run.out;
  const Json* permitted = Permitted(run, "node");
  ASSERT_NE(permitted, nullptr) << run.out;
  EXPECT_EQ((*permitted)["result"], "FAIL");
  EXPECT_THAT((*permitted)["message"].get<std::string>(), HasSubstr("lacks get/list kubevirts.kubevirt.io"));
  EXPECT_THAT((*permitted)["fix"].get<std::string>(),
              HasSubstr(R"(apiGroups: ["kubevirt.io"], resources: ["kubevirts"], verbs: ["get", "list"])"));
  // The server's own words name the account.
  EXPECT_THAT(Evidence(*permitted), HasSubstr("system:serviceaccount:vfio-gpu-agent:vfio-gpu-agent"));
  EXPECT_EQ(api_->Count("GET", kKubevirts, "403"), 1u);
}

TEST_F(ClusterKubevirtApiTest, RejectedCredentialsFailNamingTheRuleToo) {
  ASSERT_TRUE(api_->Control(absl::StrCat("kubevirts ", Crs(kH200))).ok());
  ASSERT_TRUE(api_->Control("token a-token-validate-does-not-have").ok());
  const AgentRun run = Validate(Kubeconfig());
  EXPECT_EQ(run.exit_code, 1) << run.out;
  const Json* permitted = Permitted(run, "node");
  ASSERT_NE(permitted, nullptr) << run.out;
  EXPECT_EQ((*permitted)["result"], "FAIL");
  EXPECT_THAT((*permitted)["message"].get<std::string>(), HasSubstr("did not accept the credentials (401)"));
  EXPECT_THAT((*permitted)["fix"].get<std::string>(), HasSubstr("get/list kubevirts.kubevirt.io"));
}

TEST_F(ClusterKubevirtApiTest, AnApiServerThatHangsIsSkippedAtTheTimeout) {
  ASSERT_TRUE(api_->Control(absl::StrCat("kubevirts ", Crs(kH200))).ok());
  // The sim holds the request for 60 s unless released; only --api-timeout ends it sooner.
  ASSERT_TRUE(api_->Control("hang GET /apis/kubevirt.io 1").ok());
  const AgentRun run = Validate(absl::StrCat(Kubeconfig(), " --api-timeout 500"));
  ASSERT_TRUE(api_->Control("release").ok());
  EXPECT_EQ(run.exit_code, 0) << run.out;
  EXPECT_LT(run.took, std::chrono::seconds(30));
  const Json* permitted = Permitted(run, "node");
  ASSERT_NE(permitted, nullptr) << run.out;
  EXPECT_EQ((*permitted)["result"], "SKIP");
  EXPECT_THAT((*permitted)["message"].get<std::string>(), HasSubstr("could not be read from the API server"));
  EXPECT_THAT((*permitted)["message"].get<std::string>(), HasSubstr("Timeout"));
  EXPECT_EQ(api_->Count("GET", kKubevirts, "hang"), 1u);
}

TEST_F(ClusterKubevirtApiTest, AnApiServerThatIsDownIsSkippedWithTheReason) {
  api_.reset();  // its port refuses connections now
  const AgentRun run = Validate(Kubeconfig());
  EXPECT_EQ(run.exit_code, 0) << run.out;
  const Json* permitted = Permitted(run, "node");
  ASSERT_NE(permitted, nullptr) << run.out;
  EXPECT_EQ((*permitted)["result"], "SKIP");
  EXPECT_THAT((*permitted)["message"].get<std::string>(), HasSubstr(kKubevirts));
}

TEST_F(ClusterKubevirtApiTest, AKubevirtCrFileWinsAndTheApiIsNotAsked) {
  ASSERT_TRUE(api_->Control(absl::StrCat("kubevirts ", Crs("nvidia.com/GA102GL_A10"))).ok());
  const auto file = dir_.path() / "kubevirt.json";
  std::ofstream(file) << absl::StrCat(R"({"apiVersion": "v1", "kind": "List", "items": )", Crs(kH200), "}");
  const AgentRun run = Validate(absl::StrCat(Kubeconfig(), " --kubevirt-cr ", file.string()));
  EXPECT_EQ(run.exit_code, 0) << run.out;
  const Json* permitted = Permitted(run, kH200);
  ASSERT_NE(permitted, nullptr) << run.out;
  EXPECT_EQ((*permitted)["result"], "PASS");
  EXPECT_EQ(api_->Count("", "/"), 0u);
  // Nor when the KubeVirt layer does not run.
  const AgentRun devices = Validate(absl::StrCat("--layers devices --kubeconfig ", kubeconfig_));
  EXPECT_EQ(devices.report.value("layers", Json()), Json::array({"devices"})) << devices.out;
  EXPECT_EQ(api_->Count("", "/"), 0u);
}

TEST_F(ClusterKubevirtApiTest, NoClusterLeavesTheLayerSkippedAsBefore) {
  if (std::filesystem::exists("/var/run/secrets/kubernetes.io/serviceaccount/token")) {
    GTEST_SKIP() << "this machine is a pod: its own service account would be used";
  }
  ASSERT_TRUE(api_->Control(absl::StrCat("kubevirts ", Crs(kH200))).ok());
  AgentRun run = Validate("--layers kubevirt");
  EXPECT_EQ(run.exit_code, 0) << run.out;
  const Json* permitted = Permitted(run, "node");
  ASSERT_NE(permitted, nullptr) << run.out;
  EXPECT_EQ((*permitted)["result"], "SKIP");
  EXPECT_THAT((*permitted)["message"].get<std::string>(), HasSubstr("no KubeVirt CR given"));
  // In a pod without a mounted token (KUBERNETES_SERVICE_HOST set, no token file) too.
  const std::string port = api_->url().substr(api_->url().rfind(':') + 1);
  run = Validate("--layers kubevirt",
                 absl::StrCat("env KUBERNETES_SERVICE_HOST=127.0.0.1 KUBERNETES_SERVICE_PORT=", port));
  permitted = Permitted(run, "node");
  ASSERT_NE(permitted, nullptr) << run.out;
  EXPECT_EQ((*permitted)["result"], "SKIP");
  EXPECT_EQ(api_->Count("", "/"), 0u);
}

TEST_F(ClusterKubevirtApiTest, AKubeconfigThatCannotBeLoadedIsAUsageError) {
  EXPECT_EQ(Validate(absl::StrCat("--layers kubevirt --kubeconfig ", (dir_.path() / "absent").string())).exit_code, 2);
  EXPECT_EQ(Validate(absl::StrCat(Kubeconfig(), " --api-timeout 0")).exit_code, 2);
  EXPECT_EQ(api_->Count("", "/"), 0u);
}

}  // namespace
}  // namespace vfio_agent::validation::testing
