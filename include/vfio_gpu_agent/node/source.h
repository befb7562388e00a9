// The node's one scan loop body: scans sysfs once (pci::Scan, pci::Select, and on a vm-vgpu node the vGPU
// discovery), builds the node's model with the one NameResolver of the process, and hands the result to every
// subscriber. The frontends and `run`'s pass take the node from here instead of scanning on their own.
//
// One Source per process: `run` makes it (daemon::Daemon) and hands it to its frontend
// (plugin::ServeOptions::source, dra::DriverOptions::source); the reconcile thread (va-reconcile) is the one that
// rescans it, once per pass and once more after a bind, and the frontend hears each new state through its
// subscription and builds its device list on its own thread. `serve` has no reconcile loop: there the frontend makes
// its own Source and rescans it on its device events.
#pragma once

#include <chrono>
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

// A frontend's options (plugin::ServeOptions, dra::DriverOptions) name what a Source is made from by the same fields.
template <typename T>
concept FrontendOptions = requires(const T& frontend) {
  frontend.paths;
  frontend.policy;
  frontend.workload;
  frontend.pci_ids;
  frontend.domain;
  frontend.overrides;
  frontend.vgpu_catalog_file;
  frontend.source;  // `run`'s shared Source, or null
};

// The one place those fields become a Source's options: `run`'s Source from its device plugin's options, `serve`'s
// from its frontend's (OwnSource). `build` is the frontend's: DRA's --bind-on-prepare.
template <FrontendOptions Frontend>
SourceOptions SourceOptionsOf(const Frontend& frontend, BuildOptions build = {}) {
  return {.paths = frontend.paths,
          .policy = frontend.policy,
          .workload = frontend.workload,
          .pci_ids = frontend.pci_ids,
          .domain = frontend.domain,
          .overrides = frontend.overrides,
          .vgpu_catalog_file = frontend.vgpu_catalog_file,
          .build = build};
}

// One scan and the model built from it. Immutable once handed out.
struct State {
  pci::Inventory inventory;
  pci::Selection selection;
  std::optional<vgpu::Discovery> discovery;  // vm-vgpu nodes
  Snapshot snapshot;
  uint64_t generation = 0;  // counts scans of this source, from 1
  // When the scan began reading sysfs and when it was done: a GPU whose drivers the agent moved during that
  // interval was seen half-moved (the DRA driver keeps its health from before such a scan).
  std::chrono::steady_clock::time_point scan_started{};
  std::chrono::steady_clock::time_point scan_ended{};
};

class Source {
 public:
  explicit Source(SourceOptions options);
  Source(const Source&) = delete;
  Source& operator=(const Source&) = delete;

  // vm-vgpu: loads the remembered SR-IOV catalogs (a bad file is logged and the store starts empty). Only a vm-vgpu
  // node reads the file: a passthrough node never pays for it. Idempotent.
  void Open();
  // `run` after a change of the workload label: the next scan discovers vGPUs (vm-vgpu) or does not. Opens the
  // catalog on the first switch to vm-vgpu.
  void SetWorkload(Workload workload);
  Workload workload() const;

  // Scans once and builds the model; then calls every subscriber, on the calling thread, in the order they
  // subscribed, with the new state (whether or not the snapshot changed: a frontend's memory of gone devices moves
  // on each scan). Scans of several threads are serialised, and the subscribers run under the same lock: they must
  // not call Rescan, and should hand the state to their own thread rather than work on it. An unreadable sysfs or vGPU discovery is the error, and no
  // subscriber is called.
  absl::StatusOr<std::shared_ptr<const State>> Rescan();
  // The last scan's state; null before the first.
  std::shared_ptr<const State> Current() const;

  // Asks the source's owner for a scan that starts after this call (the DRA driver, after it moved a GPU, so that
  // the health it kept through the move is judged afresh). `run` installs a waker that makes its reconcile loop
  // scan; without one the scan is done here, on the caller's thread (which must not be a subscriber's call).
  void RequestScan();
  // The owner's waker for RequestScan; called from any thread, it must only wake the owner. Empty: none.
  void SetScanWaker(std::function<void()> waker);

  using Subscriber = std::function<void(const std::shared_ptr<const State>&)>;
  // From any thread but a subscriber's call; the id is Unsubscribe's. A subscriber that goes away (a frontend
  // stopped by a mode switch) unsubscribes first: it is not called after Unsubscribe returns.
  uint64_t Subscribe(Subscriber subscriber);
  void Unsubscribe(uint64_t id);

  // The SR-IOV type catalogs (vgpu/catalog.h), for the profile applier and a discovery outside a scan, under the
  // scan lock: `use` must not call Rescan.
  void WithCatalog(const std::function<void(vgpu::CatalogStore&)>& use);

  const SourceOptions& options() const { return options_; }
  const names::NameResolver& names() const { return names_; }

 private:
  void OpenLocked();

  SourceOptions options_;  // workload changes under scan_mu_ (SetWorkload)
  const names::NameResolver names_;
  mutable std::mutex scan_mu_;  // one scan at a time; owns catalog_, options_.workload and the subscriber calls
  vgpu::CatalogStore catalog_;
  bool catalog_open_ = false;
  std::vector<std::pair<uint64_t, Subscriber>> subscribers_;
  uint64_t next_subscriber_ = 1;
  uint64_t generation_ = 0;
  std::mutex waker_mu_;
  std::function<void()> waker_;
  mutable std::mutex current_mu_;
  std::shared_ptr<const State> current_;
};

// `serve`: the Source the frontend makes for itself from its options; null under `run`, which handed it the
// process's one (frontend.source).
template <FrontendOptions Frontend>
std::unique_ptr<Source> OwnSource(const Frontend& frontend, BuildOptions build = {}) {
  if (frontend.source != nullptr) return nullptr;
  return std::make_unique<Source>(SourceOptionsOf(frontend, build));
}

}  // namespace vfio_agent::node
