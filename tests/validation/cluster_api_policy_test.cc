// The api layer in a cluster: `vfio-gpu-agent validate --layers api` as a process reads the admission policy
// that holds each agent to its own Node, and its binding, from the fake API server (tests/sim/kube_api_sim),
// and says whether it is installed and bound with Deny, what is lost when it is not, and which RBAC rule it
// needs when it may not read them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "kube_api_sim.h"
#include "support/sysfs_tree.h"

namespace vfio_agent::validation::testing {
namespace {

using Json = nlohmann::json;
using sim::KubeApiSim;
using ::testing::HasSubstr;

constexpr char kName[] = "vfio-gpu-agent-own-node";
constexpr char kPolicyPath[] = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/vfio-gpu-agent-own-node";
constexpr char kBindingPath[] =
    "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/vfio-gpu-agent-own-node";

std::string PolicyJson() {
  return Json{{"apiVersion", "admissionregistration.k8s.io/v1"},
              {"kind", "ValidatingAdmissionPolicy"},
              {"metadata", {{"name", kName}}},
              {"spec",
               {{"failurePolicy", "Fail"},
                {"matchConditions",
                 {{{"name", "vfio-gpu-agent-service-account"},
                   {"expression",
                    "request.userInfo.username == 'system:serviceaccount:vfio-gpu-agent:vfio-gpu-agent'"}}}},
                {"validations", {{{"expression", "variables.nodeName != ''"}, {"reason", "Forbidden"}}}}}}}
      .dump();
}

std::string BindingJson(const std::string& policy, const Json& actions) {
  return Json{{"apiVersion", "admissionregistration.k8s.io/v1"},
              {"kind", "ValidatingAdmissionPolicyBinding"},
              {"metadata", {{"name", kName}}},
              {"spec", {{"policyName", policy}, {"validationActions", actions}}}}
      .dump();
}

struct PolicyRun {
  int exit_code = -1;
  std::string out;
  Json report;
};

class ClusterApiPolicyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!KubeApiSim::Available()) GTEST_SKIP() << "python3 not found";
    // One GPU is enough: the api layer looks at the cluster, not at the host.
    vfio_agent::testing::SysfsTree tree(dir_.path() / "sys");
    tree.AddDevice({.bdf = "0000:3b:00.0", .device = 0x2335, .driver = "nvidia", .iommu_group = 12});
    sysfs_root_ = tree.root().string();
    auto api = KubeApiSim::Start(dir_.path());
    ASSERT_TRUE(api.ok()) << api.status();
    api_ = *std::move(api);
    auto kubeconfig = api_->WriteKubeconfig(dir_.path() / "kubeconfig");
    ASSERT_TRUE(kubeconfig.ok()) << kubeconfig.status();
    kubeconfig_ = kubeconfig->string();
  }

  void Install(const Json& actions = Json::array({"Deny"}), const std::string& policy = kName) {
    ASSERT_TRUE(api_->Control(absl::StrCat("admission policy ", PolicyJson())).ok());
    ASSERT_TRUE(api_->Control(absl::StrCat("admission binding ", BindingJson(policy, actions))).ok());
  }

  // `validate --json ARGS` (in-cluster variables removed unless `env` sets them).
  PolicyRun Validate(const std::string& args, const std::string& env = "env -u KUBERNETES_SERVICE_HOST") {
    const std::string command = absl::StrCat(env, " ", VA_AGENT_BIN, " validate --sysfs-root ", sysfs_root_,
                                             " --json ", args, " --log-level error 2>/dev/null");
    PolicyRun run;
    FILE* pipe = ::popen(command.c_str(), "r");
    if (pipe == nullptr) return run;
    char buffer[4096];
    size_t n = 0;
    while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) run.out.append(buffer, n);
    const int status = ::pclose(pipe);
    run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    run.report = Json::parse(run.out, nullptr, /*allow_exceptions=*/false);
    return run;
  }

  PolicyRun ValidateCluster(const std::string& args = "") {
    return Validate(absl::StrCat("--layers api --kubeconfig ", kubeconfig_, " ", args));
  }

  // The one api.admission_policy check of the report (null when there is none or more than one).
  static const Json* PolicyCheck(const PolicyRun& run) {
    if (!run.report.is_object() || !run.report.contains("checks")) return nullptr;
    const Json* found = nullptr;
    for (const Json& check : run.report["checks"]) {
      if (check["id"] != "api.admission_policy") continue;
      if (found != nullptr) return nullptr;
      found = &check;
    }
    return found;
  }

  static std::string Evidence(const Json& check) {
    std::string text;
    for (const Json& e : check.value("evidence", Json::array())) {
      text += absl::StrCat(e.value("source", ""), " = ", e.value("value", ""), "\n");
    }
    return text;
  }

  vfio_agent::testing::TempDir dir_{"va-api-policy"};
  std::unique_ptr<KubeApiSim> api_;
  std::string sysfs_root_;
  std::string kubeconfig_;
};

TEST_F(ClusterApiPolicyTest, InstalledAndBoundWithDenyPasses) {
  Install();
  const PolicyRun run = ValidateCluster();
  EXPECT_EQ(run.exit_code, 0) << run.out;
  EXPECT_EQ(run.report.value("layers", Json()), Json::array({"api"})) << run.out;
  const Json* check = PolicyCheck(run);
  ASSERT_NE(check, nullptr) << run.out;
  EXPECT_EQ((*check)["result"], "PASS") << run.out;
  EXPECT_EQ((*check)["layer"], "API");
  EXPECT_EQ((*check)["subject"], kName);
  EXPECT_THAT((*check)["message"].get<std::string>(), HasSubstr("installed and bound with Deny"));
  // The evidence names both requests and which account the policy holds.
  const std::string evidence = Evidence(*check);
  EXPECT_THAT(evidence, HasSubstr(absl::StrCat("GET ", api_->url(), kPolicyPath, " = failurePolicy Fail")));
  EXPECT_THAT(evidence, HasSubstr("system:serviceaccount:vfio-gpu-agent:vfio-gpu-agent"));
  EXPECT_THAT(evidence, HasSubstr(absl::StrCat("GET ", api_->url(), kBindingPath, " = policyName ", kName,
                                               ", validationActions [Deny]")));
  EXPECT_EQ(api_->Count("GET", kPolicyPath, "200"), 1u);
  EXPECT_EQ(api_->Count("GET", kBindingPath, "200"), 1u);
}

TEST_F(ClusterApiPolicyTest, NotInstalledWarnsNamingWhatIsLostAndTheFix) {
  const PolicyRun run = ValidateCluster();
  EXPECT_EQ(run.exit_code, 0) << run.out;  // a warning: clusters without the policy are supported
  const Json* check = PolicyCheck(run);
  ASSERT_NE(check, nullptr) << run.out;
  EXPECT_EQ((*check)["result"], "WARN");
  EXPECT_THAT((*check)["message"].get<std::string>(), HasSubstr("is not installed"));
  EXPECT_THAT((*check)["message"].get<std::string>(), HasSubstr("patch any Node's status (capacity, allocatable"));
  EXPECT_THAT((*check)["fix"].get<std::string>(), HasSubstr("daemonset/base/agent/admission-policy.yaml"));
  // Each request once, as the source; its value is the server's answer.
  EXPECT_THAT(Evidence(*check), HasSubstr(absl::StrCat(kPolicyPath, " = 404 validatingadmissionpolicies")));
  EXPECT_EQ(api_->Count("GET", kPolicyPath, "404"), 1u);
}

TEST_F(ClusterApiPolicyTest, APolicyWithoutItsBindingHoldsNothing) {
  ASSERT_TRUE(api_->Control(absl::StrCat("admission policy ", PolicyJson())).ok());
  const PolicyRun run = ValidateCluster();
  const Json* check = PolicyCheck(run);
  ASSERT_NE(check, nullptr) << run.out;
  EXPECT_EQ((*check)["result"], "WARN");
  EXPECT_THAT((*check)["message"].get<std::string>(), HasSubstr("installed but not bound"));
  EXPECT_EQ(api_->Count("GET", kBindingPath, "404"), 1u);
}

TEST_F(ClusterApiPolicyTest, ABindingThatOnlyAuditsOrBindsAnotherPolicyWarns) {
  Install(Json::array({"Audit", "Warn"}));
  PolicyRun run = ValidateCluster();
  const Json* check = PolicyCheck(run);
  ASSERT_NE(check, nullptr) << run.out;
  EXPECT_EQ((*check)["result"], "WARN");
  EXPECT_THAT((*check)["message"].get<std::string>(), HasSubstr("validationActions [Audit,Warn]"));
  EXPECT_THAT((*check)["fix"].get<std::string>(), HasSubstr("validationActions: [Deny]"));

  Install(Json::array({"Deny"}), "someone-elses-policy");
  run = ValidateCluster();
  check = PolicyCheck(run);
  ASSERT_NE(check, nullptr) << run.out;
  EXPECT_EQ((*check)["result"], "WARN");
  EXPECT_THAT((*check)["message"].get<std::string>(), HasSubstr("binds policy \"someone-elses-policy\""));
}

TEST_F(ClusterApiPolicyTest, ForbiddenWarnsWithTheRbacRule) {
  Install();
  ASSERT_TRUE(api_->Control("deny get validatingadmissionpolicies.admissionregistration.k8s.io").ok());
  const PolicyRun run = ValidateCluster();
  EXPECT_EQ(run.exit_code, 0) << run.out;
  const Json* check = PolicyCheck(run);
  ASSERT_NE(check, nullptr) << run.out;
  EXPECT_EQ((*check)["result"], "WARN");
  EXPECT_THAT((*check)["message"].get<std::string>(), HasSubstr("(403)"));
  EXPECT_THAT((*check)["fix"].get<std::string>(),
              HasSubstr(R"(resourceNames: ["vfio-gpu-agent-own-node"], verbs: ["get"])"));
  // The server's own words name the account.
  EXPECT_THAT(Evidence(*check), HasSubstr("system:serviceaccount:vfio-gpu-agent:vfio-gpu-agent"));
  EXPECT_EQ(api_->Count("GET", kPolicyPath, "403"), 1u);
}

TEST_F(ClusterApiPolicyTest, AClusterThatCannotHaveThePolicyWarnsToo) {
  Install();
  ASSERT_TRUE(api_->Control("admission-api off").ok());
  const PolicyRun run = ValidateCluster();
  EXPECT_EQ(run.exit_code, 0) << run.out;
  const Json* check = PolicyCheck(run);
  ASSERT_NE(check, nullptr) << run.out;
  EXPECT_EQ((*check)["result"], "WARN");
  EXPECT_THAT((*check)["message"].get<std::string>(), HasSubstr("Kubernetes < 1.30"));
  EXPECT_THAT((*check)["fix"].get<std::string>(), HasSubstr("Kubernetes >= 1.30"));
}

TEST_F(ClusterApiPolicyTest, AServerThatDoesNotAnswerIsSkippedAndNoClusterToo) {
  Install();
  ASSERT_TRUE(api_->Control("fail GET /apis/admissionregistration.k8s.io 503 -1").ok());
  PolicyRun run = ValidateCluster();
  EXPECT_EQ(run.exit_code, 0) << run.out;
  const Json* check = PolicyCheck(run);
  ASSERT_NE(check, nullptr) << run.out;
  EXPECT_EQ((*check)["result"], "SKIP");
  EXPECT_THAT((*check)["message"].get<std::string>(), HasSubstr("503"));

  if (std::filesystem::exists("/var/run/secrets/kubernetes.io/serviceaccount/token")) {
    GTEST_SKIP() << "this machine is a pod: its own service account would be used";
  }
  const size_t asked = api_->Count("", "/");
  run = Validate("--layers api");
  check = PolicyCheck(run);
  ASSERT_NE(check, nullptr) << run.out;
  EXPECT_EQ((*check)["result"], "SKIP");
  EXPECT_THAT((*check)["message"].get<std::string>(), HasSubstr("no cluster"));
  EXPECT_EQ(api_->Count("", "/"), asked);
}

TEST_F(ClusterApiPolicyTest, OtherLayersAloneDoNotAsk) {
  Install();
  const PolicyRun run = Validate(absl::StrCat("--kubeconfig ", kubeconfig_, " --layers devices"));
  EXPECT_EQ(run.report.value("layers", Json()), Json::array({"devices"})) << run.out;
  EXPECT_EQ(PolicyCheck(run), nullptr);
  EXPECT_EQ(api_->Count("", "/"), 0u);
}

}  // namespace
}  // namespace vfio_agent::validation::testing
