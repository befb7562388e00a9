#include "run_harness.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "curl/curl.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "support/ports.h"

extern char** environ;

namespace vfio_agent::daemon::testing {

bool WaitUntil(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

std::filesystem::path PodResourcesSocket(const plugin::testing::Node& node) {
  return node.kubelet_dir().parent_path() / "pod-resources.sock";
}

std::string DriverOf(const plugin::testing::Node& node, const std::string& bdf) {
  std::error_code ec;
  const auto link = std::filesystem::read_symlink(node.options.paths.sysfs_root / "bus/pci/devices" / bdf / "driver", ec);
  return ec ? "" : link.filename().string();
}

namespace {
// The agent this build made, unless VA_AGENT_BIN names another (a benchmark comparing two binaries).
const char* AgentBinary() {
  const char* chosen = std::getenv("VA_AGENT_BIN");
  return chosen != nullptr && *chosen != '\0' ? chosen : VA_AGENT_BIN;
}
}  // namespace

absl::StatusOr<std::unique_ptr<RunProcess>> RunProcess::Start(plugin::testing::Node& node,
                                                              const std::vector<std::string>& extra_args,
                                                              const std::vector<std::string>& extra_env) {
  std::unique_ptr<RunProcess> run(new RunProcess());
  run->health_port_ = vfio_agent::testing::UnusedLoopbackPort();
  run->metrics_port_ = vfio_agent::testing::UnusedLoopbackPort();
  run->log_ = node.kubelet_dir().parent_path() / "run.log";
  const char* binary = AgentBinary();
  std::vector<std::string> args = {binary,
                                   "run",
                                   "--sysfs-root",
                                   node.options.paths.sysfs_root.string(),
                                   "--dev-root",
                                   node.options.paths.dev_root.string(),
                                   "--kubelet-dir",
                                   node.kubelet_dir().string(),
                                   "--pod-resources-socket",
                                   PodResourcesSocket(node).string(),
                                   "--no-udev",
                                   "--listen-address",
                                   "127.0.0.1",
                                   "--health-port",
                                   std::to_string(run->health_port_),
                                   "--metrics-port",
                                   std::to_string(run->metrics_port_),
                                   "--log-level",
                                   "info"};
  // A short plugin rescan for the tests' churn, unless the caller sets its own (the CLI takes it once).
  if (std::find(extra_args.begin(), extra_args.end(), "--rescan-interval") == extra_args.end()) {
    args.insert(args.end(), {"--rescan-interval", "200"});
  }
  // The agent's state (vGPU catalogs, the Fabric Manager checkpoint) in the node's directory, never the host's.
  if (std::find(extra_args.begin(), extra_args.end(), "--state-dir") == extra_args.end()) {
    args.insert(args.end(), {"--state-dir", (node.kubelet_dir().parent_path() / "state").string()});
  }
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  // The test's own environment minus anything that would point the agent at a real cluster.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    if (entry.rfind("VFIO_GPU_AGENT_", 0) == 0 || entry.rfind("KUBERNETES_", 0) == 0 ||
        entry.rfind("NODE_NAME=", 0) == 0) {
      continue;
    }
    env_strings.push_back(entry);
  }
  env_strings.insert(env_strings.end(), extra_env.begin(), extra_env.end());
  std::vector<char*> envp;
  for (std::string& entry : env_strings) envp.push_back(entry.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 2, run->log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const int rc = ::posix_spawn(&run->pid_, binary, &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return absl::InternalError(absl::StrCat("posix_spawn ", binary, ": ", std::strerror(rc)));
  return run;
}

RunProcess::~RunProcess() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
}

std::optional<bool> RunProcess::Check(const std::string& service) const {
  auto stub = grpc::health::v1::Health::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(health_port_), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kPatience);
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  if (!stub->Check(&context, request, &response).ok()) return std::nullopt;
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
}

bool RunProcess::WaitReady(bool ready, std::chrono::milliseconds timeout) const {
  return WaitUntil([&] { return Check() == std::optional<bool>(ready); }, timeout);
}

namespace {
size_t Append(char* data, size_t size, size_t count, void* out) {
  static_cast<std::string*>(out)->append(data, size * count);
  return size * count;
}
}  // namespace

std::string RunProcess::Metrics() const {
  std::string body;
  CURL* curl = curl_easy_init();
  const std::string url = "http://127.0.0.1:" + std::to_string(metrics_port_) + "/metrics";
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, Append);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, 2000L);
  const CURLcode rc = curl_easy_perform(curl);
  curl_easy_cleanup(curl);
  return rc == CURLE_OK ? body : "";
}

bool RunProcess::WaitMetric(const std::string& line, std::chrono::milliseconds timeout) const {
  return WaitUntil([&] { return Metrics().find(line) != std::string::npos; }, timeout);
}

int RunProcess::SignalAndWait(int signal) {
  int status = -1;
  if (::kill(pid_, signal) == 0 && ::waitpid(pid_, &status, 0) == pid_) pid_ = -1;
  return status;
}

std::optional<int> RunProcess::ExitedOnItsOwn() {
  int status = 0;
  if (pid_ <= 0 || ::waitpid(pid_, &status, WNOHANG) != pid_) return std::nullopt;
  pid_ = -1;
  return status;
}

std::string RunProcess::Log() const {
  std::ifstream in(log_);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace vfio_agent::daemon::testing
