#include "vfio_gpu_agent/node/source.h"

#include "spdlog/spdlog.h"

namespace vfio_agent::node {

Source::Source(SourceOptions options)
    : options_(std::move(options)),
      names_(options_.pci_ids, options_.domain, options_.overrides),
      catalog_(options_.vgpu_catalog_file) {}

void Source::Open() {
  std::lock_guard lock(scan_mu_);
  if (options_.workload == Workload::kVmVgpu) OpenLocked();
}

void Source::OpenLocked() {
  if (catalog_open_) return;
  catalog_open_ = true;
  if (absl::Status loaded = catalog_.Load(); !loaded.ok()) {
    spdlog::warn("vGPU: {}; starting with no remembered catalog (rewritten when a card lists its types)",
                 loaded.ToString());
  }
}

void Source::SetWorkload(Workload workload) {
  std::lock_guard lock(scan_mu_);
  options_.workload = workload;
  if (workload == Workload::kVmVgpu) OpenLocked();
}

Workload Source::workload() const {
  std::lock_guard lock(scan_mu_);
  return options_.workload;
}

void Source::WithCatalog(const std::function<void(vgpu::CatalogStore&)>& use) {
  std::lock_guard lock(scan_mu_);
  OpenLocked();
  use(catalog_);
}

absl::StatusOr<std::shared_ptr<const State>> Source::Rescan() {
  std::lock_guard lock(scan_mu_);
  const auto started = std::chrono::steady_clock::now();
  absl::StatusOr<pci::Inventory> inventory =
      pci::Scan(options_.paths.sysfs_root, {.detail_vendor = options_.policy.vendor_id, .driver_override = false});
  if (!inventory.ok()) return inventory.status();
  auto state = std::make_shared<State>();
  state->inventory = *std::move(inventory);
  state->selection = pci::Select(state->inventory, options_.policy);
  if (options_.workload == Workload::kVmVgpu) {
    OpenLocked();
    absl::StatusOr<vgpu::Discovery> discovery = vgpu::Discover(options_.paths.sysfs_root, state->inventory, catalog_);
    if (!discovery.ok()) return discovery.status();
    state->discovery = *std::move(discovery);
  }
  state->snapshot = Build(options_.paths, state->inventory, state->selection, names_,
                          state->discovery ? &*state->discovery : nullptr, options_.build);
  state->generation = ++generation_;
  state->scan_started = started;
  state->scan_ended = std::chrono::steady_clock::now();
  std::shared_ptr<const State> done = std::move(state);
  {
    std::lock_guard current(current_mu_);
    current_ = done;
  }
  for (const auto& [id, subscriber] : subscribers_) subscriber(done);
  return done;
}

std::shared_ptr<const State> Source::Current() const {
  std::lock_guard lock(current_mu_);
  return current_;
}

void Source::RequestScan() {
  std::function<void()> waker;
  {
    std::lock_guard lock(waker_mu_);
    waker = waker_;
  }
  if (waker) {
    waker();
    return;
  }
  if (absl::StatusOr<std::shared_ptr<const State>> state = Rescan(); !state.ok()) {
    spdlog::warn("rescan asked for: {}", state.status().ToString());
  }
}

void Source::SetScanWaker(std::function<void()> waker) {
  std::lock_guard lock(waker_mu_);
  waker_ = std::move(waker);
}

uint64_t Source::Subscribe(Subscriber subscriber) {
  std::lock_guard lock(scan_mu_);
  subscribers_.emplace_back(next_subscriber_, std::move(subscriber));
  return next_subscriber_++;
}

void Source::Unsubscribe(uint64_t id) {
  std::lock_guard lock(scan_mu_);
  std::erase_if(subscribers_, [id](const auto& entry) { return entry.first == id; });
}

}  // namespace vfio_agent::node
