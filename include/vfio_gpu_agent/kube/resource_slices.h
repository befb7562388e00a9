// The node's ResourceSlices (resource.k8s.io/v1) of one DRA driver: one pool named after the node, owned by the
// Node object, at most 128 devices a slice. Publish makes what the API server holds equal to a device list and
// writes only the difference: nothing when it already matches (a pass every resync costs one list).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace vfio_agent::kube {

class ApiClient;

inline constexpr size_t kMaxDevicesPerSlice = 128;  // resource.k8s.io/v1 ResourceSliceMaxDevices

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
  bool changed() const { return created + updated + deleted > 0; }
};

class ResourceSlicePublisher {
 public:
  ResourceSlicePublisher(std::unique_ptr<ApiClient> client, SliceOptions options);
  ~ResourceSlicePublisher();
  ResourceSlicePublisher(const ResourceSlicePublisher&) = delete;
  ResourceSlicePublisher& operator=(const ResourceSlicePublisher&) = delete;

  // Lists the node's slices of the driver and makes them hold `devices` (sorted by name, 128 a slice): when
  // anything differs, every slice of the pool is written with the next pool generation (updated in place with its
  // resourceVersion, created, or deleted with uid and resourceVersion preconditions), so the scheduler never
  // combines slices of two generations. A slice deleted behind our back (a kubelet's start deletes them all) is
  // created again on the next call. Errors name the request and what the server said; a 409 is Aborted (someone
  // else wrote meanwhile: call again). Not thread-safe; one caller.
  absl::StatusOr<PublishResult> Publish(std::vector<SliceDevice> devices);
  // Deletes every slice of the node for the driver (the node leaves DRA, or an orderly uninstall).
  absl::Status DeleteAll();

  uint64_t requests() const;

 private:
  absl::StatusOr<std::string> NodeUid();

  std::unique_ptr<ApiClient> client_;
  const SliceOptions options_;
  std::string node_uid_;
};

// The same, with the credentials `run` uses (kubeconfig, else in-cluster). Reads local files only.
absl::StatusOr<std::unique_ptr<ResourceSlicePublisher>> ConnectResourceSlicePublisher(
    const std::filesystem::path& kubeconfig, const std::filesystem::path& service_account_dir, SliceOptions options);

}  // namespace vfio_agent::kube
