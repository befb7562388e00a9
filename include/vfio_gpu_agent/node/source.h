// The node's one scan loop body: scans sysfs once (pci::Scan, pci::Select, and on a vm-vgpu node the vGPU
// discovery), builds the node's model with the one NameResolver of the process, and hands the result to every
// subscriber. The frontends and `run`'s pass take the node from here instead of scanning on their own.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "vfio_gpu_agent/common/host_paths.h"
#include "vfio_gpu_agent/common/workload.h"
#include "vfio_gpu_agent/names/resource_names.h"
#include "vfio_gpu_agent/node/snapshot.h"
#include "vfio_gpu_agent/pci/inventory.h"
#include "vfio_gpu_agent/pci/selection.h"
#include "vfio_gpu_agent/vgpu/catalog.h"
#include "vfio_gpu_agent/vgpu/discovery.h"

namespace vfio_agent::node {

struct SourceOptions {
  HostPaths paths;
  pci::SelectionPolicy policy;
  Workload workload = Workload::kVmPassthrough;  // vm-vgpu: the vGPU discovery runs on every scan
  const names::PciIdsDatabase* pci_ids = nullptr;
  std::string domain = "nvidia.com";
  std::vector<names::NameOverride> overrides;
  std::filesystem::path vgpu_catalog_file;  // "" keeps the SR-IOV catalogs in memory only
  BuildOptions build;
};

// One scan and the model built from it. Immutable once handed out.
struct State {
  pci::Inventory inventory;
  pci::Selection selection;
  std::optional<vgpu::Discovery> discovery;  // vm-vgpu nodes
  Snapshot snapshot;
  uint64_t generation = 0;  // counts scans of this source, from 1
};

class Source {
 public:
  explicit Source(SourceOptions options);
  Source(const Source&) = delete;
  Source& operator=(const Source&) = delete;

  // vm-vgpu: loads the remembered SR-IOV catalogs (a bad file is logged and the store starts empty).
  void Open();

  // Scans once and builds the model; then calls every subscriber, on the calling thread, in the order they
  // subscribed, with the new state (whether or not the snapshot changed: a frontend's memory of gone devices moves
  // on each scan). Scans of several threads are serialised, and the subscribers run under the same lock: they must
  // not call Rescan, and should hand the state to their own thread rather than work on it. An unreadable sysfs or vGPU discovery is the error, and no
  // subscriber is called.
  absl::StatusOr<std::shared_ptr<const State>> Rescan();
  // The last scan's state; null before the first.
  std::shared_ptr<const State> Current() const;

  using Subscriber = std::function<void(const std::shared_ptr<const State>&)>;
  // Before the first Rescan of another thread.
  void Subscribe(Subscriber subscriber);

  const SourceOptions& options() const { return options_; }
  const names::NameResolver& names() const { return names_; }

 private:
  const SourceOptions options_;
  const names::NameResolver names_;
  std::mutex scan_mu_;  // one scan at a time; owns catalog_ and the subscriber calls
  vgpu::CatalogStore catalog_;
  std::vector<Subscriber> subscribers_;
  uint64_t generation_ = 0;
  mutable std::mutex current_mu_;
  std::shared_ptr<const State> current_;
};

}  // namespace vfio_agent::node
