#include "vfio_gpu_agent/pci/inventory.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <set>
#include <thread>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "device_reader.h"
#include "vfio_gpu_agent/common/fs.h"
#include "vfio_gpu_agent/common/worker_pool.h"

namespace vfio_agent::pci {
namespace {

constexpr uint32_t kClassPciBridgeBase = 0x0604;

std::optional<uint32_t> ParseHexField(std::string_view text, size_t min_digits, size_t max_digits) {
  if (text.size() < min_digits || text.size() > max_digits) return std::nullopt;
  uint32_t value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value, 16);
  if (ec != std::errc() || ptr != text.data() + text.size()) return std::nullopt;
  return value;
}

bool ByBdf(const Function& a, const Function& b) { return a.bdf < b.bdf; }

void AddMember(std::map<int, IommuGroup>* groups, int id, const std::string& bdf) {
  IommuGroup& group = (*groups)[id];
  group.id = id;
  group.members.push_back(bdf);
}

void SortMembers(std::map<int, IommuGroup>* groups) {
  for (auto& [id, group] : *groups) {
    std::sort(group.members.begin(), group.members.end());
    group.members.erase(std::unique(group.members.begin(), group.members.end()), group.members.end());
  }
}

// The kernel creates kernel/iommu_groups entries only when an IOMMU translates DMA.
bool AnyIommuGroup(const std::filesystem::path& sysfs_root, std::vector<ScanError>* errors) {
  const std::filesystem::path groups_dir = sysfs_root / "kernel/iommu_groups";
  int fd = ::open(groups_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    if (errno != ENOENT) errors->push_back({"", groups_dir, fs::ErrnoStatus(errno, "open", groups_dir)});
    return false;
  }
  bool any = false;
  const int err = internal::ForEachEntryWhile(fd, [&](std::string_view) {
    any = true;
    return false;  // one entry is enough
  });
  ::close(fd);
  if (err != 0) errors->push_back({"", groups_dir, fs::ErrnoStatus(err, "list", groups_dir)});
  return any;
}

// Reads every device on a few threads (syscalls, six to fifteen a device, dominate a scan): the calling
// thread and reused pool workers, not threads started per scan (the daemon rescans every period). The calling
// thread first runs `side_task`, so the driver directories are listed while the helpers read devices.
std::vector<internal::DeviceRead> ReadAll(int devices_fd, const std::filesystem::path& devices_dir,
                                          const std::vector<std::string>& bdfs, const ScanOptions& options,
                                          bool read_driver_links, absl::FunctionRef<void()> side_task) {
  constexpr size_t kDevicesPerThread = 16;
  constexpr unsigned kMaxThreads = 8;
  std::vector<internal::DeviceRead> reads(bdfs.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next.fetch_add(1, std::memory_order_relaxed); i < bdfs.size();
         i = next.fetch_add(1, std::memory_order_relaxed)) {
      reads[i] = internal::ReadFunctionAt(devices_fd, devices_dir, bdfs[i], options, read_driver_links);
    }
  };
  const size_t wanted = std::min<size_t>({std::max(1u, std::thread::hardware_concurrency()), kMaxThreads,
                                          bdfs.size() / kDevicesPerThread + 1});
  // RunAlongside returns once every helper is done, before `reads` is moved out.
  ProcessWorkerPool().RunAlongside(wanted - 1, work, [&] {
    side_task();
    work();
  });
  return reads;
}

// Fills in each function's driver from the (BDF-sorted) driver directory listing; both lists are sorted.
void AssignDrivers(const internal::BoundDrivers& bound, std::vector<Function>* functions) {
  auto it = bound.begin();
  for (Function& fn : *functions) {
    while (it != bound.end() && it->first < fn.bdf) ++it;
    fn.driver = it != bound.end() && it->first == fn.bdf ? it->second : "";
  }
}

// A foreign function's header type matters only where it shares an IOMMU group with one of the vendor's
// (is it a bridge, which a group may keep, or an endpoint on another driver?), so only those read config.
void ReadForeignHeaderTypes(int devices_fd, uint16_t vendor, std::vector<Function>* functions) {
  std::set<int> vendor_groups;
  for (const Function& fn : *functions) {
    if (fn.vendor_id == vendor && fn.iommu_group) vendor_groups.insert(*fn.iommu_group);
  }
  for (Function& fn : *functions) {
    if (fn.vendor_id != vendor && fn.iommu_group && vendor_groups.contains(*fn.iommu_group)) {
      internal::ReadHeaderType(devices_fd, &fn);
    }
  }
}

}  // namespace

bool Function::IsBridge() const {
  return header_type == 1 || header_type == 2 || (class_code >> 8) == kClassPciBridgeBase;
}

std::string Function::VendorDevice() const { return absl::StrFormat("%04x:%04x", vendor_id, device_id); }

std::string Function::ClassHex() const { return absl::StrFormat("%06x", class_code); }

const Function* Inventory::Find(std::string_view bdf) const {
  auto it = std::lower_bound(functions_.begin(), functions_.end(), bdf,
                             [](const Function& fn, std::string_view key) { return fn.bdf < key; });
  return it != functions_.end() && it->bdf == bdf ? &*it : nullptr;
}

const IommuGroup* Inventory::Group(int id) const {
  auto it = groups_.find(id);
  return it == groups_.end() ? nullptr : &it->second;
}

Inventory MakeInventory(std::vector<Function> functions, std::vector<ScanError> errors, bool iommu_enabled) {
  Inventory inventory;
  if (!std::is_sorted(functions.begin(), functions.end(), ByBdf)) std::sort(functions.begin(), functions.end(), ByBdf);
  for (const Function& fn : functions) {
    if (fn.iommu_group) AddMember(&inventory.groups_, *fn.iommu_group, fn.bdf);
  }
  SortMembers(&inventory.groups_);
  inventory.functions_ = std::move(functions);
  inventory.errors_ = std::move(errors);
  inventory.iommu_enabled_ = iommu_enabled;
  return inventory;
}

namespace {
std::atomic<uint64_t> scans_started{0};
}  // namespace

uint64_t ScansStarted() { return scans_started.load(std::memory_order_relaxed); }

absl::StatusOr<Inventory> Scan(const std::filesystem::path& sysfs_root, const ScanOptions& options) {
  scans_started.fetch_add(1, std::memory_order_relaxed);
  const std::filesystem::path devices_dir = sysfs_root / "bus/pci/devices";
  int devices_fd = ::open(devices_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (devices_fd < 0) return fs::ErrnoStatus(errno, "open", devices_dir);
  std::vector<std::string> names;
  if (int err = internal::ForEachEntry(devices_fd, [&](std::string_view name) { names.emplace_back(name); });
      err != 0) {
    ::close(devices_fd);
    return fs::ErrnoStatus(err, "list", devices_dir);
  }
  std::sort(names.begin(), names.end());

  std::vector<ScanError> errors;
  std::vector<std::string> bdfs;
  bdfs.reserve(names.size());
  for (std::string& name : names) {
    if (internal::IsCanonicalBdf(name)) {
      bdfs.push_back(std::move(name));
    } else {
      const std::filesystem::path path = devices_dir / name;
      errors.push_back({name, path, absl::InvalidArgumentError(absl::StrCat("not a PCI address: ", path.string()))});
    }
  }
  // One listing per driver instead of one driver link per device; a tree without (listable) driver
  // directories falls back to the links.
  const int drivers_fd = ::open((sysfs_root / "bus/pci/drivers").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  std::optional<internal::BoundDrivers> bound;
  std::vector<internal::DeviceRead> reads = ReadAll(devices_fd, devices_dir, bdfs, options, drivers_fd < 0, [&] {
    if (drivers_fd < 0) return;
    bound = internal::ListBoundDrivers(drivers_fd);
    ::close(drivers_fd);
  });

  std::vector<Function> functions;
  functions.reserve(reads.size());
  std::vector<std::pair<int, std::string>> unreadable_members;
  for (size_t i = 0; i < reads.size(); ++i) {
    if (reads[i].function.ok()) {
      functions.push_back(std::move(*reads[i].function));
      continue;
    }
    errors.push_back({bdfs[i], std::move(reads[i].failed_path), reads[i].function.status()});
    // Kept in its group so that selection never mistakes a group with an unreadable member for a private one.
    if (reads[i].iommu_group) unreadable_members.emplace_back(*reads[i].iommu_group, bdfs[i]);
  }
  if (bound) {
    AssignDrivers(*bound, &functions);
  } else if (drivers_fd >= 0) {
    for (Function& fn : functions) fn.driver = internal::ReadDriverLink(devices_fd, fn.bdf);
  }
  if (options.detail_vendor) ReadForeignHeaderTypes(devices_fd, *options.detail_vendor, &functions);
  ::close(devices_fd);
  bool iommu_enabled = AnyIommuGroup(sysfs_root, &errors);
  Inventory inventory = MakeInventory(std::move(functions), std::move(errors), iommu_enabled);
  for (auto& [id, bdf] : unreadable_members) AddMember(&inventory.groups_, id, bdf);
  SortMembers(&inventory.groups_);
  return inventory;
}

absl::StatusOr<Function> ReadFunction(const std::filesystem::path& sysfs_root, const std::string& bdf) {
  auto canonical = CanonicalBdf(bdf);
  if (!canonical.ok()) return canonical.status();
  const std::filesystem::path devices_dir = sysfs_root / "bus/pci/devices";
  int devices_fd = ::open(devices_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (devices_fd < 0) return fs::ErrnoStatus(errno, "open", devices_dir);
  internal::DeviceRead read = internal::ReadFunctionAt(devices_fd, devices_dir, *canonical, ScanOptions{}, true);
  ::close(devices_fd);
  return std::move(read.function);
}

absl::StatusOr<std::string> CanonicalBdf(std::string_view text) {
  auto invalid = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid PCI address \"", std::string(text), "\" (want dddd:bb:dd.f)"));
  };
  std::string_view rest = internal::TrimWhitespace(text);
  uint32_t domain = 0;
  if (std::count(rest.begin(), rest.end(), ':') == 2) {
    auto colon = rest.find(':');
    auto parsed = ParseHexField(rest.substr(0, colon), 4, 8);
    if (!parsed) return invalid();
    domain = *parsed;
    rest.remove_prefix(colon + 1);
  }
  auto colon = rest.find(':');
  auto dot = rest.find('.');
  if (colon == std::string_view::npos || dot == std::string_view::npos || dot < colon) return invalid();
  auto bus = ParseHexField(rest.substr(0, colon), 2, 2);
  auto device = ParseHexField(rest.substr(colon + 1, dot - colon - 1), 2, 2);
  auto function = ParseHexField(rest.substr(dot + 1), 1, 1);
  if (!bus || !device || !function || *device > 0x1f || *function > 7) return invalid();
  return absl::StrFormat("%04x:%02x:%02x.%x", domain, *bus, *device, *function);
}

}  // namespace vfio_agent::pci
