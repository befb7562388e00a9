// The GPU Operator's validation status files, which its sandbox device plugin's init container (and kata's)
// wait for: workload-type, then vfio-pci-ready.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/common/fs.h"
#include "vfio_gpu_agent/validation/check.h"

namespace vfio_agent::validation {
namespace {

constexpr char kWorkloadType[] = "workload-type";
constexpr char kReady[] = "vfio-pci-ready";
constexpr char kWorkload[] = "vm-passthrough\n";

// Readers never see a partial file: the content goes to a private temporary name in `dir`, then rename(2).
absl::Status WriteAtomically(const std::filesystem::path& dir, const std::string& name, std::string_view content) {
  std::string temp = (dir / absl::StrCat(".", name, ".XXXXXX")).string();
  int fd = ::mkstemp(temp.data());
  if (fd < 0) return fs::ErrnoStatus(errno, "create temporary file in", dir);
  ssize_t written = content.empty() ? 0 : ::write(fd, content.data(), content.size());
  int err = written == static_cast<ssize_t>(content.size()) ? 0 : (written < 0 ? errno : EIO);
  if (::fchmod(fd, 0644) != 0 && err == 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && ::rename(temp.c_str(), (dir / name).c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(temp.c_str());
    return fs::ErrnoStatus(err, "write", dir / name);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteStatusFiles(const std::filesystem::path& dir, bool host_ready) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("create ", dir.string(), ": ", ec.message()));
  // Rewritten only when it differs, so watchers of the directory see no events while nothing changes.
  if (fs::ReadTrimmed(dir / kWorkloadType).value_or("") != "vm-passthrough") {
    if (auto status = WriteAtomically(dir, kWorkloadType, kWorkload); !status.ok()) return status;
  }
  const std::filesystem::path ready = dir / kReady;
  if (host_ready) {
    if (fs::Exists(ready)) return absl::OkStatus();
    if (auto status = WriteAtomically(dir, kReady, ""); !status.ok()) return status;
    spdlog::info("validate: layers 1-2 pass; created {}", ready.string());
    return absl::OkStatus();
  }
  if (::unlink(ready.c_str()) == 0) {
    spdlog::warn("validate: layers 1-2 fail; removed {}", ready.string());
  } else if (errno != ENOENT) {
    return fs::ErrnoStatus(errno, "remove", ready);
  }
  return absl::OkStatus();
}

}  // namespace vfio_agent::validation
