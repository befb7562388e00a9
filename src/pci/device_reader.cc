#include "device_reader.h"

#include "attr_parsers.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <optional>
#include <iterator>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "vfio_gpu_agent/common/fs.h"

namespace vfio_agent::pci::internal {
namespace {

constexpr std::string_view kConsumerPrefix = "consumer:pci:";
constexpr size_t kConfigHeaderBytes = 64;
constexpr size_t kHeaderTypeOffset = 0x0e;
constexpr uint32_t kClassBaseBridge = 0x06;

class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ~ScopedFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

// Which optional entries the device directory has, learned from one listing so that absent attributes
// cost no failed open.
struct Presence {
  bool numa_node = false;
  bool driver_override = false;
  bool physfn = false;
  bool vfio_dev = false;
};

// Reads up to `cap` bytes of attribute `name`; returns the byte count or -errno.
ssize_t ReadAttr(int dir_fd, const char* name, char* buf, size_t cap) {
  int fd = ::openat(dir_fd, name, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  ssize_t n = 0;
  do {
    n = ::read(fd, buf, cap);
  } while (n < 0 && errno == EINTR);
  int err = errno;
  ::close(fd);
  return n < 0 ? -err : n;
}

// Names a device's paths for error messages only, so that a healthy device builds no path at all.
struct DevicePath {
  const std::filesystem::path& parent;
  const std::string& bdf;

  std::filesystem::path Dir() const { return parent / bdf; }
  std::filesystem::path operator/(const char* name) const { return parent / bdf / name; }
};

// Required hex attribute no wider than `max`; a missing or malformed file is an error naming the path.
absl::StatusOr<uint32_t> ReadRequiredHex(int dir_fd, const DevicePath& dir, const char* name, uint32_t max,
                                         std::filesystem::path* failed_path) {
  char buf[64];
  ssize_t n = ReadAttr(dir_fd, name, buf, sizeof buf);
  if (n < 0) {
    *failed_path = dir / name;
    return fs::ErrnoStatus(static_cast<int>(-n), "read", *failed_path);
  }
  std::string_view text(buf, static_cast<size_t>(n));
  auto value = ParseHex(text);
  if (!value || *value > max) {
    *failed_path = dir / name;
    return absl::InvalidArgumentError(absl::StrCat("malformed hex value \"", std::string(TrimWhitespace(text)),
                                                   "\" in ", failed_path->string()));
  }
  return *value;
}

// Optional hex attribute: absent or malformed reads as 0, as the kernel would not omit a sane value.
uint16_t ReadOptionalId(int dir_fd, const char* name) {
  char buf[64];
  ssize_t n = ReadAttr(dir_fd, name, buf, sizeof buf);
  if (n < 0) return 0;
  auto value = ParseHex(std::string_view(buf, static_cast<size_t>(n)));
  return value && *value <= 0xffff ? static_cast<uint16_t>(*value) : 0;
}

// nullopt with errno set when `name` is not a readable link (ENOENT: absent).
std::optional<std::string> ReadLinkBasenameAt(int dir_fd, const char* name) {
  char buf[4096];
  ssize_t n = ::readlinkat(dir_fd, name, buf, sizeof buf);
  if (n == 0) errno = EINVAL;
  if (n <= 0) return std::nullopt;
  return LinkBasename(std::string_view(buf, static_cast<size_t>(n)));
}

bool ReadModalias(int dir_fd, Function* fn) {
  char buf[128];
  ssize_t n = ReadAttr(dir_fd, "modalias", buf, sizeof buf);
  return n > 0 && ParseModalias(std::string_view(buf, static_cast<size_t>(n)), fn);
}

// The individual id files, for trees without a usable modalias. Only vendor, device and class are required.
absl::Status ReadIdFiles(int dir_fd, const DevicePath& dir, Function* fn, std::filesystem::path* failed_path) {
  auto vendor = ReadRequiredHex(dir_fd, dir, "vendor", 0xffff, failed_path);
  if (!vendor.ok()) return vendor.status();
  auto device = ReadRequiredHex(dir_fd, dir, "device", 0xffff, failed_path);
  if (!device.ok()) return device.status();
  auto class_code = ReadRequiredHex(dir_fd, dir, "class", 0xffffff, failed_path);
  if (!class_code.ok()) return class_code.status();
  fn->vendor_id = static_cast<uint16_t>(*vendor);
  fn->device_id = static_cast<uint16_t>(*device);
  fn->class_code = *class_code;
  fn->subsystem_vendor_id = ReadOptionalId(dir_fd, "subsystem_vendor");
  fn->subsystem_device_id = ReadOptionalId(dir_fd, "subsystem_device");
  return absl::OkStatus();
}

// Collects the optional-entry presence and the consumer links from the device directory listing.
int ScanEntries(int dir_fd, Presence* presence, std::vector<std::string>* consumers) {
  int err = ForEachEntry(dir_fd, [&](std::string_view n) {
    if (n == "numa_node") presence->numa_node = true;
    else if (n == "driver_override") presence->driver_override = true;
    else if (n == "physfn") presence->physfn = true;
    else if (n == "vfio-dev") presence->vfio_dev = true;
    else if (n.starts_with(kConsumerPrefix)) consumers->emplace_back(n.substr(kConsumerPrefix.size()));
  });
  std::sort(consumers->begin(), consumers->end());
  return err;
}

// Reading config resumes a runtime-suspended device (a GPU or NVSwitch in D3cold wakes up), so only
// bridge-class functions, whose header type decides whether they are bridges, pay for it, and never one
// that power_state says is in D3cold. Unread, unreadable or short config leaves header_type 0 and IsBridge
// falls back to the class code (0604 is a bridge; an NVSwitch, 0680, is an endpoint either way).
void ReadHeaderTypeAt(int dir_fd, std::string_view prefix, Function* fn) {
  if ((fn->class_code >> 16) != kClassBaseBridge) return;
  char buf[kConfigHeaderBytes];
  std::string power_state = std::string(prefix) + "power_state";
  ssize_t power = ReadAttr(dir_fd, power_state.c_str(), buf, sizeof buf);
  if (power > 0 && TrimWhitespace(std::string_view(buf, static_cast<size_t>(power))) == "D3cold") return;
  std::string config = std::string(prefix) + "config";
  ssize_t n = ReadAttr(dir_fd, config.c_str(), buf, sizeof buf);
  if (n > static_cast<ssize_t>(kHeaderTypeOffset)) {
    fn->header_type = static_cast<uint8_t>(buf[kHeaderTypeOffset]) & 0x7f;
  }
}

// The rest, for functions of the scanned vendor only.
void ReadDetails(int dir_fd, const Presence& presence, Function* fn) {
  char buf[64];
  if (presence.numa_node) {
    ssize_t n = ReadAttr(dir_fd, "numa_node", buf, sizeof buf);
    auto node = n > 0 ? ParseDecimal(std::string_view(buf, static_cast<size_t>(n))) : std::nullopt;
    if (node && *node >= 0) fn->numa_node = node;
  }
  if (presence.driver_override) {
    ssize_t n = ReadAttr(dir_fd, "driver_override", buf, sizeof buf);
    if (n > 0) {
      std::string_view text = TrimWhitespace(std::string_view(buf, static_cast<size_t>(n)));
      if (text != "(null)") fn->driver_override = std::string(text);
    }
  }
  if (presence.physfn) fn->physfn = ReadLinkBasenameAt(dir_fd, "physfn");
  if (presence.vfio_dev) {
    ScopedFd vfio_fd(::openat(dir_fd, "vfio-dev", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (vfio_fd.get() >= 0) {
      int err = ForEachEntry(vfio_fd.get(), [&](std::string_view name) { fn->vfio_cdevs.emplace_back(name); });
      if (err != 0) fn->vfio_cdevs.clear();
      std::sort(fn->vfio_cdevs.begin(), fn->vfio_cdevs.end());
    }
  }
}

// No link: IOMMU off or the device not isolated. A link that does not name a number means a corrupt tree;
// guessing could hand out a shared group.
absl::StatusOr<std::optional<int>> ReadGroup(int dir_fd, const DevicePath& dir,
                                             std::filesystem::path* failed_path) {
  std::optional<std::string> name = ReadLinkBasenameAt(dir_fd, "iommu_group");
  if (!name && errno == ENOENT) return std::optional<int>();
  auto group = name ? ParseDecimal(*name) : std::nullopt;
  if (!group || *group < 0) {
    *failed_path = dir / "iommu_group";
    return absl::InvalidArgumentError(absl::StrCat("iommu_group link ", failed_path->string(),
                                                   " does not name a group: \"", name.value_or(""), "\""));
  }
  return group;
}

}  // namespace

int ForEachEntryWhile(int dir_fd, absl::FunctionRef<bool(std::string_view)> visit) {
  alignas(dirent64) char buf[16384];
  for (;;) {
    ssize_t n = ::getdents64(dir_fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return 0;
    for (ssize_t at = 0; at < n;) {
      const auto* entry = reinterpret_cast<const dirent64*>(buf + at);
      std::string_view name = entry->d_name;
      if (name != "." && name != ".." && !visit(name)) return 0;
      at += entry->d_reclen;
    }
  }
}

int ForEachEntry(int dir_fd, absl::FunctionRef<void(std::string_view)> visit) {
  return ForEachEntryWhile(dir_fd, [&](std::string_view name) {
    visit(name);
    return true;
  });
}

std::optional<BoundDrivers> ListBoundDrivers(int drivers_fd) {
  std::vector<std::string> drivers;
  if (ForEachEntry(drivers_fd, [&](std::string_view name) { drivers.emplace_back(name); }) != 0) return std::nullopt;
  BoundDrivers bound;
  for (const std::string& driver : drivers) {
    ScopedFd fd(::openat(drivers_fd, driver.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (fd.get() < 0) return std::nullopt;
    // Besides its devices a driver directory holds bind, unbind, new_id, remove_id, module and uevent,
    // none of which has a ':'.
    int err = ForEachEntry(fd.get(), [&](std::string_view name) {
      if (name.find(':') != std::string_view::npos) bound.emplace_back(name, driver);
    });
    if (err != 0) return std::nullopt;
  }
  std::sort(bound.begin(), bound.end());
  return bound;
}

std::string ReadDriverLink(int parent_fd, const std::string& bdf) {
  return ReadLinkBasenameAt(parent_fd, (bdf + "/driver").c_str()).value_or("");
}

void ReadHeaderType(int parent_fd, Function* fn) { ReadHeaderTypeAt(parent_fd, fn->bdf + "/", fn); }

bool IsCanonicalBdf(std::string_view text) {
  auto lower_hex = [](std::string_view digits) {
    return !digits.empty() && std::all_of(digits.begin(), digits.end(), [](char c) {
      return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
    });
  };
  // "dddd:bb:dd.f": the domain has at least four digits and no leading zero beyond them.
  if (text.size() < 12 || text.size() > 16) return false;
  const size_t domain = text.size() - 8;
  std::string_view rest = text.substr(domain);
  if (!lower_hex(text.substr(0, domain)) || (domain > 4 && text[0] == '0')) return false;
  if (rest[0] != ':' || rest[3] != ':' || rest[6] != '.') return false;
  if (!lower_hex(rest.substr(1, 2)) || !lower_hex(rest.substr(4, 2))) return false;
  const bool device_at_most_1f = rest[4] == '0' || rest[4] == '1';
  return device_at_most_1f && rest[7] >= '0' && rest[7] <= '7';
}

DeviceRead ReadFunctionAt(int parent_fd, const std::filesystem::path& parent_path, const std::string& bdf,
                          const ScanOptions& options, bool read_driver_link) {
  const DevicePath dir{parent_path, bdf};
  DeviceRead out;
  auto fail = [&](absl::Status status) {
    out.function = std::move(status);
    return std::move(out);
  };
  Function& fn = *out.function;
  fn.bdf = bdf;
  // An O_PATH descriptor resolves the device directory once without opening it; only functions that get
  // the full read (their directory is listed) open it for real.
  ScopedFd path_fd(::openat(parent_fd, bdf.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (path_fd.get() < 0) {
    out.failed_path = dir.Dir();
    return fail(fs::ErrnoStatus(errno, "open", out.failed_path));
  }
  const bool ids_from_modalias = ReadModalias(path_fd.get(), &fn);
  // Read before the other attributes can fail, so that selection can still place a broken device.
  auto group = ReadGroup(path_fd.get(), dir, &out.failed_path);
  if (!group.ok()) return fail(group.status());
  out.iommu_group = fn.iommu_group = *group;
  if (!ids_from_modalias) {
    absl::Status ids = ReadIdFiles(path_fd.get(), dir, &fn, &out.failed_path);
    if (!ids.ok()) return fail(std::move(ids));
  }
  // Nothing above takes the device lock (driver_override does), so a foreign device in the middle of a long
  // probe or unbind never stalls the scan.
  if (read_driver_link) fn.driver = ReadLinkBasenameAt(path_fd.get(), "driver").value_or("");
  if (options.detail_vendor && fn.vendor_id != *options.detail_vendor) return out;
  ReadHeaderTypeAt(path_fd.get(), "", &fn);
  ScopedFd dir_fd(::openat(path_fd.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir_fd.get() < 0) {
    out.failed_path = dir.Dir();
    return fail(fs::ErrnoStatus(errno, "open", out.failed_path));
  }
  Presence presence;
  if (int err = ScanEntries(dir_fd.get(), &presence, &fn.consumers); err != 0) {
    out.failed_path = dir.Dir();
    return fail(fs::ErrnoStatus(err, "list", out.failed_path));
  }
  if (!options.driver_override) presence.driver_override = false;
  ReadDetails(dir_fd.get(), presence, &fn);
  return out;
}

}  // namespace vfio_agent::pci::internal
