#include "sim_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace vfio_agent::sim {
namespace {

// waitpid with a deadline; -1 when the child is still running.
int WaitExit(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    int status = 0;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0 && errno != EINTR) return 0;
    if (std::chrono::steady_clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

bool IsMounted(const std::filesystem::path& path) {
  std::ifstream mounts("/proc/self/mountinfo");
  std::string line;
  while (std::getline(mounts, line)) {
    std::vector<absl::string_view> fields = absl::StrSplit(line, ' ');
    if (fields.size() > 4 && fields[4] == path.string()) return true;
  }
  return false;
}

void LazyUnmount(const std::filesystem::path& path) {
  if (!IsMounted(path)) return;
  pid_t pid = fork();
  if (pid == 0) {
    int null = open("/dev/null", O_WRONLY);
    dup2(null, STDOUT_FILENO);
    dup2(null, STDERR_FILENO);
    execlp("fusermount3", "fusermount3", "-u", "-z", path.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  if (pid > 0) waitpid(pid, nullptr, 0);
}

}  // namespace

std::filesystem::path SysfsSimBinary() { return VA_SYSFS_SIM_BINARY; }
std::filesystem::path NodesDir() { return VA_SIM_NODES_DIR; }
std::filesystem::path NodeFile(absl::string_view name) { return NodesDir() / std::string(name); }

absl::StatusOr<std::unique_ptr<SimProcess>> SimProcess::Start(const std::filesystem::path& node_file,
                                                              const std::filesystem::path& root_dir,
                                                              std::chrono::milliseconds ready_timeout) {
  const std::filesystem::path root = std::filesystem::absolute(root_dir);
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  const std::string binary = SysfsSimBinary().string();
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  if (pid == 0) {
    // A test that dies (an abort, a fatal signal) must not leave its simulator behind: it would keep the test's
    // stdout open and hold ctest until its timeout, and keep its FUSE mount.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    dup2(out[1], STDOUT_FILENO);
    execl(binary.c_str(), binary.c_str(), "--node", node_file.c_str(), "--root", root.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out[1]);
  std::unique_ptr<SimProcess> sim(new SimProcess(pid, root));
  std::string line;
  const auto deadline = std::chrono::steady_clock::now() + ready_timeout;
  while (line.find('\n') == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd pfd{out[0], POLLIN, 0};
    if (left.count() <= 0 || poll(&pfd, 1, static_cast<int>(left.count())) <= 0) break;
    char buf[256];
    ssize_t n = read(out[0], buf, sizeof buf);
    if (n <= 0) break;
    line.append(buf, static_cast<size_t>(n));
  }
  close(out[0]);  // the sim prints nothing after READY
  if (!absl::StartsWith(line, "READY ")) {
    return absl::UnavailableError(absl::StrCat("sysfs-sim on ", node_file.string(), " at ", root.string(),
                                               " did not report READY (got \"", line, "\"); see its stderr"));
  }
  return sim;
}

SimProcess::~SimProcess() { (void)Stop(); }

absl::StatusOr<int> SimProcess::Stop() {
  if (pid_ <= 0) return absl::FailedPreconditionError("sysfs-sim already stopped");
  kill(pid_, SIGTERM);
  int status = WaitExit(pid_, std::chrono::seconds(5));
  if (status < 0) {
    kill(pid_, SIGKILL);
    status = WaitExit(pid_, std::chrono::seconds(5));
  }
  pid_ = -1;
  LazyUnmount(sysfs_root());
  if (status < 0 || !WIFEXITED(status)) return absl::InternalError("sysfs-sim did not exit on SIGTERM");
  return WEXITSTATUS(status);
}

absl::Status SimProcess::Control(absl::string_view command) const {
  const std::filesystem::path path = sysfs_root() / ".sim/control";
  int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("open ", path.string(), ": ", strerror(errno)));
  ssize_t n = write(fd, command.data(), command.size());
  int err = errno;
  close(fd);
  if (n < 0) {
    return absl::InvalidArgumentError(absl::StrCat("control \"", command, "\": ", strerror(err)));
  }
  return absl::OkStatus();
}

std::vector<std::string> SimProcess::Log() const {
  std::ifstream in(sysfs_root() / ".sim/log");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

}  // namespace vfio_agent::sim
