#include "vfio_gpu_agent/kube/kubevirt_reader.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "api_client.h"
#include "config.h"
#include "nlohmann/json.hpp"

namespace vfio_agent::kube {
namespace {

using Json = nlohmann::json;

// The server's own words (a Status object's message) when it sent one, else the start of the body.
std::string ServerMessage(const ApiResponse& response) {
  const Json body = Json::parse(response.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_object() && body.contains("message") && body["message"].is_string()) {
    return body["message"].get<std::string>();
  }
  return response.body.substr(0, 200);
}

}  // namespace

KubevirtReader::KubevirtReader(std::unique_ptr<ApiClient> client) : client_(std::move(client)) {}
KubevirtReader::~KubevirtReader() = default;

std::string KubevirtReader::Request() const { return absl::StrCat("GET ", client_->Url(kKubevirtsPath)); }
const std::string& KubevirtReader::ConfigSource() const { return client_->config().source; }
uint64_t KubevirtReader::requests() const { return client_->requests(); }

absl::StatusOr<KubevirtList> KubevirtReader::List(std::chrono::milliseconds timeout) {
  absl::StatusOr<ApiResponse> response = client_->Send("GET", kKubevirtsPath, "", "", timeout);
  if (!response.ok()) {
    switch (response.status().code()) {
      case absl::StatusCode::kDeadlineExceeded:
      case absl::StatusCode::kUnauthenticated:
        return response.status();
      default:
        return absl::UnavailableError(response.status().message());
    }
  }
  const std::string where = absl::StrCat(Request(), ": ", response->code, " ");
  switch (response->code) {
    case 401: return absl::UnauthenticatedError(absl::StrCat(where, ServerMessage(*response)));
    case 403: return absl::PermissionDeniedError(absl::StrCat(where, ServerMessage(*response)));
    case 404: return absl::NotFoundError(absl::StrCat(where, ServerMessage(*response)));
    default: break;
  }
  if (response->code < 200 || response->code >= 300) {
    return absl::UnavailableError(absl::StrCat(where, ServerMessage(*response)));
  }
  const Json list = Json::parse(response->body, nullptr, /*allow_exceptions=*/false);
  if (!list.is_object() || !list.contains("items") || !list["items"].is_array()) {
    return absl::DataLossError(absl::StrCat(where, "the answer is not a list (no \"items\")"));
  }
  return KubevirtList{.json = std::move(response->body), .items = list["items"].size()};
}

absl::StatusOr<std::unique_ptr<KubevirtReader>> ConnectKubevirtReader(const KubevirtReaderOptions& options) {
  absl::StatusOr<ClusterConfig> config = LoadClusterConfig(options.kubeconfig, options.service_account_dir);
  if (!config.ok()) return config.status();
  return std::make_unique<KubevirtReader>(std::make_unique<ApiClient>(*std::move(config)));
}

}  // namespace vfio_agent::kube
