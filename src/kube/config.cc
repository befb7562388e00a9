#include "config.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "yaml-cpp/yaml.h"

namespace vfio_agent::kube {
namespace {

// Tokens, CA bundles and keys are small; a bigger file (or /dev/zero) is a mistake, not a credential.
constexpr std::streamsize kMaxCredentialFile = 1 << 20;

absl::StatusOr<std::string> ReadSmallFile(const std::filesystem::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    int err = errno;
    std::string message = absl::StrCat("cannot read ", path.string(), ": ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(message) : absl::PermissionDeniedError(message);
  }
  if (!S_ISREG(st.st_mode)) return absl::InvalidArgumentError(absl::StrCat(path.string(), " is not a regular file"));
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::PermissionDeniedError(absl::StrCat("cannot open ", path.string()));
  std::string content(static_cast<size_t>(kMaxCredentialFile) + 1, '\0');
  in.read(content.data(), kMaxCredentialFile + 1);
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading ", path.string()));
  content.resize(static_cast<size_t>(in.gcount()));
  if (content.size() > static_cast<size_t>(kMaxCredentialFile)) {
    return absl::InvalidArgumentError(absl::StrCat(path.string(), " is larger than 1 MiB"));
  }
  return content;
}

std::string TrimToken(std::string token) {
  return std::string(absl::StripAsciiWhitespace(token));
}

// A YAML scalar or "" when absent. yaml-cpp throws on type mismatches; the caller catches.
std::string Scalar(const YAML::Node& node, const char* key) {
  const YAML::Node value = node[key];
  return value && value.IsScalar() ? value.as<std::string>() : std::string();
}

// The entry of a named list (clusters, users, contexts) whose name matches; its inner map (cluster: ...).
YAML::Node FindNamed(const YAML::Node& root, const char* list, const char* inner, const std::string& name) {
  const YAML::Node entries = root[list];
  if (!entries || !entries.IsSequence()) return YAML::Node();
  for (const YAML::Node& entry : entries) {
    if (entry.IsMap() && Scalar(entry, "name") == name) return entry[inner];
  }
  return YAML::Node();
}

absl::StatusOr<std::string> DecodeData(const std::string& base64, const std::filesystem::path& path, const char* field) {
  std::string decoded;
  if (!absl::Base64Unescape(base64, &decoded)) {
    return absl::InvalidArgumentError(absl::StrCat(path.string(), ": ", field, " is not valid base64"));
  }
  return decoded;
}

absl::StatusOr<ClusterConfig> ParseKubeconfig(const YAML::Node& root, const std::filesystem::path& path) {
  auto invalid = [&](absl::string_view why) { return absl::InvalidArgumentError(absl::StrCat(path.string(), ": ", why)); };
  if (!root.IsMap()) return invalid("not a kubeconfig (no YAML map)");
  const std::string context_name = Scalar(root, "current-context");
  if (context_name.empty()) return invalid("no current-context");
  const YAML::Node context = FindNamed(root, "contexts", "context", context_name);
  if (!context || !context.IsMap()) return invalid(absl::StrCat("context \"", context_name, "\" not found"));
  const std::string cluster_name = Scalar(context, "cluster");
  const std::string user_name = Scalar(context, "user");
  const YAML::Node cluster = FindNamed(root, "clusters", "cluster", cluster_name);
  if (!cluster || !cluster.IsMap()) return invalid(absl::StrCat("cluster \"", cluster_name, "\" not found"));

  const std::filesystem::path base = path.parent_path();
  auto resolve = [&](const std::string& file) -> std::filesystem::path {
    if (file.empty()) return {};
    std::filesystem::path p(file);
    return p.is_absolute() ? p : base / p;
  };

  ClusterConfig config;
  config.source = absl::StrCat("kubeconfig ", path.string());
  config.server = std::string(absl::StripSuffix(Scalar(cluster, "server"), "/"));
  if (config.server.empty()) return invalid(absl::StrCat("cluster \"", cluster_name, "\" has no server"));
  if (!config.server.starts_with("https://") && !config.server.starts_with("http://")) {
    return invalid(absl::StrCat("server ", config.server, " is not an http(s) URL"));
  }
  config.insecure_skip_tls_verify = Scalar(cluster, "insecure-skip-tls-verify") == "true";
  config.ca_file = resolve(Scalar(cluster, "certificate-authority"));
  if (std::string data = Scalar(cluster, "certificate-authority-data"); !data.empty()) {
    absl::StatusOr<std::string> pem = DecodeData(data, path, "certificate-authority-data");
    if (!pem.ok()) return pem.status();
    config.ca_pem = *std::move(pem);
    config.ca_file.clear();
  }

  if (!user_name.empty()) {
    const YAML::Node user = FindNamed(root, "users", "user", user_name);
    if (!user || !user.IsMap()) return invalid(absl::StrCat("user \"", user_name, "\" not found"));
    if (user["exec"] || user["auth-provider"]) {
      return absl::UnimplementedError(absl::StrCat(path.string(), ": user \"", user_name,
                                                   "\" authenticates through an exec or auth-provider plugin, which "
                                                   "vfio-gpu-agent does not run; use a token or a client certificate"));
    }
    config.token = Scalar(user, "token");
    config.token_file = resolve(Scalar(user, "tokenFile"));
    if (config.token_file.empty()) config.token_file = resolve(Scalar(user, "token-file"));
    config.client_cert_file = resolve(Scalar(user, "client-certificate"));
    config.client_key_file = resolve(Scalar(user, "client-key"));
    if (std::string data = Scalar(user, "client-certificate-data"); !data.empty()) {
      absl::StatusOr<std::string> pem = DecodeData(data, path, "client-certificate-data");
      if (!pem.ok()) return pem.status();
      config.client_cert_pem = *std::move(pem);
      config.client_cert_file.clear();
    }
    if (std::string data = Scalar(user, "client-key-data"); !data.empty()) {
      absl::StatusOr<std::string> pem = DecodeData(data, path, "client-key-data");
      if (!pem.ok()) return pem.status();
      config.client_key_pem = *std::move(pem);
      config.client_key_file.clear();
    }
    const bool has_cert = !config.client_cert_file.empty() || !config.client_cert_pem.empty();
    const bool has_key = !config.client_key_file.empty() || !config.client_key_pem.empty();
    if (has_cert != has_key) return invalid(absl::StrCat("user \"", user_name, "\" has a client certificate without its key or the other way round"));
  }
  // Files named must be readable now: a typo is a configuration error at start, not an API failure later.
  for (const std::filesystem::path* file : {&config.ca_file, &config.token_file, &config.client_cert_file, &config.client_key_file}) {
    if (file->empty()) continue;
    absl::StatusOr<std::string> content = ReadSmallFile(*file);
    if (!content.ok()) return absl::InvalidArgumentError(absl::StrCat(path.string(), ": ", content.status().message()));
  }
  return config;
}

}  // namespace

absl::StatusOr<ClusterConfig> LoadKubeconfig(const std::filesystem::path& path) {
  absl::StatusOr<std::string> text = ReadSmallFile(path);
  if (!text.ok()) return absl::InvalidArgumentError(text.status().message());
  try {
    return ParseKubeconfig(YAML::Load(*text), path);
  } catch (const YAML::Exception& error) {
    return absl::InvalidArgumentError(absl::StrCat(path.string(), ": invalid kubeconfig: ", error.what()));
  }
}

absl::StatusOr<ClusterConfig> LoadInClusterConfig(const std::filesystem::path& service_account_dir,
                                                  absl::string_view host, absl::string_view port) {
  if (host.empty()) return absl::NotFoundError("not in a cluster: KUBERNETES_SERVICE_HOST is not set");
  ClusterConfig config;
  config.source = absl::StrCat("in-cluster ", service_account_dir.string());
  config.token_file = service_account_dir / "token";
  absl::StatusOr<std::string> token = ReadSmallFile(config.token_file);
  if (!token.ok()) {
    if (absl::IsNotFound(token.status())) {
      return absl::NotFoundError(absl::StrCat("not in a cluster: no service account token (", token.status().message(), ")"));
    }
    return token.status();
  }
  const std::filesystem::path ca = service_account_dir / "ca.crt";
  if (absl::StatusOr<std::string> bundle = ReadSmallFile(ca); !bundle.ok()) return bundle.status();
  config.ca_file = ca;
  // An IPv6 service address needs brackets in a URL.
  const bool ipv6 = host.find(':') != absl::string_view::npos;
  config.server = absl::StrCat("https://", ipv6 ? "[" : "", host, ipv6 ? "]" : "", ":", port.empty() ? "443" : port);
  return config;
}

TokenSource::TokenSource(std::string token, std::filesystem::path token_file)
    : token_(TrimToken(std::move(token))), file_(std::move(token_file)) {}

absl::StatusOr<std::string> TokenSource::ReadLocked() {
  struct stat st {};
  if (::stat(file_.c_str(), &st) != 0) {
    return absl::UnauthenticatedError(absl::StrCat("cannot read token ", file_.string(), ": ", std::strerror(errno)));
  }
  FileStamp stamp{st.st_ino, st.st_size, int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec};
  if (stamp == stamp_ && !token_.empty()) return token_;
  absl::StatusOr<std::string> content = ReadSmallFile(file_);
  if (!content.ok()) return absl::UnauthenticatedError(content.status().message());
  token_ = TrimToken(*std::move(content));
  stamp_ = stamp;
  return token_;
}

absl::StatusOr<std::string> TokenSource::Current() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (file_.empty()) return token_;
  return ReadLocked();
}

bool TokenSource::Reload() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (file_.empty()) return false;
  const std::string before = token_;
  stamp_ = FileStamp{};
  absl::StatusOr<std::string> token = ReadLocked();
  return token.ok() && *token != before;
}

bool IsDnsSubdomain(std::string_view name) {
  if (name.empty() || name.size() > 253) return false;
  size_t label_start = 0;
  for (size_t i = 0; i <= name.size(); ++i) {
    if (i < name.size() && name[i] != '.') {
      const char c = name[i];
      if (!absl::ascii_islower(c) && !absl::ascii_isdigit(c) && c != '-') return false;
      continue;
    }
    // A label: not empty, at most 63, starting and ending with an alphanumeric.
    if (i == label_start || i - label_start > 63 || name[label_start] == '-' || name[i - 1] == '-') return false;
    label_start = i + 1;
  }
  return true;
}

absl::StatusOr<ClusterConfig> LoadClusterConfig(const std::filesystem::path& kubeconfig,
                                                const std::filesystem::path& service_account_dir) {
  if (!kubeconfig.empty()) return LoadKubeconfig(kubeconfig);
  auto env = [](const char* name) {
    const char* value = std::getenv(name);
    return value == nullptr ? absl::string_view() : absl::string_view(value);
  };
  return LoadInClusterConfig(service_account_dir, env("KUBERNETES_SERVICE_HOST"), env("KUBERNETES_SERVICE_PORT"));
}

}  // namespace vfio_agent::kube
