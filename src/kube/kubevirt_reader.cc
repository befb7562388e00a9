#include "vfio_gpu_agent/kube/kubevirt_reader.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "api_client.h"
#include "config.h"
#include "nlohmann/json.hpp"

namespace vfio_agent::kube {

using Json = nlohmann::json;

KubevirtReader::KubevirtReader(std::unique_ptr<ApiClient> client) : client_(std::move(client)) {}
KubevirtReader::~KubevirtReader() = default;

std::string KubevirtReader::Request() const { return absl::StrCat("GET ", client_->Url(kKubevirtsPath)); }
const std::string& KubevirtReader::ConfigSource() const { return client_->config().source; }
uint64_t KubevirtReader::requests() const { return client_->requests(); }

absl::StatusOr<KubevirtList> KubevirtReader::List(std::chrono::milliseconds timeout) {
  absl::StatusOr<ApiResponse> response = GetOk(*client_, kKubevirtsPath, timeout);
  if (!response.ok()) return response.status();
  const std::string where = absl::StrCat(Request(), ": ", response->code, " ");
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
