#include "vfio_gpu_agent/common/fs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace vfio_agent::fs {
namespace {

absl::StatusCode CodeForErrno(int err) {
  switch (err) {
    case ENOENT:
    case ENODEV:
    case ENXIO:
      return absl::StatusCode::kNotFound;
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::StatusCode::kPermissionDenied;
    case EBUSY:
    case EAGAIN:
      return absl::StatusCode::kUnavailable;
    case EINVAL:
    case ENOTDIR:
      return absl::StatusCode::kInvalidArgument;
    case EEXIST:
      return absl::StatusCode::kAlreadyExists;
    case ETIMEDOUT:
      return absl::StatusCode::kDeadlineExceeded;
    default:
      return absl::StatusCode::kInternal;
  }
}

const char* FileType(mode_t mode) {
  if (S_ISDIR(mode)) return "directory";
  if (S_ISFIFO(mode)) return "FIFO";
  if (S_ISCHR(mode)) return "character device";
  if (S_ISBLK(mode)) return "block device";
  if (S_ISSOCK(mode)) return "socket";
  return "special file";
}

}  // namespace

absl::Status ErrnoStatus(int err, std::string_view what, const std::filesystem::path& path) {
  return absl::Status(CodeForErrno(err), absl::StrCat(std::string(what), " ", path.string(), ": ", std::strerror(err)));
}

absl::StatusOr<std::string> ReadTrimmed(const std::filesystem::path& path, size_t max_bytes) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer before its type can be refused.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return ErrnoStatus(errno, "open", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoStatus(err, "stat", path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("read ", path.string(), ": not a regular file (", FileType(st.st_mode), ")"));
  }
  // sysfs reports 4096 and procfs 0 whatever the content, so the size is checked while reading.
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return ErrnoStatus(err, "read", path);
    }
    if (n == 0) break;
    if (out.size() + static_cast<size_t>(n) > max_bytes) {
      ::close(fd);
      return absl::OutOfRangeError(absl::StrCat("read ", path.string(), ": larger than ", max_bytes, " bytes"));
    }
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  absl::StripTrailingAsciiWhitespace(&out);
  return out;
}

absl::StatusOr<uint32_t> ReadHex(const std::filesystem::path& path) {
  auto text = ReadTrimmed(path);
  if (!text.ok()) return text.status();
  std::string_view v = *text;
  if (v.starts_with("0x") || v.starts_with("0X")) v.remove_prefix(2);
  uint32_t value = 0;
  auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), value, 16);
  if (v.empty() || ec != std::errc() || ptr != v.data() + v.size()) {
    return absl::InvalidArgumentError(absl::StrCat("malformed hex value \"", *text, "\" in ", path.string()));
  }
  return value;
}

absl::StatusOr<int64_t> ReadInt(const std::filesystem::path& path) {
  auto text = ReadTrimmed(path);
  if (!text.ok()) return text.status();
  int64_t value = 0;
  const std::string& v = *text;
  auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), value, 10);
  if (v.empty() || ec != std::errc() || ptr != v.data() + v.size()) {
    return absl::InvalidArgumentError(absl::StrCat("malformed integer \"", v, "\" in ", path.string()));
  }
  return value;
}

absl::StatusOr<std::string> ReadLinkBasename(const std::filesystem::path& path) {
  char buf[4096];
  ssize_t n = ::readlink(path.c_str(), buf, sizeof buf - 1);
  if (n < 0) return ErrnoStatus(errno, "readlink", path);
  std::string_view target(buf, static_cast<size_t>(n));
  while (target.size() > 1 && target.back() == '/') target.remove_suffix(1);
  auto slash = target.rfind('/');
  return std::string(slash == std::string_view::npos ? target : target.substr(slash + 1));
}

absl::Status WriteAttribute(const std::filesystem::path& path, std::string_view data) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "open for write", path);
  ssize_t n;
  do {
    n = ::write(fd, data.data(), data.size());
  } while (n < 0 && errno == EINTR);
  int err = errno;
  ::close(fd);
  if (n < 0) return ErrnoStatus(err, absl::StrCat("write \"", std::string(data), "\" to"), path);
  if (static_cast<size_t>(n) != data.size()) {
    return absl::InternalError(absl::StrCat("short write to ", path.string(), ": ", n, " of ", data.size(), " bytes"));
  }
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::filesystem::path& path, std::string_view content, unsigned mode,
                                 Durability durability) {
  std::string temp = (path.parent_path() / absl::StrCat(".", path.filename().string(), ".XXXXXX")).string();
  const int fd = ::mkstemp(temp.data());
  if (fd < 0) return ErrnoStatus(errno, "create temporary file in", path.parent_path());
  int err = 0;
  for (size_t written = 0; written < content.size() && err == 0;) {
    const ssize_t n = ::write(fd, content.data() + written, content.size() - written);
    if (n < 0 && errno != EINTR) err = errno;
    if (n > 0) written += static_cast<size_t>(n);
  }
  if (err == 0 && ::fchmod(fd, mode) != 0) err = errno;
  if (err == 0 && durability == Durability::kAcrossReboots && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && ::rename(temp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(temp.c_str());
    return ErrnoStatus(err, "write", path);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> ListDir(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec);
  if (ec) return ErrnoStatus(ec.value(), "list", dir);
  std::vector<std::string> names;
  // increment(ec), never ++: the throwing increment is what a vanishing directory would trip.
  for (const std::filesystem::directory_iterator end; it != end; it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  if (ec) return ErrnoStatus(ec.value(), "list", dir);
  std::sort(names.begin(), names.end());
  return names;
}

bool Exists(const std::filesystem::path& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

}  // namespace vfio_agent::fs
