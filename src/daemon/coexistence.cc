#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "vfio_gpu_agent/daemon/daemon.h"

namespace vfio_agent::daemon {
namespace {

// A socket someone listens on accepts the connection (or reports a full backlog); one nobody serves any
// more (left by a process that died) refuses it.
bool Answers(const std::filesystem::path& socket_path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string path = socket_path.string();
  if (path.size() >= sizeof address.sun_path) return false;
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address);
  const int err = errno;
  ::close(fd);
  return rc == 0 || err == EAGAIN || err == EINPROGRESS;
}

}  // namespace

std::vector<std::string> ForeignPluginSockets(const std::filesystem::path& kubelet_dir,
                                              const std::vector<std::string>& resource_names) {
  std::set<std::string> ours;
  for (const std::string& name : resource_names) ours.insert(plugin::SocketName(name));
  std::vector<std::string> foreign;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(kubelet_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const bool candidate = ours.contains(name) || (name.rfind("nvidia", 0) == 0 && name.ends_with(".sock"));
    std::error_code type_ec;
    if (!candidate || !it->is_socket(type_ec)) continue;
    if (Answers(it->path())) foreign.push_back(it->path().string());
  }
  std::sort(foreign.begin(), foreign.end());
  return foreign;
}

}  // namespace vfio_agent::daemon
