// Chaos soak: the real node daemon (`vfio-gpu-agent run`, which binds and advertises) on the simulated 8x H200 node
// under the kubelet simulator, for VA_SOAK_SECONDS (default 60) with a random schedule seeded by VA_SOAK_SEED
// (default 1) of: kubelet restarts (kubelet.sock at once or late), ListAndWatch stream cuts, unbinds that take a
// while and binds that fail with an errno, surprise removal + rescan, dead config space, external set-driver, agent
// SIGTERM + restart, VM pod admissions and releases. After every fault the kubelet's healthy set must equal the GPUs
// that are healthy in sysfs (present, on vfio-pci, config space alive, /dev/vfio/<group> present) within
// kHardBound; latencies over kTargetBound are counted. The agent must never unbind a GPU allocated to a running pod
// (from the simulator's log of kernel writes). The agent must not crash or fail a SIGTERM; within one agent process
// the fds it holds do not rise from after the warm-up to the stop, the floors of its own threads and RSS do not
// rise, its worker pool keeps no more idle workers than its cap, and gRPC's self-sized thread pools stay within a
// small bound. Prints the count of each fault and the worst latencies.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "absl/strings/str_split.h"
#include "fabric_fixture.h"
#include "plugin_harness.h"
#include "run_harness.h"
#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/common/worker_pool.h"
#include "vfio_gpu_agent/plugin/devices.h"

namespace vfio_agent::plugin::testing {
namespace {

using daemon::testing::PodResourcesSocket;
using daemon::testing::RunProcess;

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kTargetBound{100};  // the bound; counted, not asserted (shared 2-core machine)
constexpr milliseconds kHardBound{10000};  // a convergence that never comes within this fails the soak
constexpr int kWarmupActions = 30;         // per agent process, before its fds/threads/RSS are sampled
constexpr int64_t kRssSlackKb = 1024;
// gRPC's named threads are process-wide pools that gRPC sizes itself, so they are not held flat like the agent's
// own threads. Being global, they cannot grow per channel, stream or call; they add a thread when work arrives while
// every thread of the pool is busy (a peak of concurrency, e.g. a preempted thread under load; the event engine at
// most one a second) and give it back late or never (1.51's timer manager: "the number of timer threads is always
// increasing until all the threads are stopped"; event-engine threads after 30 s without work). Seen: +2 in one
// process over 60 s (CI, 11 -> 13), never more in 180 s under stress-ng. A leak that grows with faults (25 a second
// here) passes this bound within the first second of it.
constexpr int kGrpcPoolGrowth = 4;

// By the names gRPC 1.51 gives its threads (comm is cut at 15 characters); every other thread is the agent's.
bool IsGrpcThread(const std::string& comm) {
  return comm == "grpc_global_tim" || comm == "default-executo" || comm == "resolver-execut" ||
         comm == "event_engine" || comm == "timer_manager";
}

int EnvInt(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::atoi(value) : fallback;
}

struct ProcessStats {
  int threads = 0;       // the agent's own but its pool's workers: a fixed set, plus short-lived ones
  int workers = 0;       // its pool's: idle ones are kept, up to ProcessWorkerPoolIdleCap()
  int grpc_threads = 0;  // gRPC's pools
  int64_t rss_kb = 0;
};

ProcessStats Sample(pid_t pid) {
  ProcessStats stats;
  const std::filesystem::path proc = "/proc/" + std::to_string(pid);
  std::error_code ec;
  std::ifstream status(proc / "status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) stats.rss_kb = std::stoll(line.substr(6));
  }
  for (auto it = std::filesystem::directory_iterator(proc / "task", ec); !ec && it != std::filesystem::directory_iterator();
       it.increment(ec)) {
    std::ifstream comm(it->path() / "comm");
    std::string name;
    if (!std::getline(comm, name)) continue;  // the thread exited between the listing and the read
    ++(IsGrpcThread(name) ? stats.grpc_threads : name == "va-worker" ? stats.workers : stats.threads);
  }
  return stats;
}

// "7->socket:[123]" per open fd.
std::set<std::string> OpenFds(pid_t pid) {
  std::set<std::string> fds;
  std::error_code ec;
  const std::filesystem::path dir = "/proc/" + std::to_string(pid) + "/fd";
  for (auto it = std::filesystem::directory_iterator(dir, ec); !ec && it != std::filesystem::directory_iterator();
       it.increment(ec)) {
    std::error_code link_ec;
    fds.insert(it->path().filename().string() + "->" + std::filesystem::read_symlink(it->path(), link_ec).string());
  }
  return fds;
}

std::set<std::string> Intersect(const std::set<std::string>& a, const std::set<std::string>& b) {
  std::set<std::string> both;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::inserter(both, both.end()));
  return both;
}

// The fds the agent holds: those open, with the same target, in every one of kHeldReads reads 50 ms apart. The
// soak injects nothing meanwhile, so what the agent keeps holds still, while a scan's attribute reads, a readiness
// pass's pod-resources connection and a Register's connection come and go between the reads.
constexpr int kHeldReads = 10;
constexpr int kHeldWindows = 5;
std::set<std::string> HeldFds(pid_t pid) {
  std::set<std::string> held = OpenFds(pid);
  for (int read = 1; read < kHeldReads; ++read) {
    std::this_thread::sleep_for(milliseconds(50));
    held = Intersect(held, OpenFds(pid));
  }
  return held;
}

// `run` as the DaemonSet runs it, with the simulated roots (health and metrics on loopback ports); the simulator
// has no uevents, so the plugin's safety rescan is short (inotify on <dev_root>/vfio sees group nodes, not config
// space going dead).
class AgentProcess {
 public:
  bool Start(Node& node) {
    auto started = RunProcess::Start(node, {"--rescan-interval", "50"});
    if (!started.ok()) return false;
    run_ = *std::move(started);
    actions_since_start_ = 0;
    samples_.clear();
    baseline_fds_.reset();
    registered_ = false;
    return true;
  }

  // SIGTERM and wait; the exit status must be 0 (graceful shutdown).
  int Stop() { return ExitCode(run_->SignalAndWait(SIGTERM)); }

  // Exit status if the process died on its own.
  std::optional<int> Died() {
    auto status = run_->ExitedOnItsOwn();
    return status ? std::optional<int>(ExitCode(*status)) : std::nullopt;
  }

  pid_t pid() const { return run_->pid(); }
  std::string Log() const { return run_->Log(); }
  int actions_since_start_ = 0;
  std::vector<ProcessStats> samples_;  // after the warm-up, every 2 actions
  std::optional<std::set<std::string>> baseline_fds_;  // held after the warm-up
  bool registered_ = false;  // at the kubelet, after the last action converged

 private:
  static int ExitCode(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }
  std::unique_ptr<RunProcess> run_;
};

// The agent's unix sockets as `ss` shows them (state, peer inode; a client socket has no local path), when a
// floor rose.
std::string UnixSockets(pid_t pid) {
  std::string out;
  FILE* ss = popen("ss -xanp 2>/dev/null", "r");
  if (ss == nullptr) return out;
  const std::string tag = "pid=" + std::to_string(pid) + ",";
  char line[1024];
  while (fgets(line, sizeof line, ss) != nullptr) {
    if (std::string(line).find(tag) != std::string::npos) out += line;
  }
  pclose(ss);
  return out;
}

// "7->socket:[123] 9->/dev/null ": the entries of `a` that `b` lacks.
std::string Minus(const std::set<std::string>& a, const std::set<std::string>& b) {
  std::string out;
  for (const std::string& entry : a) {
    if (!b.count(entry)) out += entry + " ";
  }
  return out;
}

// "grpc_global_tim vfio-gpu-agent ..." for a failure message.
std::string ThreadNames(pid_t pid) {
  std::string out;
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    std::getline(comm, name);
    out += name + " ";
  }
  return out;
}

std::string ReadLinkName(const std::filesystem::path& link) {
  std::error_code ec;
  auto target = std::filesystem::read_symlink(link, ec);
  return ec ? "" : target.filename().string();
}

// The GPUs the agent must advertise healthy, from the simulated sysfs and dev tree.
std::set<std::string> HealthyInSysfs(const HostPaths& paths) {
  std::set<std::string> healthy;
  for (const std::string& bdf : kH200Gpus) {
    const std::filesystem::path dir = paths.sysfs_root / "bus/pci/devices" / bdf;
    std::error_code ec;
    if (!std::filesystem::exists(dir, ec)) continue;
    if (ReadLinkName(dir / "driver") != "vfio-pci") continue;
    const std::string group = ReadLinkName(dir / "iommu_group");
    if (group.empty() || !std::filesystem::exists(paths.dev_root / "vfio" / group, ec)) continue;
    auto vendor = ReadConfigVendor(paths, bdf);
    if (!vendor.ok() || *vendor == 0xffff) continue;
    healthy.insert(bdf);
  }
  return healthy;
}

std::set<std::string> HealthyAtKubelet(const kubeletsim::KubeletSim& kubelet, bool* registered) {
  auto resources = kubelet.Resources();
  auto it = resources.find(kH200);
  *registered = it != resources.end() && it->second.registered;
  if (it == resources.end()) return {};
  return {it->second.healthy.begin(), it->second.healthy.end()};
}

bool WriteAttr(const std::filesystem::path& path, const std::string& value) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::write(fd, value.data(), value.size()) == static_cast<ssize_t>(value.size());
  ::close(fd);
  return ok;
}

// A quarter of VA_SOAK_SECONDS goes to the Fabric Manager soak below.
int FabricSeconds() { return EnvInt("VA_SOAK_SECONDS", 60) / 4; }

TEST(Soak, RandomFaultsKeepTheAdvertisedSetExact) {
  const int seconds = EnvInt("VA_SOAK_SECONDS", 60) - FabricSeconds();
  const unsigned seed = static_cast<unsigned>(EnvInt("VA_SOAK_SEED", 1));
  spdlog::set_level(spdlog::level::err);
  auto created = Node::Create("hgx-h200-8gpu.json");
  if (!created.ok() && created.status().message().find("fuse") != std::string::npos) {
    GTEST_SKIP() << created.status();
  }
  ASSERT_TRUE(created.ok()) << created.status();
  Node& node = **created;
  // The GPUs start on nvidia, as on a fresh node: `run` binds them.
  kubeletsim::Options kubelet_options;
  kubelet_options.pod_resources_socket = PodResourcesSocket(node);
  ASSERT_TRUE(node.StartKubelet(kubelet_options).ok());
  AgentProcess agent;
  ASSERT_TRUE(agent.Start(node));
  ASSERT_TRUE(node.WaitForCounts(kH200, 8, 8, kHardBound));

  std::mt19937 rng(seed);
  auto pick_gpu = [&] { return kH200Gpus[std::uniform_int_distribution<size_t>(0, kH200Gpus.size() - 1)(rng)]; };
  std::map<std::string, int> counts;
  std::map<std::string, double> worst_ms;
  int over_target = 0, pods = 0, pod_serial = 0;
  std::vector<std::string> running_pods;
  std::map<std::string, std::vector<std::string>> pod_gpus;  // running pod -> its GPUs
  std::set<std::string> removed;
  // GPUs a VM holds. The kernel blocks an unbind from vfio-pci while a VM has the group open, so no external actor
  // changes their driver here; a surprise removal takes the GPU from its VM (it comes back as a new device).
  auto held = [&] {
    std::set<std::string> gpus;
    for (const auto& [pod, bdfs] : pod_gpus) gpus.insert(bdfs.begin(), bdfs.end());
    return gpus;
  };
  auto pick_free_gpu = [&]() -> std::optional<std::string> {
    const std::set<std::string> busy = held();
    std::vector<std::string> free;
    for (const std::string& bdf : kH200Gpus) {
      if (!busy.count(bdf)) free.push_back(bdf);
    }
    if (free.empty()) return std::nullopt;
    return free[std::uniform_int_distribution<size_t>(0, free.size() - 1)(rng)];
  };
  int agent_binds = 0, agent_unbinds = 0, held_gpu_steps = 0;
  ProcessStats worst_growth;
  int checked_processes = 0;
  constexpr size_t kWindow = 10;
  auto floor = [&](const std::vector<ProcessStats>& samples, size_t begin) {
    ProcessStats low = samples[begin];
    for (size_t i = begin; i < begin + kWindow; ++i) {
      low.threads = std::min(low.threads, samples[i].threads);
      low.workers = std::min(low.workers, samples[i].workers);
      low.grpc_threads = std::min(low.grpc_threads, samples[i].grpc_threads);
      low.rss_kb = std::min(low.rss_kb, samples[i].rss_kb);
    }
    return low;
  };
  auto check_flat = [&](const AgentProcess& process) {
    const auto& samples = process.samples_;
    if (samples.size() < 2 * kWindow) return;  // too short-lived to tell a floor from noise
    const ProcessStats first = floor(samples, 0), last = floor(samples, samples.size() - kWindow);
    ++checked_processes;
    worst_growth.threads = std::max(worst_growth.threads, last.threads - first.threads);
    worst_growth.grpc_threads = std::max(worst_growth.grpc_threads, last.grpc_threads - first.grpc_threads);
    worst_growth.rss_kb = std::max(worst_growth.rss_kb, last.rss_kb - first.rss_kb);
    EXPECT_LE(last.threads, first.threads) << "the agent's threads: floor rose over " << samples.size()
                                           << " samples: " << ThreadNames(process.pid());
    EXPECT_LE(last.rss_kb, first.rss_kb + kRssSlackKb) << "RSS: floor rose by more than 1 MB";
    worst_growth.workers = std::max(worst_growth.workers, last.workers);
    EXPECT_LE(last.workers, static_cast<int>(ProcessWorkerPoolIdleCap()))
        << "workers: more kept than the pool's idle cap: " << ThreadNames(process.pid());
    EXPECT_LE(last.grpc_threads, first.grpc_threads + kGrpcPoolGrowth)
        << "gRPC's pools: floor rose over " << samples.size() << " samples: " << ThreadNames(process.pid());
  };
  // Fds are compared as the agent holds them (HeldFds) after the warm-up and before the process stops, each while
  // registered (one resource server and the kubelet's connection to it). By count: a socket on a new inode in place
  // of an old one is the same state.
  int fd_checked_processes = 0, worst_fd_growth = 0, most_windows = 1;
  auto check_fds = [&](const AgentProcess& process) {
    if (!process.baseline_fds_ || !process.registered_) return;
    const std::set<std::string>& baseline = *process.baseline_fds_;
    // A scan keeps bus/pci/devices open while it reads every device, and the FUSE node can stretch that past one
    // window (seen once in CI). So a rise is looked at again, up to kHeldWindows windows in all, keeping what was
    // held through every one: a scan ends, a kept fd stays.
    std::set<std::string> now = HeldFds(process.pid());
    for (int window = 1; window < kHeldWindows && now.size() > baseline.size(); ++window) {
      now = Intersect(now, HeldFds(process.pid()));
      most_windows = std::max(most_windows, window + 1);
    }
    ++fd_checked_processes;
    worst_fd_growth = std::max(worst_fd_growth, static_cast<int>(now.size()) - static_cast<int>(baseline.size()));
    EXPECT_LE(now.size(), baseline.size())
        << "open fds rose within one agent process; held after the warm-up only: " << Minus(baseline, now)
        << "; held now only: " << Minus(now, baseline) << "\n" << UnixSockets(process.pid());
  };
  const char* const kFaults[] = {"kubelet_restart", "kubelet_restart_late_sock", "stream_cut", "slow_unbind",
                                 "bind_errno", "surprise_remove_rescan", "dead_config", "external_set_driver",
                                 "agent_restart", "admit", "release", "heal"};
  // Weights: agent restarts are rare so each process lives long enough to check that it stays flat.
  const std::vector<double> kWeights = {3, 1, 4, 3, 3, 3, 3, 4, 0.3, 6, 5, 6};
  std::discrete_distribution<int> choose(kWeights.begin(), kWeights.end());
  const Clock::time_point end = Clock::now() + std::chrono::seconds(seconds);
  int actions = 0;
  while (Clock::now() < end) {
    const std::string fault = kFaults[choose(rng)];
    std::string gpu = pick_gpu();
    const HostPaths& paths = node.options.paths;
    bool injected = true;
    const std::set<std::string> held_before = held();
    if (fault == "slow_unbind" || fault == "bind_errno" || fault == "external_set_driver") {
      const std::optional<std::string> free = pick_free_gpu();
      if (!free) {
        counts[fault + "_all_held"]++;
        continue;
      }
      gpu = *free;
    }
    if (fault == "kubelet_restart") {
      ASSERT_TRUE(node.kubelet().Restart().ok());
    } else if (fault == "kubelet_restart_late_sock") {
      // The other start order: sockets deleted first, kubelet.sock a while later.
      node.kubelet().Stop();
      kubeletsim::Options late = kubelet_options;
      late.kubelet_sock_delay = milliseconds(std::uniform_int_distribution<int>(20, 300)(rng));
      ASSERT_TRUE(node.StartKubelet(late).ok());
    } else if (fault == "stream_cut") {
      injected = node.kubelet().CloseStream(kH200).ok();
    } else if (fault == "slow_unbind") {
      // An operator's unbind that the driver takes a while over; the GPU goes, and comes back when healed.
      if (ReadLinkName(paths.sysfs_root / "bus/pci/devices" / gpu / "driver").empty()) {
        injected = false;
      } else {
        const int delay = std::uniform_int_distribution<int>(10, 400)(rng);
        ASSERT_TRUE(node.Control("unbind-delay " + gpu + " " + std::to_string(delay)).ok());
        // The write blocks for the delay while the agent keeps rescanning.
        WriteAttr(paths.sysfs_root / "bus/pci/devices" / gpu / "driver/unbind", gpu);
        (void)node.Control("unbind-delay " + gpu + " 0");
      }
    } else if (fault == "bind_errno") {
      // A bind to vfio-pci that the driver's probe fails: the GPU stays unbound and must not be advertised.
      static const char* const kErrnos[] = {"EBUSY", "ENODEV", "EINVAL", "ENOMEM", "EIO"};
      const std::string err = kErrnos[std::uniform_int_distribution<int>(0, 4)(rng)];
      (void)node.Control("set-driver " + gpu + " none");
      (void)node.Control("bind-errno " + gpu + " " + err);
      WriteAttr(paths.sysfs_root / "bus/pci/devices" / gpu / "driver_override", "vfio-pci");
      WriteAttr(paths.sysfs_root / "bus/pci/drivers/vfio-pci/bind", gpu);
      (void)node.Control("bind-errno " + gpu + " 0");
    } else if (fault == "surprise_remove_rescan") {
      injected = node.Control("remove " + gpu).ok();
      if (injected) {
        removed.insert(gpu);
        for (auto& [pod, bdfs] : pod_gpus) std::erase(bdfs, gpu);
      }
    } else if (fault == "dead_config") {
      injected = node.Control("dead " + gpu + " 1").ok();
    } else if (fault == "external_set_driver") {
      static const char* const kDrivers[] = {"nvidia", "none", "vfio-pci"};
      injected = node.Control("set-driver " + gpu + " " + kDrivers[std::uniform_int_distribution<int>(0, 2)(rng)]).ok();
    } else if (fault == "agent_restart") {
      check_flat(agent);
      check_fds(agent);
      const int status = agent.Stop();
      ASSERT_EQ(status, 0) << "agent exited " << status << " on SIGTERM; its log:\n" << agent.Log();
      ASSERT_TRUE(agent.Start(node));
    } else if (fault == "admit") {
      const int64_t want = std::uniform_int_distribution<int>(1, 2)(rng);
      const std::string name = "vm-" + std::to_string(++pod_serial);
      auto admitted = node.kubelet().Admit({.name = name, .limits = {{kH200, want}}});
      if (admitted.ok()) {
        running_pods.push_back(name);
        pod_gpus[name] = admitted->devices[kH200];
        ++pods;
      } else {
        counts["admit_refused"]++;
      }
    } else if (fault == "release") {
      injected = !running_pods.empty();
      if (injected) {
        node.kubelet().Release(running_pods.front());
        pod_gpus.erase(running_pods.front());
        running_pods.erase(running_pods.begin());
      }
    } else if (fault == "heal") {
      // Undo: rescan brings removed GPUs back (on nvidia, for the agent to bind), config alive again, and an
      // operator puts free GPUs back on vfio-pci (the agent's own retries back off up to 5 min).
      if (!removed.empty()) {
        ASSERT_TRUE(node.Control("rescan").ok());
        removed.clear();
      }
      const std::set<std::string> busy = held();
      for (const std::string& bdf : kH200Gpus) {
        (void)node.Control("dead " + bdf + " 0");
        if (!busy.count(bdf)) (void)node.Control("set-driver " + bdf + " vfio-pci");
      }
    }
    if (injected) counts[fault]++;
    ++actions;

    // The advertised set converges on the truth in sysfs.
    const Clock::time_point changed = Clock::now();
    std::set<std::string> expected, observed;
    bool registered = false;
    while (true) {
      if (auto died = agent.Died()) FAIL() << "agent died (status " << *died << ") after " << fault << "; its log:\n" << agent.Log();
      expected = HealthyInSysfs(paths);
      observed = HealthyAtKubelet(node.kubelet(), &registered);
      // A fresh agent process does not advertise GPUs it never saw on vfio: with none healthy it may have no
      // resource to register at all, which the kubelet sees as nothing advertised.
      if ((registered || expected.empty()) && observed == expected) break;
      if (Clock::now() - changed > kHardBound) break;
      std::this_thread::sleep_for(milliseconds(2));
    }
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - changed).count();
    const bool converged = (registered || expected.empty()) && observed == expected;
    agent.registered_ = registered;
    if (!converged) {
      const auto events = node.kubelet().Events();
      for (size_t e = events.size() > 20 ? events.size() - 20 : 0; e < events.size(); ++e) {
        fprintf(stderr, "kubelet event: %s %s %s\n", events[e].kind.c_str(), events[e].resource.c_str(),
                events[e].detail.c_str());
      }
      fprintf(stderr, "agent log:\n%s\n", agent.Log().c_str());
    }
    ASSERT_TRUE(converged)
        << "after " << fault << " on " << gpu << " (action " << actions << "): kubelet healthy "
        << observed.size() << " (registered " << registered << "), sysfs healthy " << expected.size();
    worst_ms[fault] = std::max(worst_ms[fault], ms);
    if (ms > kTargetBound.count()) ++over_target;

    // The kernel writes since the last step. Only the agent binds to vfio-pci by writing `bind` (the soak's own bind
    // writes all fail), and the soak unbinds only free GPUs: an unbind of a GPU held before and after this step is
    // the agent taking a running VM's device.
    const std::vector<std::string> writes = node.SimLog();
    std::set<std::string> held_throughout;
    for (const std::string& bdf : held()) {
      if (held_before.count(bdf)) held_throughout.insert(bdf);
    }
    held_gpu_steps += static_cast<int>(held_throughout.size());
    for (const std::string& line : writes) {
      const std::vector<std::string> words = absl::StrSplit(line, ' ');
      if (words.size() != 3 && words.size() != 4) continue;
      if (words.size() == 3 && (words[0] == "bind" || words[0] == "probe") && words[2] == "vfio-pci") ++agent_binds;
      if (words[0] == "unbind" || words[0] == "unbind-wait") {
        if (words[0] == "unbind" && words.size() == 3 && !(fault == "slow_unbind" && words[1] == gpu)) ++agent_unbinds;
        ASSERT_FALSE(held_throughout.count(words[1]))
            << "\"" << line << "\": a GPU allocated to a running pod was unbound (after " << fault << ", action "
            << actions << ")";
      }
    }
    ASSERT_TRUE(node.Control("log-drop " + std::to_string(writes.size())).ok());

    // Flat within one agent process: threads and gRPC's pools come and go with the traffic, so a leak shows as a
    // rising floor. Samples every 2 actions after the warm-up, only while registered: a process that started with no
    // GPU on vfio has no resource server yet (one thread and a few fds fewer), which is no baseline. The floor
    // (minimum) of the last 10 samples must not exceed the floor of the first 10. The first sample also takes the
    // fd baseline (check_fds).
    if (++agent.actions_since_start_ > kWarmupActions && agent.actions_since_start_ % 2 == 0 && registered) {
      agent.samples_.push_back(Sample(agent.pid()));
      if (!agent.baseline_fds_) agent.baseline_fds_ = HeldFds(agent.pid());
    }
  }
  check_flat(agent);
  check_fds(agent);
  EXPECT_EQ(agent.Stop(), 0);

  printf("soak: %d s, seed %u, %d actions, %d pods admitted\n", seconds, seed, actions, pods);
  for (const auto& [fault, n] : counts) {
    printf("  %-26s %5d  worst convergence %7.1f ms\n", fault.c_str(), n, worst_ms.count(fault) ? worst_ms[fault] : 0.0);
  }
  printf("  convergences over %lld ms: %d of %d\n", static_cast<long long>(kTargetBound.count()), over_target, actions);
  printf("  the agent's binds to vfio-pci %d, its unbinds %d; unbinds of a GPU held by a running pod: 0 (%d held-GPU "
         "steps checked)\n", agent_binds, agent_unbinds, held_gpu_steps);
  printf("  open fds the agent holds (in %d reads over %lld ms), after the warm-up -> before the stop: worst change "
         "%+d (%d agent processes checked; most windows needed %d of %d)\n",
         kHeldReads, static_cast<long long>(50 * (kHeldReads - 1)), worst_fd_growth, fd_checked_processes,
         most_windows, kHeldWindows);
  printf("  worst rise of the floor within one agent process (%d long-lived enough to check): agent threads "
         "%+d, gRPC pool threads %+d, RSS %+lld kB; most idle workers kept %d (cap %zu)\n",
         checked_processes, worst_growth.threads, worst_growth.grpc_threads,
         static_cast<long long>(worst_growth.rss_kb), worst_growth.workers, ProcessWorkerPoolIdleCap());
}

// Shared-NVSwitch mode under faults: `run --fabric-manager` on the fake libnvfm with a seeded schedule of VM pods of
// 1, 2, 4 and 8 GPUs admitted and released, FM restarts (connections die, active partitions forgotten), FM
// initialising for a while, agent restarts and kubelet restarts. After every step, within kHardBound: the kubelet's
// healthy set is every GPU while FM answers and none while it does not; every running pod's GPUs are exactly one
// partition, active in FM whenever FM answers (never deactivated under it, told again after an FM restart). At the
// end, with every pod gone, no partition stays active.
TEST(Soak, FabricManagerFaultsKeepPartitionsAndHealthExact) {
  const int seconds = FabricSeconds();
  if (seconds <= 0) GTEST_SKIP() << "VA_SOAK_SECONDS below 4";
  const unsigned seed = static_cast<unsigned>(EnvInt("VA_SOAK_SEED", 1));
  spdlog::set_level(spdlog::level::err);
  auto created = Node::Create("hgx-h200-8gpu.json");
  if (!created.ok() && created.status().message().find("fuse") != std::string::npos) {
    GTEST_SKIP() << created.status();
  }
  ASSERT_TRUE(created.ok()) << created.status();
  Node& node = **created;
  ASSERT_TRUE(node.BindToVfio(kH200Gpus).ok());
  const std::filesystem::path fm = vfio_agent::testing::MakeFakeFm(node.kubelet_dir().parent_path() / "fm");
  kubeletsim::Options kubelet_options;
  kubelet_options.pod_resources_socket = PodResourcesSocket(node);
  ASSERT_TRUE(node.StartKubelet(kubelet_options).ok());
  const std::vector<std::string> args = {"--rescan-interval", "50", "--fabric-manager", "unix:" + fm.string(),
                                         "--fabric-library", FAKE_NVFM_LIBRARY, "--fabric-interval", "100"};
  auto start = [&] {
    auto run = RunProcess::Start(node, args);
    EXPECT_TRUE(run.ok()) << run.status();
    return run.ok() ? *std::move(run) : nullptr;
  };
  std::unique_ptr<RunProcess> agent = start();
  ASSERT_NE(agent, nullptr);
  const std::set<std::string> all(kH200Gpus.begin(), kH200Gpus.end());
  std::mt19937 rng(seed);
  std::map<std::string, std::vector<std::string>> pods;  // running pod -> its GPUs
  std::map<std::string, int> counts;
  std::map<std::string, double> worst_ms;
  bool fm_up = true;
  int serial = 0, actions = 0;
  const char* const kFaults[] = {"admit", "release", "fm_restart", "fm_down", "fm_up", "agent_restart",
                                 "kubelet_restart"};
  const std::vector<double> kWeights = {6, 6, 2, 1, 2, 0.5, 1};
  std::discrete_distribution<int> choose(kWeights.begin(), kWeights.end());
  const Clock::time_point end = Clock::now() + std::chrono::seconds(seconds);
  while (Clock::now() < end) {
    const std::string fault = kFaults[choose(rng)];
    bool injected = true;
    if (fault == "admit") {
      static const int kSizes[] = {1, 1, 2, 2, 4, 8};
      const int want = kSizes[std::uniform_int_distribution<int>(0, 5)(rng)];
      const std::string name = "vm-" + std::to_string(++serial);
      auto admitted = node.kubelet().Admit({.name = name, .limits = {{kH200, want}}});
      if (admitted.ok()) {
        pods[name] = admitted->devices[kH200];
        ASSERT_GE(vfio_agent::testing::PartitionOf(pods[name]), 0) << name << " got GPUs that are no partition";
      } else {
        counts["admit_refused"]++;
      }
    } else if (fault == "release") {
      injected = !pods.empty();
      if (injected) {
        node.kubelet().Release(pods.begin()->first);
        pods.erase(pods.begin());
      }
    } else if (fault == "fm_restart") {
      vfio_agent::testing::RestartFakeFm(fm);
    } else if (fault == "fm_down" || fault == "fm_up") {
      fm_up = fault == "fm_up";
      vfio_agent::testing::UpdateFakeFm(fm, [&](vfio_agent::testing::FakeFmState& state) {
        state.mode = fm_up ? "shared" : "not-configured";
      });
    } else if (fault == "agent_restart") {
      const int status = agent->SignalAndWait(SIGTERM);
      ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << agent->Log();
      agent = start();
      ASSERT_NE(agent, nullptr);
    } else if (fault == "kubelet_restart") {
      ASSERT_TRUE(node.kubelet().Restart().ok());
    }
    if (injected) counts[fault]++;
    ++actions;

    const Clock::time_point changed = Clock::now();
    std::string wrong;
    while (true) {
      if (auto died = agent->ExitedOnItsOwn()) FAIL() << "agent died after " << fault << ": " << agent->Log();
      bool registered = false;
      const std::set<std::string> healthy = HealthyAtKubelet(node.kubelet(), &registered);
      const std::set<std::string> expected = fm_up ? all : std::set<std::string>{};
      wrong.clear();
      if (!registered || healthy != expected) {
        wrong = "kubelet healthy " + std::to_string(healthy.size()) + ", want " + std::to_string(expected.size());
      } else if (fm_up) {
        const std::set<uint32_t> active = vfio_agent::testing::SnapshotFakeFm(fm).active;
        for (const auto& [pod, gpus] : pods) {
          if (!active.contains(static_cast<uint32_t>(vfio_agent::testing::PartitionOf(gpus)))) wrong = "partition of " + pod + " not active";
        }
      }
      if (wrong.empty() || Clock::now() - changed > kHardBound) break;
      std::this_thread::sleep_for(milliseconds(5));
    }
    ASSERT_TRUE(wrong.empty()) << "after " << fault << " (action " << actions << "): " << wrong << "\n" << agent->Log();
    worst_ms[fault] = std::max(worst_ms[fault], std::chrono::duration<double, std::milli>(Clock::now() - changed).count());
  }
  // Every pod gone and FM answering: nothing stays active (released after the activation grace, 5 s).
  for (const auto& [pod, gpus] : pods) node.kubelet().Release(pod);
  vfio_agent::testing::UpdateFakeFm(fm, [](vfio_agent::testing::FakeFmState& state) { state.mode = "shared"; });
  EXPECT_TRUE(WaitUntil([&] { return vfio_agent::testing::SnapshotFakeFm(fm).active.empty(); }, milliseconds(20000)))
      << "active partitions left with no pod: " << vfio_agent::testing::SnapshotFakeFm(fm).active.size();
  EXPECT_TRUE(WIFEXITED(agent->SignalAndWait(SIGTERM)));
  printf("fabric soak: %d s, seed %u, %d actions\n", seconds, seed, actions);
  for (const auto& [fault, n] : counts) {
    printf("  %-18s %5d  worst convergence %7.1f ms\n", fault.c_str(), n, worst_ms.count(fault) ? worst_ms[fault] : 0.0);
  }
}

}  // namespace
}  // namespace vfio_agent::plugin::testing
