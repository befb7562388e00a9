// validate's read of the admission policy and its binding by name against the fake API server: what each answer
// of the server becomes, above all the two 404s (the object is missing / the API is not served).
#include "vfio_gpu_agent/kube/admission_policy_reader.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "api_sim_fixture.h"
#include "kube_api_sim.h"

namespace vfio_agent::kube {
namespace {

using Json = nlohmann::json;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr char kPolicy[] =
    R"(admission policy {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy", "metadata": {"name": "vfio-gpu-agent-own-node"}, "spec": {"failurePolicy": "Fail"}})";

class AdmissionPolicyReaderTest : public testing::KubeApiSimTest {
 protected:
  void SetUp() override {
    testing::KubeApiSimTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    auto kubeconfig = api_->WriteKubeconfig(dir_.path() / "kubeconfig");
    ASSERT_TRUE(kubeconfig.ok()) << kubeconfig.status();
    auto reader = ConnectAdmissionPolicyReader({.kubeconfig = *kubeconfig});
    ASSERT_TRUE(reader.ok()) << reader.status();
    reader_ = *std::move(reader);
  }

  absl::StatusOr<std::string> Policy(std::chrono::milliseconds timeout = 10s) {
    return reader_->Get(kAdmissionPoliciesPath, kAgentAdmissionPolicy, timeout);
  }

  std::unique_ptr<AdmissionPolicyReader> reader_;
};

TEST_F(AdmissionPolicyReaderTest, ReadsThePolicyByName) {
  ASSERT_TRUE(api_->Control(kPolicy).ok());
  auto policy = Policy();
  ASSERT_TRUE(policy.ok()) << policy.status();
  const Json json = Json::parse(*policy);
  EXPECT_EQ(json["kind"], "ValidatingAdmissionPolicy");
  EXPECT_EQ(json["spec"]["failurePolicy"], "Fail");
  const std::string path = absl::StrCat(kAdmissionPoliciesPath, "/", kAgentAdmissionPolicy);
  EXPECT_EQ(api_->Count("GET", path, "200"), 1u);
  EXPECT_EQ(reader_->requests(), 1u);
  EXPECT_EQ(reader_->Request(kAdmissionPoliciesPath, kAgentAdmissionPolicy), absl::StrCat("GET ", api_->url(), path));
  EXPECT_THAT(reader_->ConfigSource(), HasSubstr("kubeconfig"));
}

TEST_F(AdmissionPolicyReaderTest, AMissingObjectAndAnUnservedApiAreTwoAnswers) {
  // Served, but nothing of that name: the 404 names the object.
  auto binding = reader_->Get(kAdmissionPolicyBindingsPath, kAgentAdmissionPolicy, 10s);
  EXPECT_TRUE(absl::IsNotFound(binding.status())) << binding.status();
  EXPECT_THAT(binding.status().message(), HasSubstr("\"vfio-gpu-agent-own-node\" not found"));
  // Kubernetes < 1.30: the 404 names nothing.
  ASSERT_TRUE(api_->Control(kPolicy).ok());
  ASSERT_TRUE(api_->Control("admission-api off").ok());
  auto policy = Policy();
  EXPECT_TRUE(absl::IsUnimplemented(policy.status())) << policy.status();
  EXPECT_THAT(policy.status().message(), HasSubstr("404 the server could not find the requested resource"));
  ASSERT_TRUE(api_->Control("admission-api on").ok());
  EXPECT_TRUE(Policy().ok());
  ASSERT_TRUE(api_->Control("delete-admission policy vfio-gpu-agent-own-node").ok());
  EXPECT_TRUE(absl::IsNotFound(Policy().status()));
}

TEST_F(AdmissionPolicyReaderTest, EveryOtherAnswerBecomesItsOwnStatus) {
  ASSERT_TRUE(api_->Control(kPolicy).ok());
  // RBAC first, as kube-apiserver authorizes before it looks for the object.
  ASSERT_TRUE(api_->Control("deny get validatingadmissionpolicies.admissionregistration.k8s.io").ok());
  auto policy = Policy();
  EXPECT_TRUE(absl::IsPermissionDenied(policy.status())) << policy.status();
  EXPECT_THAT(policy.status().message(),
              HasSubstr("cannot get resource \"validatingadmissionpolicies\" in API group \"admissionregistration.k8s.io\""));
  ASSERT_TRUE(api_->Control("allow get validatingadmissionpolicies.admissionregistration.k8s.io").ok());

  ASSERT_TRUE(api_->Control("token another-token").ok());
  EXPECT_TRUE(absl::IsUnauthenticated(Policy().status()));
  ASSERT_TRUE(api_->Control(absl::StrCat("token ", api_->token())).ok());

  ASSERT_TRUE(api_->Control("fail GET /apis/admissionregistration.k8s.io 503 1").ok());
  policy = Policy();
  EXPECT_TRUE(absl::IsUnavailable(policy.status())) << policy.status();
  EXPECT_THAT(policy.status().message(), HasSubstr("503"));

  ASSERT_TRUE(api_->Control("hang GET /apis/admissionregistration.k8s.io 1").ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(Policy(300ms).status()));
  ASSERT_TRUE(api_->Control("release").ok());

  EXPECT_TRUE(Policy().ok());
  api_.reset();  // its port refuses connections now
  policy = Policy();
  EXPECT_TRUE(absl::IsUnavailable(policy.status())) << policy.status();
  EXPECT_THAT(policy.status().message(), HasSubstr(kAdmissionPoliciesPath));
}

}  // namespace
}  // namespace vfio_agent::kube
