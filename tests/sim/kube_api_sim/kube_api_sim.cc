#include "kube_api_sim.h"

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

namespace vfio_agent::sim {
namespace {

bool OnPath(const char* program) {
  const char* path = ::getenv("PATH");
  if (path == nullptr) return false;
  std::string_view rest(path);
  while (!rest.empty()) {
    size_t colon = rest.find(':');
    std::filesystem::path candidate = std::filesystem::path(std::string(rest.substr(0, colon))) / program;
    if (::access(candidate.c_str(), X_OK) == 0) return true;
    if (colon == std::string_view::npos) break;
    rest.remove_prefix(colon + 1);
  }
  return false;
}

// Runs a program to completion with stdout and stderr discarded; its exit status.
int RunQuietly(const std::vector<std::string>& argv) {
  pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    int null = ::open("/dev/null", O_RDWR);
    ::dup2(null, STDIN_FILENO);
    ::dup2(null, STDOUT_FILENO);
    ::dup2(null, STDERR_FILENO);
    std::vector<char*> args;
    for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// One line from fd (without the newline), waiting at most timeout; `pending` keeps what was read past it.
absl::StatusOr<std::string> ReadLine(int fd, std::string& pending, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    size_t newline = pending.find('\n');
    if (newline != std::string::npos) {
      std::string line = pending.substr(0, newline);
      pending.erase(0, newline + 1);
      return line;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return absl::DeadlineExceededError("kube-api-sim: no answer in time");
    pollfd pfd{.fd = fd, .events = POLLIN, .revents = 0};
    int ready = ::poll(&pfd, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    char buffer[65536];
    ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::UnavailableError("kube-api-sim: stdout closed (the server exited)");
    pending.append(buffer, static_cast<size_t>(n));
  }
}

}  // namespace

std::filesystem::path KubeApiSim::Script() { return VA_KUBE_API_SIM_SCRIPT; }

bool KubeApiSim::Available(bool tls) { return OnPath("python3") && (!tls || OnPath("openssl")); }

absl::StatusOr<std::unique_ptr<KubeApiSim>> KubeApiSim::Start(const std::filesystem::path& work_dir,
                                                              KubeApiSimOptions options) {
  std::unique_ptr<KubeApiSim> sim(new KubeApiSim());
  sim->token_ = options.token;
  sim->log_file_ = std::filesystem::absolute(work_dir) / "kube-api-sim.log";
  std::vector<std::string> argv = {"python3", Script().string(), "--port", "0", "--log", sim->log_file_.string(),
                                   "--token", options.token};
  for (const std::string& node : options.nodes) {
    argv.push_back("--node");
    argv.push_back(node);
  }
  if (!options.feature_gates.empty()) argv.insert(argv.end(), {"--feature-gates", options.feature_gates});
  // A self-signed P-256 certificate (fast to make) for a server or a client.
  auto make_certificate = [&](const std::string& name, const std::string& subject,
                              const std::string& extension) -> absl::Status {
    const std::filesystem::path cert = std::filesystem::absolute(work_dir) / (name + ".crt");
    const std::filesystem::path key = std::filesystem::absolute(work_dir) / (name + ".key");
    int status = RunQuietly({"openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                             "-nodes", "-days", "2", "-subj", subject, "-addext", extension, "-keyout", key.string(),
                             "-out", cert.string()});
    if (status != 0) return absl::InternalError(absl::StrCat("openssl req for ", cert.string(), " exited ", status));
    return absl::OkStatus();
  };
  if (options.tls) {
    absl::Status made = make_certificate("kube-api-sim", "/CN=kube-api-sim", "subjectAltName=IP:127.0.0.1,DNS:localhost");
    if (!made.ok()) return made;
    sim->ca_file_ = std::filesystem::absolute(work_dir) / "kube-api-sim.crt";
    argv.insert(argv.end(), {"--tls-cert", sim->ca_file_.string(), "--tls-key",
                             (std::filesystem::absolute(work_dir) / "kube-api-sim.key").string()});
    if (options.client_cert) {
      made = make_certificate("kube-api-sim-client", "/CN=vfio-gpu-agent", "extendedKeyUsage=clientAuth");
      if (!made.ok()) return made;
      sim->client_cert_file_ = std::filesystem::absolute(work_dir) / "kube-api-sim-client.crt";
      sim->client_key_file_ = std::filesystem::absolute(work_dir) / "kube-api-sim-client.key";
      argv.insert(argv.end(), {"--client-ca", sim->client_cert_file_.string()});
    }
  }

  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  pid_t pid = ::fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // a test that dies takes its API server with it (see sim_process.cc)
    ::dup2(in[0], STDIN_FILENO);
    ::dup2(out[1], STDOUT_FILENO);
    std::vector<char*> args;
    for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  sim->pid_ = pid;
  sim->control_in_ = in[1];
  sim->control_out_ = out[0];
  absl::StatusOr<std::string> line = ReadLine(sim->control_out_, sim->pending_, std::chrono::seconds(20));
  if (!line.ok()) return line.status();
  if (!absl::StartsWith(*line, "LISTENING ")) {
    return absl::InternalError(absl::StrCat("kube-api-sim: unexpected first line: ", *line));
  }
  sim->url_ = line->substr(std::strlen("LISTENING "));
  return sim;
}

KubeApiSim::~KubeApiSim() {
  if (control_in_ >= 0) ::close(control_in_);
  if (pid_ > 0) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (::waitpid(pid_, nullptr, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() >= deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  if (control_out_ >= 0) ::close(control_out_);
}

absl::StatusOr<std::filesystem::path> KubeApiSim::WriteKubeconfig(const std::filesystem::path& path) const {
  std::ofstream out(path, std::ios::trunc);
  out << "apiVersion: v1\nkind: Config\ncurrent-context: sim\n"
      << "clusters:\n- name: sim\n  cluster:\n    server: " << url_ << "\n";
  if (!ca_file_.empty()) out << "    certificate-authority: " << ca_file_.string() << "\n";
  out << "users:\n- name: sim\n  user:\n    token: " << token_ << "\n"
      << "contexts:\n- name: sim\n  context:\n    cluster: sim\n    user: sim\n";
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path.string()));
  return path;
}

absl::StatusOr<std::string> KubeApiSim::Control(absl::string_view command) {
  std::lock_guard<std::mutex> lock(control_mutex_);
  std::string line = absl::StrCat(command, "\n");
  if (::write(control_in_, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    return absl::UnavailableError(absl::StrCat("kube-api-sim: cannot send '", command, "': ", std::strerror(errno)));
  }
  absl::StatusOr<std::string> reply = ReadLine(control_out_, pending_, std::chrono::seconds(20));
  if (!reply.ok()) return reply.status();
  if (*reply == "OK") return std::string();
  if (absl::StartsWith(*reply, "OK ")) return reply->substr(3);
  return absl::InvalidArgumentError(absl::StrCat("kube-api-sim: '", command, "': ", *reply));
}

absl::StatusOr<nlohmann::json> KubeApiSim::Node(absl::string_view name) {
  absl::StatusOr<std::string> reply = Control(absl::StrCat("get-node ", name));
  if (!reply.ok()) return reply.status();
  return nlohmann::json::parse(*reply, nullptr, /*allow_exceptions=*/false);
}

absl::StatusOr<nlohmann::json> KubeApiSim::Events() {
  absl::StatusOr<std::string> reply = Control("events");
  if (!reply.ok()) return reply.status();
  return nlohmann::json::parse(*reply, nullptr, /*allow_exceptions=*/false);
}

absl::StatusOr<nlohmann::json> KubeApiSim::Slices() {
  absl::StatusOr<std::string> reply = Control("slices");
  if (!reply.ok()) return reply.status();
  return nlohmann::json::parse(*reply, nullptr, /*allow_exceptions=*/false);
}

std::vector<KubeApiRequest> KubeApiSim::Log() const {
  std::vector<KubeApiRequest> requests;
  std::ifstream in(log_file_);
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json entry = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!entry.is_object()) continue;  // a line the server is still writing
    KubeApiRequest request;
    request.method = entry.value("method", "");
    request.path = entry.value("path", "");
    request.content_type = entry.value("content_type", "");
    const nlohmann::json& status = entry["status"];
    request.status = status.is_string() ? status.get<std::string>() : status.dump();
    request.body = entry["body"];
    request.watch = entry.value("watch", false);
    requests.push_back(std::move(request));
  }
  return requests;
}

size_t KubeApiSim::Count(absl::string_view method, absl::string_view path_prefix, absl::string_view status) const {
  size_t count = 0;
  for (const KubeApiRequest& request : Log()) {
    if ((method.empty() || request.method == method) && absl::StartsWith(request.path, path_prefix) &&
        (status.empty() || request.status == status)) {
      ++count;
    }
  }
  return count;
}

bool KubeApiSim::WaitFor(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

}  // namespace vfio_agent::sim
