// pci.ids through libpci, restricted to the file itself: no udev hwdb (it ships its own, possibly newer,
// snapshot), no ~/.pciids-cache and no DNS, so the names depend only on the file the operator chose.
//
// Subsystem lines ("\t\t...") are filtered out before libpci parses the file: device lookups never use
// them, yet they are 40% of the lines and about two thirds of libpci's load time (their hash chains are
// long), which would put the load near the 20 ms budget. libpci only opens paths, so the filtered copy
// is handed over as a memfd through /proc/self/fd; without /proc (or for a gzip file) libpci reads the
// original.
#include <csetjmp>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>
#include <utility>

#include <sys/mman.h>
#include <unistd.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/common/fs.h"
#include "vfio_gpu_agent/names/resource_names.h"

extern "C" {
#include <pci/pci.h>
}

namespace vfio_agent::names {
namespace {

// libpci reports a malformed pci.ids through access->error, which must not return (its default calls
// exit(1)). We jump back to the load call instead; nothing in between holds C++ objects.
thread_local std::jmp_buf* load_jump = nullptr;
thread_local char load_error[512];
thread_local int load_error_line = 0;  // line libpci complained about, 0 if the message has none

// pci_load_name_list's only call of error(); matched so the line can be mapped back to the original.
constexpr char kParseErrorFormat[] = "%s at %s, line %d\n";

// The GNU spelling, unlike [[noreturn]], is part of the type that libpci's error pointer requires.
__attribute__((noreturn)) void OnLibpciError(char* format, ...) {
  va_list args;
  va_start(args, format);
  if (std::strcmp(format, kParseErrorFormat) == 0) {
    const char* reason = va_arg(args, const char*);
    va_arg(args, const char*);
    load_error_line = va_arg(args, int);
    std::snprintf(load_error, sizeof load_error, "%s", reason);
  } else {
    load_error_line = 0;
    std::vsnprintf(load_error, sizeof load_error, format, args);
  }
  va_end(args);
  if (load_jump != nullptr) std::longjmp(*load_jump, 1);
  // Only the load can fail: lookups with our flags never call error().
  std::fprintf(stderr, "libpci: %s\n", load_error);
  std::abort();
}

void OnLibpciWarning(char* format, ...) {
  char text[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(text, sizeof text, format, args);
  va_end(args);
  spdlog::warn("libpci: {}", std::string(absl::StripTrailingAsciiWhitespace(text)));
}

void OnLibpciDebug(char*, ...) {}

// Returns nullptr on success, else libpci's message; errno is preserved when the file cannot be opened.
const char* LoadNameList(pci_access* access, bool* opened) {
  std::jmp_buf jump;
  load_jump = &jump;
  if (setjmp(jump) != 0) {
    load_jump = nullptr;
    *opened = true;
    return load_error;
  }
  *opened = pci_load_name_list(access) != 0;
  load_jump = nullptr;
  return nullptr;
}

// The lines libpci needs for vendor and device names, and where each came from in the original file.
struct FilteredIds {
  std::string text;
  std::vector<int> original_line;  // [i] = 1-based line in the file of filtered line i+1
};

FilteredIds WithoutSubsystemLines(std::string_view content) {
  FilteredIds out;
  out.text.reserve(content.size() / 2);
  int line_number = 0;
  size_t start = 0;
  while (start < content.size()) {
    size_t end = content.find('\n', start);
    if (end == std::string_view::npos) end = content.size();
    std::string_view line = content.substr(start, end - start);
    ++line_number;
    if (!line.starts_with("\t\t")) {
      out.text.append(line).push_back('\n');
      out.original_line.push_back(line_number);
    }
    start = end + 1;
  }
  return out;
}

// An open memfd holding `text`, readable by path; closes on destruction.
class MemoryFile {
 public:
  static std::optional<MemoryFile> Create(std::string_view text) {
    int fd = memfd_create("pci.ids", MFD_CLOEXEC);
    if (fd < 0) return std::nullopt;
    MemoryFile file(fd);
    for (size_t written = 0; written < text.size();) {
      ssize_t n = ::write(fd, text.data() + written, text.size() - written);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return std::nullopt;
      written += static_cast<size_t>(n);
    }
    if (FILE* probe = std::fopen(file.path().c_str(), "r"); probe != nullptr) {
      std::fclose(probe);
      return file;
    }
    return std::nullopt;
  }
  MemoryFile(MemoryFile&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  MemoryFile& operator=(MemoryFile&&) = delete;
  ~MemoryFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  std::string path() const { return absl::StrCat("/proc/self/fd/", fd_); }

 private:
  explicit MemoryFile(int fd) : fd_(fd) {}
  int fd_;
};

class LibpciDatabase final : public PciIdsDatabase {
 public:
  LibpciDatabase(pci_access* access, std::string source) : access_(access), source_(std::move(source)) {}
  ~LibpciDatabase() override { pci_cleanup(access_); }
  LibpciDatabase(const LibpciDatabase&) = delete;
  LibpciDatabase& operator=(const LibpciDatabase&) = delete;

  std::optional<std::string> DeviceName(uint16_t vendor_id, uint16_t device_id) const override {
    char buf[1024];
    const char* name;
    {
      // libpci keeps lookup state in the access struct; serialise so callers may share one database.
      std::lock_guard<std::mutex> lock(mu_);
      // PCI_LOOKUP_DEVICE is keyed by (vendor, device) in libpci's hash: subsystem lines are another
      // category and other vendors' ids another key, so neither can match.
      name = pci_lookup_name(access_, buf, sizeof buf, PCI_LOOKUP_DEVICE | PCI_LOOKUP_NO_NUMBERS,
                             static_cast<int>(vendor_id), static_cast<int>(device_id));
    }
    if (name == nullptr) return std::nullopt;
    std::string trimmed(absl::StripAsciiWhitespace(name));
    if (trimmed.empty()) return std::nullopt;
    return trimmed;
  }

  std::string source() const override { return source_; }

 private:
  pci_access* access_;
  std::string source_;
  mutable std::mutex mu_;
};

std::filesystem::path FirstExisting(const std::vector<std::filesystem::path>& candidates) {
  for (const auto& candidate : candidates) {
    if (fs::Exists(candidate)) return candidate;
  }
  return {};
}

class LazyDatabase final : public PciIdsDatabase {
 public:
  explicit LazyDatabase(std::filesystem::path path) : path_(std::move(path)) {}

  std::optional<std::string> DeviceName(uint16_t vendor_id, uint16_t device_id) const override {
    const PciIdsDatabase* db = Loaded();
    return db != nullptr ? db->DeviceName(vendor_id, device_id) : std::nullopt;
  }
  std::string source() const override {
    const PciIdsDatabase* db = Loaded();
    return db != nullptr ? db->source() : "";
  }

 private:
  const PciIdsDatabase* Loaded() const {
    std::call_once(loaded_, [this] { db_ = LoadPciIdsOrWarn(path_); });
    return db_.get();
  }

  const std::filesystem::path path_;
  mutable std::once_flag loaded_;
  mutable std::unique_ptr<PciIdsDatabase> db_;
};

pci_access* NewFileOnlyAccess() {
  pci_access* access = pci_alloc();
  access->error = OnLibpciError;
  access->warning = OnLibpciWarning;
  access->debug = OnLibpciDebug;
  access->numeric_ids = 0;
  // Replaces the default PCI_LOOKUP_CACHE (the DNS cache file); never PCI_LOOKUP_SKIP_LOCAL, which
  // would skip the file itself.
  access->id_lookup_mode = PCI_LOOKUP_NO_HWDB;
  char hwdb_param[] = "hwdb.disable";
  char one[] = "1";
  pci_set_param(access, hwdb_param, one);
  return access;
}

}  // namespace

std::vector<std::filesystem::path> DefaultPciIdsLocations() {
  return {"/usr/share/misc/pci.ids", "/usr/share/hwdata/pci.ids", "/usr/share/pci.ids", "/usr/pci.ids"};
}

absl::StatusOr<std::unique_ptr<PciIdsDatabase>> LoadPciIds(const std::filesystem::path& path) {
  std::filesystem::path file = path;
  if (file.empty()) {
    const std::vector<std::filesystem::path> candidates = DefaultPciIdsLocations();
    file = FirstExisting(candidates);
    if (file.empty()) {
      return absl::NotFoundError(absl::StrCat("no pci.ids found (tried ",
                                              absl::StrJoin(candidates, ", ",
                                                            [](std::string* out, const std::filesystem::path& p) {
                                                              out->append(p.string());
                                                            }),
                                              "); pass --pci-ids"));
    }
  }
  // Read here also because libpci silently yields no names for a missing file; this error names the path.
  absl::StatusOr<std::string> content = fs::ReadTrimmed(file);
  if (!content.ok()) {
    return absl::Status(content.status().code(), absl::StrCat("pci.ids: ", content.status().message()));
  }
  const bool gzip = content->starts_with("\x1f\x8b");
  FilteredIds filtered = gzip ? FilteredIds{} : WithoutSubsystemLines(*content);
  std::optional<MemoryFile> memory = gzip ? std::nullopt : MemoryFile::Create(filtered.text);
  if (!memory) filtered.original_line.clear();

  pci_access* access = NewFileOnlyAccess();
  pci_set_name_list_path(access, strdup(memory ? memory->path().c_str() : file.c_str()), 1);

  // Loaded now rather than on the first lookup so a broken file is an error here, not a silent "no name".
  bool opened = false;
  const char* error = LoadNameList(access, &opened);
  // Any later (re)load must read the real file, never a descriptor number that may be reused.
  pci_set_name_list_path(access, strdup(file.c_str()), 1);
  if (error != nullptr) {
    std::string message(absl::StripTrailingAsciiWhitespace(error));
    int line = load_error_line;
    if (line > 0 && static_cast<size_t>(line) <= filtered.original_line.size()) {
      line = filtered.original_line[line - 1];
    }
    pci_cleanup(access);
    if (line > 0) absl::StrAppend(&message, " at line ", line);
    return absl::InvalidArgumentError(absl::StrCat("pci.ids ", file.string(), ": ", message));
  }
  if (!opened) {
    int err = errno;
    pci_cleanup(access);
    return fs::ErrnoStatus(err, "open pci.ids", file);
  }
  // libpci re-reads a file without entries on every lookup; refuse it instead.
  if (access->id_hash == nullptr) {
    pci_cleanup(access);
    return absl::InvalidArgumentError(absl::StrCat("pci.ids ", file.string(), ": contains no entries"));
  }
  return std::unique_ptr<PciIdsDatabase>(std::make_unique<LibpciDatabase>(access, file.string()));
}

std::unique_ptr<PciIdsDatabase> LoadPciIdsOrWarn(const std::filesystem::path& path) {
  absl::StatusOr<std::unique_ptr<PciIdsDatabase>> db = LoadPciIds(path);
  if (db.ok()) return *std::move(db);
  spdlog::warn("no pci.ids database ({}); using pinned names and hex device ids", std::string(db.status().message()));
  return nullptr;
}

std::unique_ptr<PciIdsDatabase> LazyPciIds(std::filesystem::path path) {
  return std::make_unique<LazyDatabase>(std::move(path));
}

}  // namespace vfio_agent::names
