// A kubelet device-manager simulator (reference: kubelet-device-plugin-api.md section 3) for integration
// tests and the demo. It plays the kubelet's side of the device-plugin protocol: it serves Registration on
// <dir>/kubelet.sock, dials plugins back, consumes ListAndWatch, admits pods with GetPreferredAllocation and
// Allocate, and serves the pod-resources API.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "deviceplugin/v1beta1/api.pb.h"

namespace vfio_agent::kubeletsim {

enum class Mode {
  kResourceKeyed,  // kubelet 1.25-1.35 (default): clients keyed by resource name (R22)
  kInstanceKeyed,  // kubelet >= 1.36 (PR #135437): a stream end disconnects only its own client
  kLegacy124,      // kubelet <= 1.24: Register replies at once, dials async, uses RegisterRequest.options
};

struct Options {
  std::filesystem::path dir;  // the device-plugins directory
  // Delay between deleting the sockets and listening on kubelet.sock, on Start and Restart.
  std::chrono::milliseconds kubelet_sock_delay{0};
  Mode mode = Mode::kResourceKeyed;
  std::filesystem::path pod_resources_socket;  // empty = no pod-resources server
  uint64_t seed = 1;                           // random iteration order of device sets (admission)
  std::vector<int> numa_nodes = {0, 1};        // the machine's NUMA nodes
  // --- additions to the first contract ---
  std::chrono::milliseconds dial_timeout{10000};  // the kubelet's blocking dial timeout
  std::chrono::milliseconds grace_period{std::chrono::minutes(5)};  // endpointStopGracePeriod
  // Clock for the grace period only (event timestamps always use steady_clock). Empty = steady_clock::now.
  std::function<std::chrono::steady_clock::time_point()> clock;
  // The kubelet sets no deadline on plugin RPCs; the simulator fails them after this long instead of hanging.
  std::chrono::milliseconds rpc_watchdog{10000};
  // Runs on the Register handler's thread after the plugin's endpoint is active (its ListAndWatch stream
  // starting), before the reply is sent: a reply that reaches the plugin only after its stream has begun, or
  // ended. Resource-keyed modes only. Empty = reply at once.
  std::function<void(const std::string& resource)> before_register_reply;
  // While it returns true, pod-resources List answers UNAVAILABLE and GetAllocatableResources still answers: a
  // restarted kubelet's server, one call ready before the other. Empty = List always answers.
  std::function<bool()> list_unavailable;
};

struct ResourceState {
  bool registered = false;  // a live endpoint (registered and its stream not ended)
  int64_t capacity = 0;     // healthy + unhealthy (a duplicated ID counts twice, as in the kubelet)
  int64_t allocatable = 0;  // healthy
  std::vector<std::string> healthy, unhealthy;  // sorted
  int registrations = 0;       // successful Register calls
  int list_updates = 0;        // ListAndWatch messages received
  int identical_repeats = 0;   // messages byte-identical to the previous one of the same stream
  int duplicate_ids = 0;       // duplicated IDs seen within a message, cumulative
  std::map<std::string, std::vector<int64_t>> topology;  // id -> numa ids
  // --- additions ---
  bool removed = false;  // grace period expired after the stream ended: capacity reported as explicit 0
  std::string endpoint;  // socket path of the current client
  ::v1beta1::DevicePluginOptions options;  // options of the current registration
};

struct Event {
  std::chrono::steady_clock::time_point at;
  // register (stamped when the request arrives, before validation and dial-back; detail "version=V
  // endpoint=E"), options, list (detail "devices=N healthy=H unhealthy=U[ identical_repeat][ duplicate_ids=..]"),
  // stream_end, allocate, preferred, restart, error; also: listen (server up; detail = socket path; the file
  // itself appears at bind(), a moment earlier), sockets_deleted, disconnect, close_stream, grace_expired, stop, freeze, unfreeze, list_ignored.
  std::string kind;
  std::string resource;
  std::string detail;
};

struct PodSpec {
  std::string name;
  std::map<std::string, int64_t> limits;  // one app container
  // --- additions ---
  std::string pod_namespace = "default";
  std::string container = "app";
};

struct AdmittedPod {
  std::string name;
  std::map<std::string, std::vector<std::string>> devices;  // resource -> ids (sorted)
  std::map<std::string, ::v1beta1::ContainerAllocateResponse> responses;
  // resource -> IDs the plugin answered; absent when GetPreferredAllocation was not called.
  std::map<std::string, std::vector<std::string>> preferred_calls_result;
  // --- additions ---
  std::string pod_namespace = "default";
  std::string container = "app";
  std::map<std::string, ::v1beta1::PreferredAllocationRequest> preferred_requests;
  std::map<std::string, ::v1beta1::AllocateRequest> allocate_requests;  // IDs in the order sent
};

class KubeletSim {
 public:
  explicit KubeletSim(Options options);
  ~KubeletSim();  // stops everything
  KubeletSim(const KubeletSim&) = delete;
  KubeletSim& operator=(const KubeletSim&) = delete;

  // Kubelet start (R13): mkdir 0750, delete sockets except the checkpoint, (delay), listen on kubelet.sock.
  absl::Status Start();
  // Close every plugin connection (cancels the streams), then Start again. Registered resources come back
  // as stopped endpoints with empty sets and a running grace timer, as after loading the checkpoint.
  absl::Status Restart();
  void Stop();
  // Fault: cut the current ListAndWatch stream of `resource`; kubelet.sock stays up.
  absl::Status CloseStream(const std::string& resource);
  // Fault: a stale kubelet view. While frozen, ListAndWatch messages of `resource` are read but not applied
  // (event "list_ignored"), so the device manager, Resources() and pod-resources keep the last set applied.
  // Unfreezing does not replay them: the next message the plugin sends is applied.
  absl::Status FreezeUpdates(const std::string& resource, bool frozen);
  // Fault: R22 as it strikes a re-registration. The next Register of `resource` is answered OK, but its client
  // is disconnected before its ListAndWatch stream begins (as a late end of the previous stream does in kubelets
  // before PR #135437): the plugin sees a successful Register and then no stream at all.
  void DropNextRegistration(const std::string& resource);

  std::map<std::string, ResourceState> Resources() const;
  std::vector<Event> Events() const;
  // Polls `pred` (called with the simulator) until true or timeout; returns pred's last value.
  bool WaitFor(const std::function<bool(const KubeletSim&)>& pred, std::chrono::milliseconds timeout) const;

  // Kubelet admission: devicesToAllocate (GetPreferredAllocation as in R19), then Allocate with one
  // container request per resource. Admits one pod at a time.
  absl::StatusOr<AdmittedPod> Admit(const PodSpec& pod);
  void Release(const std::string& pod_name);  // pod gone: devices freed (no RPC)
  // kubectl-describe-like "Capacity:\n  nvidia.com/X:  8\nAllocatable:\n  nvidia.com/X:  8\n".
  std::string DescribeNode() const;

  // --- additions ---
  std::filesystem::path kubelet_socket() const;  // <dir>/kubelet.sock
  std::vector<AdmittedPod> Pods() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// R2 (IsExtendedResourceName), exactly as the kubelet applies it in Register.
bool IsExtendedResourceName(const std::string& name);

}  // namespace vfio_agent::kubeletsim
