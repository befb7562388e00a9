// `validate`'s DRA layer in a cluster: the node's ResourceSlices and the DeviceClasses (resource.k8s.io/v1), read
// with the credentials `run` uses. One blocking GET with a deadline per call.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "vfio_gpu_agent/kube/kubevirt_reader.h"

namespace vfio_agent::kube {

class DraObjectsReader {
 public:
  explicit DraObjectsReader(std::unique_ptr<ApiClient> client);
  ~DraObjectsReader();
  DraObjectsReader(const DraObjectsReader&) = delete;
  DraObjectsReader& operator=(const DraObjectsReader&) = delete;

  // The list as the server sent it (JSON). Errors as KubevirtReader::List's, naming the URL.
  absl::StatusOr<std::string> NodeSlices(const std::string& node_name, std::chrono::milliseconds timeout);
  absl::StatusOr<std::string> DeviceClasses(std::chrono::milliseconds timeout);

  // "GET https://.../apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3Dnode-a": evidence.
  std::string SlicesRequest(const std::string& node_name) const;
  std::string ClassesRequest() const;
  const std::string& ConfigSource() const;

 private:
  std::unique_ptr<ApiClient> client_;
};

// As ConnectKubevirtReader: NotFound when there is no cluster to talk to.
absl::StatusOr<std::unique_ptr<DraObjectsReader>> ConnectDraObjectsReader(const KubevirtReaderOptions& options);

}  // namespace vfio_agent::kube
