// A kubelet DRA-manager simulator (reference: /work/shared/reference/dra.md section 1.3) for the DRA driver's
// tests. It plays the kubelet's side: its plugin watcher watches the registry directory, dials each new socket,
// calls GetInfo, validates the answer as the v1.36 kubelet does, answers NotifyRegistrationStatus, and dials the
// endpoint the plugin named; it calls NodePrepareResources/NodeUnprepareResources through the service version it
// chose; and it restarts (connections dropped, the registry directory walked again, every plugin re-dialled).
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dra-health/v1alpha1/api.pb.h"
#include "dra/v1/api.pb.h"

namespace vfio_agent::kubeletsim::dra {

namespace drav1 = ::k8s::io::kubelet::pkg::apis::dra::v1;

struct Options {
  std::filesystem::path registry_dir;  // the kubelet's plugins_registry
  // The DRA services this kubelet speaks (v1.36: servicesSupportedByKubelet). A plugin's list is walked in the
  // plugin's order and the first one found here is used.
  std::vector<std::string> supported_services = {"v1.DRAPlugin", "v1beta1.DRAPlugin"};
  // The kubelet's GetInfo timeout is 1 s; a test on a loaded machine needs more (nothing here waits for it to pass).
  std::chrono::milliseconds get_info_timeout{20000};
  std::chrono::milliseconds call_timeout{45000};  // defaultClientCallTimeout
  // ResourceHealthStatus (beta, on in v1.36): after each registration the kubelet opens
  // DRAResourceHealth.NodeWatchResources on the plugin's connection and opens it again this long after it failed
  // or ended. Which version it opens is the kubelet release's (health_api).
  bool watch_health = true;
  // k136: v1alpha1, the only version v1.36 knows, whatever the plugin's supported_versions say. k137
  // (pickHealthService): "v1.DRAResourceHealth" when the plugin lists it, else "v1alpha1.DRAResourceHealth" when
  // listed, else no stream at all.
  enum class HealthApi { k136, k137 };
  HealthApi health_api = HealthApi::k136;
  std::chrono::milliseconds health_retry{5000};
};

// One registered DRA plugin endpoint, keyed by driver name.
struct Plugin {
  std::string driver;
  std::string endpoint;      // the DRA socket the kubelet dials (GetInfo's endpoint)
  std::string service;       // the chosen service, e.g. "v1.DRAPlugin"
  std::vector<std::string> supported_versions;  // as GetInfo listed them
  std::string health_service;  // the DRAResourceHealth version the health stream uses; empty: none
  std::filesystem::path registration_socket;
  bool connected = false;  // the endpoint's channel reached READY after registration
};

struct Event {
  std::chrono::steady_clock::time_point at;
  // register (accepted and notified), refused (detail = the error sent in NotifyRegistrationStatus), deregister
  // (its registration socket was removed), ignored (not a socket, or a dot-file), error (GetInfo or Notify
  // failed: detail), restart, prepare, unprepare, health-stream (NodeWatchResources opened: detail = the service,
  // e.g. "v1.DRAResourceHealth"), health-none (a 1.37 kubelet found no health service it knows), health-message (one
  // device list received), health-end (the stream failed or ended: detail = code and message, e.g. "12
  // unknown service v1alpha1.DRAResourceHealth" from a plugin without the service).
  std::string kind;
  std::string driver;  // empty when GetInfo did not answer
  std::string detail;
};

class KubeletDraSim {
 public:
  explicit KubeletDraSim(Options options);
  ~KubeletDraSim();  // Stop()
  KubeletDraSim(const KubeletDraSim&) = delete;
  KubeletDraSim& operator=(const KubeletDraSim&) = delete;

  // Creates the registry directory, registers the sockets already there, then watches it.
  absl::Status Start();
  // Kubelet restart: stop watching, forget every plugin and drop its connections, then Start again.
  absl::Status Restart();
  void Stop();

  std::map<std::string, Plugin> Plugins() const;
  std::vector<Event> Events() const;
  int Count(const std::string& kind) const;  // events of that kind
  // Polls `pred` until true or `timeout`; returns its last value.
  bool WaitFor(const std::function<bool(const KubeletDraSim&)>& pred, std::chrono::milliseconds timeout) const;

  // Calls the driver's registered endpoint through its chosen service version (v1beta1 answers are read back as
  // v1, their wire shape). A gRPC error or an unregistered driver is an error status.
  absl::StatusOr<drav1::NodePrepareResourcesResponse> Prepare(const std::string& driver,
                                                               const std::vector<drav1::Claim>& claims);
  absl::StatusOr<drav1::NodeUnprepareResourcesResponse> Unprepare(const std::string& driver,
                                                                   const std::vector<drav1::Claim>& claims);

  // The last device list the driver's health stream sent since the plugin registered (nullopt before the first);
  // a v1 list is carried over to v1alpha1's messages, which have the same fields.
  std::optional<::v1alpha1::NodeWatchResourcesResponse> LatestHealth(const std::string& driver) const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

drav1::Claim MakeClaim(const std::string& namespace_name, const std::string& name, const std::string& uid);

}  // namespace vfio_agent::kubeletsim::dra
