#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "daemon_impl.h"

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

std::optional<Readiness> Daemon::Impl::RefusalNow(const std::vector<std::string>& resource_names) {
  std::vector<std::string> why;
  for (const std::string& socket : ForeignPluginSockets(options_.serve.paths.kubelet_dir, resource_names)) {
    why.push_back(absl::StrCat("another device plugin answers on ", socket,
                               " (remove the GPU Operator's sandbox device plugin from this node)"));
  }
  if (reporter_) {
    const absl::StatusOr<Labels>& labels = PassLabels();
    if (!labels.ok()) {
      if (!labels_error_logged_) {
        spdlog::warn("coexistence: node labels unreadable ({}); deciding from the kubelet directory alone",
                     labels.status().ToString());
        labels_error_logged_ = true;
      }
    } else {
      labels_error_logged_ = false;
      for (const char* label : kOperatorLabels) {
        auto it = labels->find(label);
        if (it != labels->end() && it->second == "true") {
          why.push_back(absl::StrCat("node label ", label, "=true (set it to false: kubectl label node <node> ", label,
                                     "=false --overwrite)"));
        }
      }
    }
  }
  if (why.empty()) return std::nullopt;
  return Readiness{.ready = false,
                   .check_id = "coexistence.operator",
                   .reason = kOperatorReason,
                   .message = absl::StrCat("coexistence.operator: the GPU Operator still manages this node: ",
                                           absl::StrJoin(why, "; "), "; not binding or registering")};
}

bool Daemon::Impl::StillRefused(const std::vector<std::string>& resource_names) {
  if (std::optional<Readiness> refusal = RefusalNow(resource_names)) {
    next_coexistence_ = Clock::now() + options_.coexistence_recheck;
    next_pass_ = next_coexistence_;
    Publish(*refusal);
    return true;
  }
  refused_ = false;
  return false;
}

}  // namespace vfio_agent::daemon
