#include "vfio_gpu_agent/common/unix_socket.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "vfio_gpu_agent/common/fs.h"

namespace vfio_agent {

bool SomeoneListens(const std::filesystem::path& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  bool live = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return live;
}

absl::Status ClaimSocketPath(const std::filesystem::path& path) {
  if (path.string().size() >= sizeof(sockaddr_un{}.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path too long for sun_path: ", path.string()));
  }
  if (SomeoneListens(path)) return absl::AlreadyExistsError(absl::StrCat("another server answers on ", path.string()));
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return fs::ErrnoStatus(errno, "remove stale socket", path);
  return absl::OkStatus();
}

}  // namespace vfio_agent
