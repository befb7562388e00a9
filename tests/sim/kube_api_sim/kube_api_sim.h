// Runs the fake kube-apiserver (kube_api_sim.py) for a test: started on an ephemeral 127.0.0.1 port, stopped
// on destruction. Faults are injected with Control(); every API request the server answered is in Log().
//
//   auto api = vfio_agent::sim::KubeApiSim::Start(tmp_dir, {.nodes = {"node-a"}});
//   ASSERT_TRUE(api.ok()) << api.status();
//   auto kubeconfig = (*api)->WriteKubeconfig(tmp_dir / "kubeconfig");   // for --kubeconfig
//   ASSERT_TRUE((*api)->Control("fail PATCH /api/v1/nodes 503 2").ok());  // the next two patches get 503
//   EXPECT_TRUE((*api)->WaitFor([&] { return (*api)->Count("PATCH", "/api/v1/nodes/node-a/status", "200") == 1; }));
//
// Commands (see kube_api_sim.py): token T | node NAME [LABELS_JSON] | relabel NAME LABELS_JSON | delete-node NAME |
// touch-node NAME | compact (every node watch ends with 410 Gone) |
// get-node NAME | events | fail METHOD PREFIX CODE COUNT [RETRY_AFTER] | deny-policy METHOD PREFIX CODE COUNT |
// cut METHOD PREFIX COUNT |
// hang METHOD PREFIX COUNT | release | clear-faults | kubevirts JSON_ITEMS | no-kubevirt (the default: 404) |
// deny VERB RESOURCE.GROUP | allow VERB RESOURCE.GROUP (RBAC, e.g. `deny list kubevirts.kubevirt.io`: 403) |
// admission policy|binding JSON | delete-admission policy|binding NAME | admission-api on|off | slices |
// delete-slices NODE (a kubelet's start) | patch-slice NAME JSON | feature-gates G=B,... | compact (410 for older
// watches) | close-watches | bookmark-interval SECONDS
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace vfio_agent::sim {

struct KubeApiSimOptions {
  std::string token = "kube-api-sim-token";
  std::vector<std::string> nodes = {"node-a"};
  // https with a self-signed certificate for 127.0.0.1 made by the openssl CLI; ca_file() is then its PEM.
  bool tls = false;
  // With tls: also accept a client certificate (client_cert_file()/client_key_file(), self-signed, CN
  // vfio-gpu-agent) instead of the bearer token, as kube-apiserver's x509 authentication does.
  bool client_cert = false;
  // kube-apiserver's --feature-gates ("DRADeviceTaints=false" is a 1.34/1.35 server: it drops devices[].taints);
  // empty: v1.36's defaults.
  std::string feature_gates;
};

// One request the server answered. status is the HTTP code ("200", "409", ...) or "cut" / "hang".
struct KubeApiRequest {
  std::string method;
  std::string path;
  std::string content_type;
  std::string status;
  nlohmann::json body;  // parsed JSON body, null when there was none
  bool watch = false;   // a watch (GET ...?watch=true), logged when it starts
};

class KubeApiSim {
 public:
  static std::filesystem::path Script();
  // False when python3 (or, for tls, openssl) is missing: tests then skip.
  static bool Available(bool tls = false);

  // work_dir holds the log (and the certificate); it must exist and outlive the server.
  static absl::StatusOr<std::unique_ptr<KubeApiSim>> Start(const std::filesystem::path& work_dir,
                                                           KubeApiSimOptions options = {});
  KubeApiSim(const KubeApiSim&) = delete;
  KubeApiSim& operator=(const KubeApiSim&) = delete;
  // Closes the server's stdin (it exits), SIGKILL after 5 s.
  ~KubeApiSim();

  const std::string& url() const { return url_; }  // "http://127.0.0.1:PORT" (https with tls)
  const std::string& token() const { return token_; }
  const std::filesystem::path& ca_file() const { return ca_file_; }  // empty without tls
  const std::filesystem::path& client_cert_file() const { return client_cert_file_; }  // empty without client_cert
  const std::filesystem::path& client_key_file() const { return client_key_file_; }
  pid_t pid() const { return pid_; }

  // A kubeconfig whose current context talks to this server with the bearer token (and CA with tls).
  absl::StatusOr<std::filesystem::path> WriteKubeconfig(const std::filesystem::path& path) const;

  // One command; the text after "OK" (JSON for get-node and events) or an error with the server's reason.
  // Changing the token here does not change token().
  absl::StatusOr<std::string> Control(absl::string_view command);
  absl::StatusOr<nlohmann::json> Node(absl::string_view name);  // get-node
  absl::StatusOr<nlohmann::json> Events();                      // every stored Event
  absl::StatusOr<nlohmann::json> Slices();                      // every stored ResourceSlice, by name

  std::vector<KubeApiRequest> Log() const;
  // Requests whose method matches ("" = any), whose path starts with path_prefix and whose status matches
  // ("" = any).
  size_t Count(absl::string_view method, absl::string_view path_prefix, absl::string_view status = "") const;
  // Polls `done` every 10 ms until it holds or the timeout passes (generous by default: this is for "the
  // other side got there", not for timing).
  static bool WaitFor(const std::function<bool()>& done,
                      std::chrono::milliseconds timeout = std::chrono::seconds(20));

 private:
  KubeApiSim() = default;

  pid_t pid_ = -1;
  int control_in_ = -1;   // the server's stdin
  int control_out_ = -1;  // the server's stdout
  std::string url_;
  std::string token_;
  std::filesystem::path ca_file_;
  std::filesystem::path client_cert_file_;
  std::filesystem::path client_key_file_;
  std::filesystem::path log_file_;
  std::mutex control_mutex_;
  std::string pending_;  // stdout read past the last reply line
};

}  // namespace vfio_agent::sim
