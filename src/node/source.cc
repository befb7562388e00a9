#include "vfio_gpu_agent/node/source.h"

#include "spdlog/spdlog.h"

namespace vfio_agent::node {

Source::Source(SourceOptions options)
    : options_(std::move(options)),
      names_(options_.pci_ids, options_.domain, options_.overrides),
      catalog_(options_.vgpu_catalog_file) {}

void Source::Open() {
  if (options_.workload != Workload::kVmVgpu) return;
  std::lock_guard lock(scan_mu_);
  if (absl::Status loaded = catalog_.Load(); !loaded.ok()) {
    spdlog::warn("vGPU: {}; starting with no remembered catalog (rewritten when a card lists its types)",
                 loaded.ToString());
  }
}

absl::StatusOr<std::shared_ptr<const State>> Source::Rescan() {
  std::lock_guard lock(scan_mu_);
  absl::StatusOr<pci::Inventory> inventory =
      pci::Scan(options_.paths.sysfs_root, {.detail_vendor = options_.policy.vendor_id, .driver_override = false});
  if (!inventory.ok()) return inventory.status();
  auto state = std::make_shared<State>();
  state->inventory = *std::move(inventory);
  state->selection = pci::Select(state->inventory, options_.policy);
  if (options_.workload == Workload::kVmVgpu) {
    absl::StatusOr<vgpu::Discovery> discovery = vgpu::Discover(options_.paths.sysfs_root, state->inventory, catalog_);
    if (!discovery.ok()) return discovery.status();
    state->discovery = *std::move(discovery);
  }
  state->snapshot = Build(options_.paths, state->inventory, state->selection, names_,
                          state->discovery ? &*state->discovery : nullptr, options_.build);
  state->generation = ++generation_;
  std::shared_ptr<const State> done = std::move(state);
  {
    std::lock_guard current(current_mu_);
    current_ = done;
  }
  for (const Subscriber& subscriber : subscribers_) subscriber(done);
  return done;
}

std::shared_ptr<const State> Source::Current() const {
  std::lock_guard lock(current_mu_);
  return current_;
}

void Source::Subscribe(Subscriber subscriber) {
  std::lock_guard lock(scan_mu_);
  subscribers_.push_back(std::move(subscriber));
}

}  // namespace vfio_agent::node
