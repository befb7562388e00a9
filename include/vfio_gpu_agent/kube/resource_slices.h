// The node's ResourceSlices (resource.k8s.io/v1) of one DRA driver: one pool named after the node, owned by the
// Node object, at most 128 devices a slice (64 in a slice with a tainted device). Publish makes what the API server
// holds equal to a device list and writes only the difference: nothing when it already matches (a pass every resync
// costs one list). ResourceSliceWatch tells when someone else deleted or changed them.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace vfio_agent::kube {

class ApiClient;
class ListWatcher;

inline constexpr size_t kMaxDevicesPerSlice = 128;  // resource.k8s.io/v1 ResourceSliceMaxDevices
// ResourceSliceMaxDevicesWithAdvancedFeatures: kube-apiserver 1.36 refuses (422) a slice of more devices when any
// of them has taints, consumes counters or has a list-type attribute (pkg/apis/resource/validation); binding
// conditions, bindsToNode and allowMultipleAllocations do not count. Of those we publish only taints.
inline constexpr size_t kMaxDevicesPerSliceWithAdvancedFeatures = 64;

// One value of a device attribute (resource.k8s.io/v1 DeviceAttribute holds exactly one).
struct DeviceAttribute {
  enum class Kind { kString, kInt, kBool, kVersion };
  Kind kind = Kind::kString;
  std::string text;  // kString, kVersion (semver)
  int64_t number = 0;
  bool flag = false;

  static DeviceAttribute String(std::string value) { return {.kind = Kind::kString, .text = std::move(value)}; }
  static DeviceAttribute Int(int64_t value) { return {.kind = Kind::kInt, .number = value}; }
  static DeviceAttribute Bool(bool value) { return {.kind = Kind::kBool, .flag = value}; }
  static DeviceAttribute Version(std::string value) { return {.kind = Kind::kVersion, .text = std::move(value)}; }
  bool operator==(const DeviceAttribute&) const = default;
};

// A device taint; the API server stamps timeAdded, which is not part of what we compare.
struct DeviceTaint {
  std::string key;
  std::string value;
  std::string effect = "NoSchedule";
  bool operator==(const DeviceTaint&) const = default;
};

struct SliceDevice {
  std::string name;  // a DNS label, unique in the pool
  std::map<std::string, DeviceAttribute> attributes;  // qualified names ("resource.kubernetes.io/pciBusID")
  std::vector<DeviceTaint> taints;
  // KEP-5007 (DRADeviceBindingConditions, beta in 1.36): the scheduler waits in PreBind until every binding
  // condition is True in the claim's status.devices[] entry, and gives the allocation up when a failure condition
  // is True. Condition types (qualified names), at most 4 each, both or neither, no type in both lists.
  std::vector<std::string> binding_conditions;
  std::vector<std::string> binding_failure_conditions;
  bool binds_to_node = false;
  bool operator==(const SliceDevice&) const = default;
};

struct SliceOptions {
  std::string driver;     // "gpu.vfio-agent.cozystack.io"
  std::string node_name;  // also the pool's name
  std::chrono::milliseconds timeout{10000};  // per request
};

struct PublishResult {
  int created = 0;
  int updated = 0;
  int deleted = 0;
  int64_t generation = 0;  // the pool generation the slices now carry
  int left_out = 0;        // tainted devices not published because the API server drops taints
  // The watch saw an event during this pass that turned out not to be ours: someone else changed the slices
  // meanwhile (the caller treats it as the watch's report it held back).
  bool others_meanwhile = false;
  // The server drops bindingConditions (see Publish): the devices were published without them.
  bool binding_conditions_dropped = false;
  bool changed() const { return created + updated + deleted > 0; }
};

// Watches the node's slices of the driver (a watch on resourceslices with the spec.nodeName and spec.driver field
// selectors) on its own thread ("slice-watch"), which owns the connection: one long request, re-made from the
// last resourceVersion when the server ends it, a new list after a 410 Gone, a doubling backoff (1 s to 30 s)
// after an error. `changed` is called from that thread for every event that `ours` does not claim (ours: the
// publisher's own writes and deletions) and after every list but the first (what happened while nobody watched).
// Stops when destroyed.
class ResourceSliceWatch {
 public:
  // ours(type, name, resourceVersion): the event is of our own doing.
  using Ours = std::function<bool(const std::string& type, const std::string& name, const std::string& version)>;
  ResourceSliceWatch(std::shared_ptr<ApiClient> client, std::string path, std::function<void()> changed, Ours ours);
  ~ResourceSliceWatch();
  ResourceSliceWatch(const ResourceSliceWatch&) = delete;
  ResourceSliceWatch& operator=(const ResourceSliceWatch&) = delete;

  // Watch requests made so far (each one long-lived) and lists, for tests and the at-rest figures.
  uint64_t watches() const;
  uint64_t lists() const;

 private:
  std::unique_ptr<ListWatcher> watcher_;  // its thread calls `changed`
};

class ResourceSlicePublisher {
 public:
  ResourceSlicePublisher(std::unique_ptr<ApiClient> client, SliceOptions options);
  ~ResourceSlicePublisher();
  ResourceSlicePublisher(const ResourceSlicePublisher&) = delete;
  ResourceSlicePublisher& operator=(const ResourceSlicePublisher&) = delete;

  // Lists the node's slices of the driver and makes them hold `devices` (sorted by name, 128 a slice, 64 in a slice
  // holding a tainted device): when anything differs, every slice of the pool is written with the next pool
  // generation (updated in place with its resourceVersion, created, or deleted with uid and resourceVersion
  // preconditions), so the scheduler never combines slices of two generations. A slice deleted behind our back (a
  // kubelet's start deletes them all) is created again on the next call. Slices that still carry exactly what our
  // last writes answered (same names and resourceVersions, same devices asked for) are not compared field by field,
  // so whatever the server changes in what it stores cannot make every call rewrite them.
  //
  // An API server with DRADeviceTaints off (1.34, 1.35) drops devices[].taints from what it stores. Publish sees
  // it in the object a write returns, remembers it, and from then on leaves every device with a NoSchedule or
  // NoExecute taint out of the slices (rewritten at once): an unhealthy GPU is then not allocatable rather than
  // silently allocatable. Likewise bindingConditions (DRADeviceBindingConditions or DRAResourceClaimDeviceStatus
  // off): seen once, they are published without them and every result says binding_conditions_dropped, so the
  // caller binds in Prepare as before. Errors name the request and what the server said; a 409 is Aborted (someone
  // else wrote meanwhile: call again). Not thread-safe; one caller.
  absl::StatusOr<PublishResult> Publish(std::vector<SliceDevice> devices);
  // The watch of this publisher's slices, sharing its connection settings (see ResourceSliceWatch).
  std::unique_ptr<ResourceSliceWatch> Watch(std::function<void()> changed);
  // The server was seen dropping taints (see Publish).
  bool taints_dropped() const { return taints_dropped_; }
  // Deletes every slice of the node for the driver (the node leaves DRA, or an orderly uninstall).
  absl::Status DeleteAll();

  uint64_t requests() const;

 private:
  absl::StatusOr<std::string> NodeUid();
  absl::StatusOr<PublishResult> PublishOnce(const std::vector<SliceDevice>& devices, bool* dropped_now);

  // The slices this publisher wrote (name and the resourceVersion the write answered) and deleted, recent ones
  // only: read by the watch's thread to tell our own events from others'.
  // An event that arrives while a pass is writing may report a write whose answer we have not read yet: it is
  // held (claimed) until the pass ends, then checked again.
  struct OwnWrites {
    struct Event {
      std::string type, name, version;
    };
    std::mutex mu;
    std::vector<std::pair<std::string, std::string>> written;
    std::vector<std::string> deleted;
    bool writing = false;
    std::vector<Event> held;
    void Wrote(const std::string& name, const std::string& version);
    void Deleting(const std::string& name);
    bool Ours(const std::string& type, const std::string& name, const std::string& version);
    void Begin();
    bool End();  // true when a held event was not ours
    bool MatchesLocked(const Event& event) const;
  };

  const std::shared_ptr<ApiClient> client_;
  const SliceOptions options_;
  const std::shared_ptr<OwnWrites> own_ = std::make_shared<OwnWrites>();
  std::string node_uid_;
  bool taints_dropped_ = false;
  bool binding_conditions_dropped_ = false;
  // What the last complete write asked for, and the name -> resourceVersion of every slice it left.
  std::vector<std::vector<SliceDevice>> written_chunks_;
  std::map<std::string, std::string> written_versions_;
};

// The same, with the credentials `run` uses (kubeconfig, else in-cluster). Reads local files only.
absl::StatusOr<std::unique_ptr<ResourceSlicePublisher>> ConnectResourceSlicePublisher(
    const std::filesystem::path& kubeconfig, const std::filesystem::path& service_account_dir, SliceOptions options);

}  // namespace vfio_agent::kube
