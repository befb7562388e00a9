// Where the API server is and how to authenticate to it: from a kubeconfig file or from the pod's service
// account (in-cluster). Loading reads local files only; nothing here contacts the server.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <mutex>
#include <string>
#include <string_view>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace vfio_agent::kube {

struct ClusterConfig {
  std::string server{};                  // "https://10.96.0.1:443", no trailing slash
  std::filesystem::path ca_file{};       // CA bundle file, or
  std::string ca_pem{};                  // the bundle itself (certificate-authority-data); both empty: system CAs
  bool insecure_skip_tls_verify = false;
  std::string token{};                   // a fixed bearer token, or
  std::filesystem::path token_file{};    // one re-read when it rotates
  std::filesystem::path client_cert_file{};
  std::string client_cert_pem{};
  std::filesystem::path client_key_file{};
  std::string client_key_pem{};
  std::string source{};                  // "kubeconfig /path" / "in-cluster /var/run/...": for messages
};

// current-context's cluster and user. Relative file names are relative to the kubeconfig's directory, as
// kubectl resolves them. Exec and auth-provider users are not supported (error naming them).
absl::StatusOr<ClusterConfig> LoadKubeconfig(const std::filesystem::path& path);

// The service account's token and ca.crt under service_account_dir, the server from
// KUBERNETES_SERVICE_HOST/PORT (passed in). NotFound when host is empty or there is no token file.
absl::StatusOr<ClusterConfig> LoadInClusterConfig(const std::filesystem::path& service_account_dir,
                                                  absl::string_view host, absl::string_view port);

// An RFC 1123 DNS subdomain (node names, DRA driver names): anything else would also be a path injection into the
// request URLs.
bool IsDnsSubdomain(std::string_view name);

// --kubeconfig when one is given, else the in-cluster service account (KUBERNETES_SERVICE_HOST/PORT from the
// environment): the one choice every API client of the agent makes.
absl::StatusOr<ClusterConfig> LoadClusterConfig(const std::filesystem::path& kubeconfig,
                                                const std::filesystem::path& service_account_dir);

// The bearer token to send. A token file is re-read when its modification time, size or inode changes (the
// kubelet rotates projected tokens by swapping a symlink) and after a 401. Thread-safe.
class TokenSource {
 public:
  TokenSource(std::string token, std::filesystem::path token_file);
  absl::StatusOr<std::string> Current();
  // Reads the file again whatever its metadata says; true when that gave a different token.
  bool Reload();

 private:
  absl::StatusOr<std::string> ReadLocked();

  std::mutex mutex_;
  std::string token_;
  const std::filesystem::path file_;
  struct FileStamp {
    ino_t inode = 0;
    off_t size = -1;
    int64_t mtime_ns = 0;
    bool operator==(const FileStamp&) const = default;
  };
  FileStamp stamp_;
};

}  // namespace vfio_agent::kube
