#include "vfio_gpu_agent/kube/admission_policy_reader.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "api_client.h"
#include "config.h"
#include "nlohmann/json.hpp"

namespace vfio_agent::kube {
namespace {

using Json = nlohmann::json;

// The server's own words (a Status object's message) when it sent one, else the start of the body.
std::string ServerMessage(const Json& body, const ApiResponse& response) {
  if (body.is_object() && body.contains("message") && body["message"].is_string()) {
    return body["message"].get<std::string>();
  }
  return response.body.substr(0, 200);
}

// kube-apiserver answers a GET of a missing object with a Status whose details name it; a group/version or
// resource it does not serve gets a 404 that names nothing ("the server could not find the requested resource").
bool NamesObject(const Json& body, absl::string_view name) {
  return body.is_object() && body.contains("details") && body["details"].is_object() &&
         body["details"].value("name", "") == name;
}

}  // namespace

AdmissionPolicyReader::AdmissionPolicyReader(std::unique_ptr<ApiClient> client) : client_(std::move(client)) {}
AdmissionPolicyReader::~AdmissionPolicyReader() = default;

std::string AdmissionPolicyReader::Request(absl::string_view collection, absl::string_view name) const {
  return absl::StrCat("GET ", client_->Url(absl::StrCat(collection, "/", name)));
}
const std::string& AdmissionPolicyReader::ConfigSource() const { return client_->config().source; }
uint64_t AdmissionPolicyReader::requests() const { return client_->requests(); }

absl::StatusOr<std::string> AdmissionPolicyReader::Get(absl::string_view collection, absl::string_view name,
                                                       std::chrono::milliseconds timeout) {
  absl::StatusOr<ApiResponse> response = client_->Send("GET", absl::StrCat(collection, "/", name), "", "", timeout);
  if (!response.ok()) return TransportError(response.status());
  const std::string where = absl::StrCat(Request(collection, name), ": ", response->code, " ");
  const Json body = Json::parse(response->body, nullptr, /*allow_exceptions=*/false);
  switch (response->code) {
    case 401: return absl::UnauthenticatedError(absl::StrCat(where, ServerMessage(body, *response)));
    case 403: return absl::PermissionDeniedError(absl::StrCat(where, ServerMessage(body, *response)));
    case 404:
      if (NamesObject(body, name)) return absl::NotFoundError(absl::StrCat(where, ServerMessage(body, *response)));
      return absl::UnimplementedError(absl::StrCat(where, ServerMessage(body, *response)));
    default: break;
  }
  if (response->code < 200 || response->code >= 300) {
    return absl::UnavailableError(absl::StrCat(where, ServerMessage(body, *response)));
  }
  if (!body.is_object()) return absl::DataLossError(absl::StrCat(where, "the answer is not a JSON object"));
  return std::move(response->body);
}

absl::StatusOr<std::unique_ptr<AdmissionPolicyReader>> ConnectAdmissionPolicyReader(
    const AdmissionPolicyReaderOptions& options) {
  absl::StatusOr<ClusterConfig> config = LoadClusterConfig(options.kubeconfig, options.service_account_dir);
  if (!config.ok()) return config.status();
  return std::make_unique<AdmissionPolicyReader>(std::make_unique<ApiClient>(*std::move(config)));
}

}  // namespace vfio_agent::kube
