#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "api_client.h"
#include "config.h"
#include "reporter.h"
#include "vfio_gpu_agent/kube/node_reporter.h"

namespace vfio_agent::kube {
absl::StatusOr<std::unique_ptr<NodeReporter>> ConnectNodeReporter(const ConnectOptions& options) {
  if (options.node_name.empty()) {
    return absl::InvalidArgumentError("no node name for the Kubernetes API: set NODE_NAME (downward API) or --node-name");
  }
  if (!IsDnsSubdomain(options.node_name)) {
    return absl::InvalidArgumentError(absl::StrCat("invalid node name \"", options.node_name,
                                                   "\": lower-case letters, digits, '-' and '.' only"));
  }
  absl::StatusOr<ClusterConfig> config = LoadClusterConfig(options.kubeconfig, options.service_account_dir);
  if (!config.ok()) return config.status();
  return StartNodeReporter(std::make_unique<ApiClient>(*std::move(config)), ReporterOptions{.node_name = options.node_name, .kubevirt_interval = options.kubevirt_interval});
}

}  // namespace vfio_agent::kube
