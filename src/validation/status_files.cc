// The GPU Operator's validation status files, which its sandbox device plugin's init container (and kata's)
// wait for: workload-type, then vfio-pci-ready (vm-passthrough) or vgpu-manager-ready and vgpu-devices-ready (vm-vgpu).
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
constexpr char kVgpuManagerReady[] = "vgpu-manager-ready";
constexpr char kVgpuDevicesReady[] = "vgpu-devices-ready";

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

// Present (an empty file) or absent, changed only when it differs, so watchers see no event while nothing does.
absl::Status SetMarker(const std::filesystem::path& dir, const char* name, bool present) {
  const std::filesystem::path marker = dir / name;
  if (present) {
    if (fs::Exists(marker)) return absl::OkStatus();
    if (auto status = WriteAtomically(dir, name, ""); !status.ok()) return status;
    spdlog::info("validate: created {}", marker.string());
    return absl::OkStatus();
  }
  if (::unlink(marker.c_str()) == 0) {
    spdlog::warn("validate: removed {}", marker.string());
  } else if (errno != ENOENT) {
    return fs::ErrnoStatus(errno, "remove", marker);
  }
  return absl::OkStatus();
}

// `workload-type` holds the mode and a newline, as the GPU Operator's validator writes it.
absl::Status SetWorkloadType(const std::filesystem::path& dir, Workload workload) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("create ", dir.string(), ": ", ec.message()));
  if (fs::ReadTrimmed(dir / kWorkloadType).value_or("") == WorkloadName(workload)) return absl::OkStatus();
  return WriteAtomically(dir, kWorkloadType, absl::StrCat(WorkloadName(workload), "\n"));
}

}  // namespace

absl::Status WriteStatusFiles(const std::filesystem::path& dir, bool host_ready) {
  if (auto status = SetWorkloadType(dir, Workload::kVmPassthrough); !status.ok()) return status;
  return SetMarker(dir, kReady, host_ready);
}

absl::Status WriteVgpuStatusFiles(const std::filesystem::path& dir, bool manager_ready, bool devices_ready) {
  if (auto status = SetWorkloadType(dir, Workload::kVmVgpu); !status.ok()) return status;
  // A file left from vm-passthrough would say GPUs are on vfio-pci; none is on a vm-vgpu node.
  if (auto status = SetMarker(dir, kReady, false); !status.ok()) return status;
  if (auto status = SetMarker(dir, kVgpuManagerReady, manager_ready); !status.ok()) return status;
  return SetMarker(dir, kVgpuDevicesReady, manager_ready && devices_ready);
}

}  // namespace vfio_agent::validation
