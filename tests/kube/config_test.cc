#include "config.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <fstream>

#include "absl/strings/escaping.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "support/sysfs_tree.h"
#include "vfio_gpu_agent/kube/node_reporter.h"

namespace vfio_agent::kube {
namespace {

using ::testing::HasSubstr;
using vfio_agent::testing::TempDir;

void Write(const std::filesystem::path& path, const std::string& content) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path, std::ios::trunc) << content;
}

std::string Kubeconfig(const std::string& cluster, const std::string& user) {
  return "apiVersion: v1\nkind: Config\ncurrent-context: work\n"
         "contexts:\n- name: other\n  context: {cluster: nowhere, user: nobody}\n"
         "- name: work\n  context:\n    cluster: c1\n    user: u1\n"
         "clusters:\n- name: c1\n  cluster:\n" + cluster +
         "users:\n- name: u1\n  user:\n" + user;
}

TEST(KubeconfigTest, TokenAndCaFileRelativeToTheKubeconfig) {
  TempDir dir;
  Write(dir.path() / "certs/ca.pem", "CA");
  const auto path = dir.path() / "kubeconfig";
  Write(path, Kubeconfig("    server: https://10.0.0.1:6443/\n    certificate-authority: certs/ca.pem\n", "    token: abc\n"));
  absl::StatusOr<ClusterConfig> config = LoadKubeconfig(path);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://10.0.0.1:6443");
  EXPECT_EQ(config->ca_file, dir.path() / "certs/ca.pem");
  EXPECT_EQ(config->token, "abc");
  EXPECT_FALSE(config->insecure_skip_tls_verify);
}

TEST(KubeconfigTest, InlineDataIsDecoded) {
  TempDir dir;
  const auto path = dir.path() / "kubeconfig";
  Write(path, Kubeconfig("    server: https://api.example:443\n    certificate-authority-data: " +
                             absl::Base64Escape("CA PEM") + "\n",
                         "    client-certificate-data: " + absl::Base64Escape("CERT PEM") +
                             "\n    client-key-data: " + absl::Base64Escape("KEY PEM") + "\n"));
  absl::StatusOr<ClusterConfig> config = LoadKubeconfig(path);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->ca_pem, "CA PEM");
  EXPECT_EQ(config->client_cert_pem, "CERT PEM");
  EXPECT_EQ(config->client_key_pem, "KEY PEM");
  EXPECT_TRUE(config->token.empty());
}

TEST(KubeconfigTest, ClientCertificateFilesTokenFileAndInsecure) {
  TempDir dir;
  Write(dir.path() / "tls.crt", "CERT");
  Write(dir.path() / "tls.key", "KEY");
  Write(dir.path() / "token", "tok\n");
  const auto path = dir.path() / "kubeconfig";
  Write(path, Kubeconfig("    server: https://h:1\n    insecure-skip-tls-verify: true\n",
                         "    client-certificate: tls.crt\n    client-key: " + (dir.path() / "tls.key").string() +
                             "\n    tokenFile: token\n"));
  absl::StatusOr<ClusterConfig> config = LoadKubeconfig(path);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->insecure_skip_tls_verify);
  EXPECT_EQ(config->client_cert_file, dir.path() / "tls.crt");
  EXPECT_EQ(config->client_key_file, dir.path() / "tls.key");
  EXPECT_EQ(config->token_file, dir.path() / "token");
}

TEST(KubeconfigTest, ErrorsNameTheFileAndWhatIsWrong) {
  TempDir dir;
  const auto path = dir.path() / "kubeconfig";
  EXPECT_THAT(LoadKubeconfig(path).status().message(), HasSubstr(path.string()));

  Write(path, "clusters: [unclosed\n");
  absl::Status invalid_yaml = LoadKubeconfig(path).status();
  EXPECT_TRUE(absl::IsInvalidArgument(invalid_yaml)) << invalid_yaml;
  EXPECT_THAT(invalid_yaml.message(), HasSubstr(path.string()));

  Write(path, "apiVersion: v1\nkind: Config\n");
  EXPECT_THAT(LoadKubeconfig(path).status().message(), HasSubstr("no current-context"));

  Write(path, Kubeconfig("    server: https://h:1\n    certificate-authority: missing.pem\n", "    token: t\n"));
  EXPECT_THAT(LoadKubeconfig(path).status().message(), HasSubstr("missing.pem"));

  Write(path, Kubeconfig("    server: https://h:1\n", "    exec:\n      command: aws\n"));
  EXPECT_TRUE(absl::IsUnimplemented(LoadKubeconfig(path).status()));

  Write(path, Kubeconfig("    server: https://h:1\n", "    client-certificate-data: " + absl::Base64Escape("C") + "\n"));
  EXPECT_THAT(LoadKubeconfig(path).status().message(), HasSubstr("without its key"));

  Write(path, Kubeconfig("    server: https://h:1\n    certificate-authority-data: '%%%'\n", "    token: t\n"));
  EXPECT_THAT(LoadKubeconfig(path).status().message(), HasSubstr("base64"));

  // A device instead of a file: a clear error, not a read that never ends.
  EXPECT_FALSE(LoadKubeconfig("/dev/zero").ok());
}

TEST(InClusterTest, ServiceAccountAndServiceEnvironment) {
  TempDir dir;
  Write(dir.path() / "token", "sa-token\n");
  Write(dir.path() / "ca.crt", "CA");
  absl::StatusOr<ClusterConfig> config = LoadInClusterConfig(dir.path(), "10.96.0.1", "443");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://10.96.0.1:443");
  EXPECT_EQ(config->token_file, dir.path() / "token");
  EXPECT_EQ(config->ca_file, dir.path() / "ca.crt");

  absl::StatusOr<ClusterConfig> ipv6 = LoadInClusterConfig(dir.path(), "fd00::1", "6443");
  ASSERT_TRUE(ipv6.ok());
  EXPECT_EQ(ipv6->server, "https://[fd00::1]:6443");
}

TEST(InClusterTest, NotInAClusterIsNotFound) {
  TempDir dir;
  EXPECT_TRUE(absl::IsNotFound(LoadInClusterConfig(dir.path(), "", "").status()));
  EXPECT_TRUE(absl::IsNotFound(LoadInClusterConfig(dir.path(), "10.96.0.1", "443").status()));  // no token
}

TEST(TokenSourceTest, RereadWhenTheFileRotates) {
  TempDir dir;
  const auto token = dir.path() / "token";
  Write(token, "first\n");
  TokenSource source("", token);
  EXPECT_EQ(*source.Current(), "first");
  // The kubelet's rotation: a new file swapped in (new inode).
  Write(dir.path() / "token.new", "second");
  std::filesystem::rename(dir.path() / "token.new", token);
  EXPECT_EQ(*source.Current(), "second");
}

TEST(TokenSourceTest, ReloadSeesAChangeTheMetadataHid) {
  TempDir dir;
  const auto token = dir.path() / "token";
  Write(token, "aaaa");
  struct stat before {};
  ASSERT_EQ(::stat(token.c_str(), &before), 0);
  TokenSource source("", token);
  EXPECT_EQ(*source.Current(), "aaaa");
  // Same inode, size and modification time: only a 401 makes the source look again.
  { std::fstream(token, std::ios::in | std::ios::out) << "bbbb"; }
  const timespec times[2] = {before.st_atim, before.st_mtim};
  ASSERT_EQ(::utimensat(AT_FDCWD, token.c_str(), times, 0), 0);
  EXPECT_EQ(*source.Current(), "aaaa");
  EXPECT_TRUE(source.Reload());
  EXPECT_EQ(*source.Current(), "bbbb");
  EXPECT_FALSE(source.Reload());
}

TEST(ConnectTest, NoClusterIsNotFoundAndNodeNameIsRequired) {
  TempDir dir;
  ::unsetenv("KUBERNETES_SERVICE_HOST");
  ConnectOptions in_cluster;
  in_cluster.service_account_dir = dir.path();
  in_cluster.node_name = "node-a";
  auto none = ConnectNodeReporter(in_cluster);
  EXPECT_TRUE(absl::IsNotFound(none.status())) << none.status();
  EXPECT_TRUE(absl::IsInvalidArgument(ConnectNodeReporter({.kubeconfig = "/nonexistent", .node_name = ""}).status()));
  auto bad_name = ConnectNodeReporter({.kubeconfig = "/nonexistent", .node_name = "../etc"});
  EXPECT_THAT(bad_name.status().message(), HasSubstr("invalid node name"));
  auto bad_kubeconfig = ConnectNodeReporter({.kubeconfig = dir.path() / "missing", .node_name = "node-a"});
  EXPECT_TRUE(absl::IsInvalidArgument(bad_kubeconfig.status())) << bad_kubeconfig.status();
}

}  // namespace
}  // namespace vfio_agent::kube
