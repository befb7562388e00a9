#include "vfio_gpu_agent/kube/dra_objects_reader.h"

#include "absl/strings/str_cat.h"
#include "api_client.h"
#include "config.h"
#include "nlohmann/json.hpp"

namespace vfio_agent::kube {
namespace {

constexpr char kClassesPath[] = "/apis/resource.k8s.io/v1/deviceclasses";

// Node names are DNS subdomains: nothing in them needs escaping but the selector's '='.
std::string SlicesPath(const std::string& node_name) {
  return absl::StrCat(kResourceSlicesPath, "?fieldSelector=spec.nodeName%3D", node_name);
}

absl::StatusOr<std::string> GetList(ApiClient& client, const std::string& path, std::chrono::milliseconds timeout) {
  absl::StatusOr<ApiResponse> response = GetOk(client, path, timeout);
  if (!response.ok()) return response.status();
  const nlohmann::json list = nlohmann::json::parse(response->body, nullptr, /*allow_exceptions=*/false);
  if (!list.is_object() || !list.contains("items") || !list["items"].is_array()) {
    return absl::DataLossError(
        absl::StrCat("GET ", client.Url(path), ": ", response->code, " the answer is not a list (no \"items\")"));
  }
  return std::move(response->body);
}

}  // namespace

DraObjectsReader::DraObjectsReader(std::unique_ptr<ApiClient> client) : client_(std::move(client)) {}
DraObjectsReader::~DraObjectsReader() = default;

absl::StatusOr<std::string> DraObjectsReader::NodeSlices(const std::string& node_name,
                                                         std::chrono::milliseconds timeout) {
  return GetList(*client_, SlicesPath(node_name), timeout);
}

absl::StatusOr<std::string> DraObjectsReader::DeviceClasses(std::chrono::milliseconds timeout) {
  return GetList(*client_, kClassesPath, timeout);
}

std::string DraObjectsReader::SlicesRequest(const std::string& node_name) const {
  return absl::StrCat("GET ", client_->Url(SlicesPath(node_name)));
}
std::string DraObjectsReader::ClassesRequest() const { return absl::StrCat("GET ", client_->Url(kClassesPath)); }
const std::string& DraObjectsReader::ConfigSource() const { return client_->config().source; }

absl::StatusOr<std::unique_ptr<DraObjectsReader>> ConnectDraObjectsReader(const KubevirtReaderOptions& options) {
  absl::StatusOr<ClusterConfig> config = LoadClusterConfig(options.kubeconfig, options.service_account_dir);
  if (!config.ok()) return config.status();
  return std::make_unique<DraObjectsReader>(std::make_unique<ApiClient>(*std::move(config)));
}

}  // namespace vfio_agent::kube
