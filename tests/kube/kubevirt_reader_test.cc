// validate's read of the KubeVirt CRs against the fake API server: how the cluster is found (kubeconfig,
// in-cluster service account, none) and what each answer of the server becomes.
#include "vfio_gpu_agent/kube/kubevirt_reader.h"

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "api_sim_fixture.h"
#include "kube_api_sim.h"
#include "support/sysfs_tree.h"

namespace vfio_agent::kube {
namespace {

using Json = nlohmann::json;
using sim::KubeApiSim;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using vfio_agent::testing::TempDir;
using namespace std::chrono_literals;

constexpr char kCrs[] =
    R"(kubevirts [{"apiVersion": "kubevirt.io/v1", "kind": "KubeVirt", "metadata": {"name": "kubevirt", "namespace": "cozy-kubevirt"}, "spec": {"configuration": {"permittedHostDevices": {"pciHostDevices": [{"pciVendorSelector": "10DE:2335", "resourceName": "nvidia.com/GH100_H200_SXM_141GB", "externalResourceProvider": true}]}}}}])";

// The environment variables of in-cluster configuration, set for one scope and restored after it.
class ServiceEnv {
 public:
  ServiceEnv(const char* host, const char* port) {
    Save("KUBERNETES_SERVICE_HOST", host);
    Save("KUBERNETES_SERVICE_PORT", port);
  }
  ~ServiceEnv() {
    for (const auto& [name, value] : saved_) {
      if (value) ::setenv(name.c_str(), value->c_str(), 1);
      else ::unsetenv(name.c_str());
    }
  }

 private:
  void Save(const char* name, const char* value) {
    const char* old = std::getenv(name);
    saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
    if (value) ::setenv(name, value, 1);
    else ::unsetenv(name);
  }
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

class KubevirtReaderTest : public testing::KubeApiSimTest {
 protected:
  void SetUp() override {
    testing::KubeApiSimTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    auto kubeconfig = api_->WriteKubeconfig(dir_.path() / "kubeconfig");
    ASSERT_TRUE(kubeconfig.ok()) << kubeconfig.status();
    auto reader = ConnectKubevirtReader({.kubeconfig = *kubeconfig});
    ASSERT_TRUE(reader.ok()) << reader.status();
    reader_ = *std::move(reader);
  }

  std::unique_ptr<KubevirtReader> reader_;
};

TEST_F(KubevirtReaderTest, ReadsEveryNamespacesKubevirtList) {
  ASSERT_TRUE(api_->Control(kCrs).ok());
  auto list = reader_->List(10s);
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->items, 1u);
  const Json json = Json::parse(list->json);
  EXPECT_EQ(json["kind"], "KubeVirtList");
  EXPECT_EQ(json["apiVersion"], "kubevirt.io/v1");
  EXPECT_EQ(json["items"][0]["metadata"]["namespace"], "cozy-kubevirt");
  EXPECT_EQ(api_->Count("GET", kKubevirtsPath, "200"), 1u);
  EXPECT_EQ(reader_->requests(), 1u);
  EXPECT_EQ(reader_->Request(), absl::StrCat("GET ", api_->url(), kKubevirtsPath));
  EXPECT_THAT(reader_->ConfigSource(), HasSubstr("kubeconfig"));
}

TEST_F(KubevirtReaderTest, EachAnswerBecomesItsOwnStatus) {
  // The sim starts without KubeVirt's CRD, as a cluster without KubeVirt answers.
  auto list = reader_->List(10s);
  EXPECT_TRUE(absl::IsNotFound(list.status())) << list.status();
  EXPECT_THAT(list.status().message(), HasSubstr("404"));

  ASSERT_TRUE(api_->Control("kubevirts []").ok());
  list = reader_->List(10s);
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->items, 0u);

  // RBAC is checked before the resource: a denied list is a 403 even where KubeVirt is not installed.
  ASSERT_TRUE(api_->Control("no-kubevirt").ok());
  ASSERT_TRUE(api_->Control("deny list kubevirts.kubevirt.io").ok());
  list = reader_->List(10s);
  EXPECT_TRUE(absl::IsPermissionDenied(list.status())) << list.status();
  EXPECT_THAT(list.status().message(), HasSubstr("cannot list resource \"kubevirts\" in API group \"kubevirt.io\""));
  ASSERT_TRUE(api_->Control("allow list kubevirts.kubevirt.io").ok());
  ASSERT_TRUE(api_->Control(kCrs).ok());

  ASSERT_TRUE(api_->Control("token another-token").ok());
  list = reader_->List(10s);
  EXPECT_TRUE(absl::IsUnauthenticated(list.status())) << list.status();
  ASSERT_TRUE(api_->Control(absl::StrCat("token ", api_->token())).ok());

  ASSERT_TRUE(api_->Control("fail GET /apis/kubevirt.io 503 1").ok());
  list = reader_->List(10s);
  EXPECT_TRUE(absl::IsUnavailable(list.status())) << list.status();
  EXPECT_THAT(list.status().message(), HasSubstr("503"));

  ASSERT_TRUE(api_->Control("hang GET /apis/kubevirt.io 1").ok());
  list = reader_->List(300ms);
  EXPECT_TRUE(absl::IsDeadlineExceeded(list.status())) << list.status();
  ASSERT_TRUE(api_->Control("release").ok());

  list = reader_->List(10s);
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->items, 1u);
}

TEST_F(KubevirtReaderTest, AServerThatIsGoneIsUnavailable) {
  api_.reset();  // stops the server: its port refuses connections
  auto list = reader_->List(10s);
  EXPECT_TRUE(absl::IsUnavailable(list.status())) << list.status();
  EXPECT_THAT(list.status().message(), HasSubstr(kKubevirtsPath));
}

TEST(KubevirtReaderConnectTest, NoClusterIsNotFoundAndABadKubeconfigIsNot) {
  TempDir dir;
  {
    ServiceEnv env(nullptr, nullptr);
    EXPECT_TRUE(absl::IsNotFound(ConnectKubevirtReader({.kubeconfig = "", .service_account_dir = dir.path()}).status()));
  }
  {
    ServiceEnv env("127.0.0.1", "6443");  // a pod without a mounted token
    EXPECT_TRUE(absl::IsNotFound(ConnectKubevirtReader({.kubeconfig = "", .service_account_dir = dir.path()}).status()));
  }
  std::ofstream(dir.path() / "kubeconfig") << "apiVersion: v1\nkind: Config\ncurrent-context: missing\n";
  auto reader = ConnectKubevirtReader({.kubeconfig = dir.path() / "kubeconfig"});
  EXPECT_FALSE(reader.ok());
  EXPECT_FALSE(absl::IsNotFound(reader.status())) << reader.status();
  reader = ConnectKubevirtReader({.kubeconfig = dir.path() / "absent"});
  EXPECT_FALSE(reader.ok());
  EXPECT_FALSE(absl::IsNotFound(reader.status())) << reader.status();
}

TEST(KubevirtReaderInClusterTest, ServiceAccountOverHttps) {
  if (!KubeApiSim::Available(/*tls=*/true)) GTEST_SKIP() << "python3 or openssl not found";
  TempDir dir;
  auto api = KubeApiSim::Start(dir.path(), {.tls = true});
  ASSERT_TRUE(api.ok()) << api.status();
  ASSERT_TRUE((*api)->Control(kCrs).ok());
  const auto sa = dir.path() / "serviceaccount";
  std::filesystem::create_directories(sa);
  std::filesystem::copy_file((*api)->ca_file(), sa / "ca.crt");
  std::ofstream(sa / "token") << (*api)->token() << "\n";
  const std::string url = (*api)->url();
  const std::string port = url.substr(url.rfind(':') + 1);

  absl::StatusOr<std::unique_ptr<KubevirtReader>> reader;
  {
    ServiceEnv env("127.0.0.1", port.c_str());
    reader = ConnectKubevirtReader({.kubeconfig = "", .service_account_dir = sa});
  }
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*api)->Log().size(), 0u);  // connecting does not contact the server
  EXPECT_THAT((*reader)->ConfigSource(), StartsWith("in-cluster"));
  auto list = (*reader)->List(10s);
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->items, 1u);
  EXPECT_EQ((*api)->Count("GET", kKubevirtsPath, "200"), 1u);
}

}  // namespace
}  // namespace vfio_agent::kube
