// Run: bench_plugin --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
// Figures (issue 4): the plugin's own time per Allocate over its unix socket (= Allocate round trip minus
// the round trip of the empty GetDevicePluginOptions call), anonymous memory growth over 1,000 Allocates,
// health event -> ListAndWatch update seen by the kubelet (lost and recovered), kubelet start -> Register.
#include <benchmark/benchmark.h>

#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <thread>

#include "agent_process.h"
#include "rss.h"
#include "grpcpp/client_context.h"
#include "plugin_harness.h"
#include "spdlog/spdlog.h"
#include "support/ports.h"
#include "vfio_gpu_agent/plugin/allocate.h"

namespace vfio_agent::plugin::testing {
namespace {

using Clock = std::chrono::steady_clock;
using bench::AgentBinaryOrSkip;
using bench::LoadAverage1;

// One simulated node for the whole run (starting FUSE per benchmark would dominate); main() destroys it,
// which stops the agent, the kubelet simulator and sysfs-sim.
std::unique_ptr<Node> shared_node;

Node& SharedNode() {
  static Node* node = [] {
    spdlog::set_level(spdlog::level::warn);
    auto created = Node::Create("hgx-h200-8gpu.json");
    if (!created.ok()) {
      fprintf(stderr, "sysfs-sim: %s\n", created.status().ToString().c_str());
      std::abort();
    }
    shared_node = *std::move(created);
    Node* n = shared_node.get();
    if (!n->BindToVfio(kH200Gpus).ok() || !n->StartKubelet().ok() || !n->StartAgent().ok() ||
        !n->WaitForCounts(kH200, 8, 8)) {
      fprintf(stderr, "node setup failed\n");
      std::abort();
    }
    return n;
  }();
  return *node;
}

v1beta1::AllocateRequest OneGpuRequest() {
  v1beta1::AllocateRequest request;
  request.add_container_requests()->add_devices_ids("0000:3b:00.0");
  return request;
}

void BM_AllocateRoundTrip(benchmark::State& state) {
  auto stub = SharedNode().DialPlugin(kH200);
  const v1beta1::AllocateRequest request = OneGpuRequest();
  for (auto _ : state) {
    v1beta1::AllocateResponse response;
    grpc::ClientContext context;
    if (!stub->Allocate(&context, request, &response).ok()) state.SkipWithError("Allocate failed");
  }
}
BENCHMARK(BM_AllocateRoundTrip)->Unit(benchmark::kMicrosecond);

// The transport's share of the round trip: an RPC that does nothing.
void BM_EmptyRpcRoundTrip(benchmark::State& state) {
  auto stub = SharedNode().DialPlugin(kH200);
  for (auto _ : state) {
    v1beta1::DevicePluginOptions response;
    grpc::ClientContext context;
    if (!stub->GetDevicePluginOptions(&context, v1beta1::Empty(), &response).ok()) state.SkipWithError("failed");
  }
}
BENCHMARK(BM_EmptyRpcRoundTrip)->Unit(benchmark::kMicrosecond);

// The Allocate core alone (8 GPUs requested), no transport.
void BM_AllocateCore8(benchmark::State& state) {
  const ResourceDevices devices = SharedNode().agent().Snapshot().resources.at(kH200);
  for (auto _ : state) {
    auto allocation = AllocateContainer(devices, {}, kH200Gpus);
    benchmark::DoNotOptimize(allocation);
  }
}
BENCHMARK(BM_AllocateCore8)->Unit(benchmark::kMicrosecond);

// Anonymous RSS growth of the process (plugin and client) over 1,000 Allocates, after a warm-up round.
void BM_AnonGrowthPer1000Allocates(benchmark::State& state) {
  auto stub = SharedNode().DialPlugin(kH200);
  const v1beta1::AllocateRequest request = OneGpuRequest();
  auto run = [&] {
    for (int i = 0; i < 1000; ++i) {
      v1beta1::AllocateResponse response;
      grpc::ClientContext context;
      (void)stub->Allocate(&context, request, &response);
    }
  };
  run();
  int64_t growth = 0;
  for (auto _ : state) {
    const int64_t before = bench::RssAnonKb();
    run();
    growth = bench::RssAnonKb() - before;
  }
  state.counters["anon_growth_kB"] = static_cast<double>(growth);
  state.counters["rss_anon_kB"] = static_cast<double>(bench::RssAnonKb());
}
BENCHMARK(BM_AnonGrowthPer1000Allocates)->Iterations(1)->Unit(benchmark::kMillisecond);

// From the sim's control write to the kubelet simulator receiving the changed list; nullopt when the update
// never came (a failed run, not a time).
std::optional<double> HealthFlipMs(Node& node, const std::string& command, int64_t want_allocatable) {
  const Clock::time_point start = Clock::now();
  if (!node.Control(command).ok()) return std::nullopt;
  node.WaitForCounts(kH200, 8, want_allocatable, std::chrono::seconds(5));
  for (const kubeletsim::Event& e : node.kubelet().Events()) {
    if (e.kind == "list" && e.resource == kH200 && e.at >= start &&
        e.detail.find("healthy=" + std::to_string(want_allocatable) + " ") != std::string::npos) {
      return std::chrono::duration<double, std::milli>(e.at - start).count();
    }
  }
  return std::nullopt;
}

// Lost (driver gone) or recovered (back on vfio-pci) -> ListAndWatch update, on `node`.
void MeasureHealth(benchmark::State& state, Node& node, bool lost) {
  for (auto _ : state) {
    const auto first = HealthFlipMs(node, "set-driver 0000:9a:00.0 none", 7);
    const auto second = HealthFlipMs(node, "set-driver 0000:9a:00.0 vfio-pci", 8);
    const auto& measured = lost ? first : second;
    if (!first || !second) {
      state.SkipWithError("the kubelet never saw the health change");
      break;
    }
    state.SetIterationTime(*measured / 1000.0);
  }
}

// Fast test settings: the harness's 50 ms rescan, no udev.
void BM_HealthLostToUpdate(benchmark::State& state) { MeasureHealth(state, SharedNode(), true); }
BENCHMARK(BM_HealthLostToUpdate)->UseManualTime()->Iterations(20)->Unit(benchmark::kMillisecond);

void BM_HealthRecoveredToUpdate(benchmark::State& state) { MeasureHealth(state, SharedNode(), false); }
BENCHMARK(BM_HealthRecoveredToUpdate)->UseManualTime()->Iterations(20)->Unit(benchmark::kMillisecond);

// Production defaults: ServeOptions as `serve` builds them without flags (udev monitor on, the default safety
// rescan). On the simulator udev has no events, so this is what inotify on <dev_root>/vfio alone delivers,
// with the rare rescan as the only other source.
void BM_HealthProductionDefaults(benchmark::State& state) {
  auto created = Node::Create("hgx-h200-8gpu.json");
  if (!created.ok()) {
    state.SkipWithError(created.status().ToString().c_str());
    return;
  }
  Node& node = **created;
  const ServeOptions defaults;
  node.options.rescan_interval = defaults.rescan_interval;
  node.options.udev = defaults.udev;
  if (!node.BindToVfio(kH200Gpus).ok() || !node.StartKubelet().ok() || !node.StartAgent().ok() ||
      !node.WaitForCounts(kH200, 8, 8)) {
    state.SkipWithError("node setup failed");
    return;
  }
  state.counters["rescan_interval_ms"] = static_cast<double>(defaults.rescan_interval.count());
  MeasureHealth(state, node, state.range(0) == 1);
  node.StopAgent();
}
BENCHMARK(BM_HealthProductionDefaults)->ArgName("lost")->Arg(1)->Arg(0)->UseManualTime()->Iterations(20)
    ->Unit(benchmark::kMillisecond);

// Time from the kubelet's last "listen" on kubelet.sock to the first Register of `resource` after it, at the
// clock's resolution; nullopt when the Register never came.
std::optional<double> RegisterDelayMs(const kubeletsim::KubeletSim& kubelet, const std::string& resource) {
  std::optional<Clock::time_point> listen, registered;
  for (const kubeletsim::Event& e : kubelet.Events()) {
    if (e.kind == "listen" && e.detail == kubelet.kubelet_socket().string()) {
      listen = e.at;
      registered.reset();
    }
    if (e.kind == "register" && e.resource == resource && listen && !registered) registered = e.at;
  }
  if (!listen || !registered) return std::nullopt;
  return std::chrono::duration<double, std::milli>(*registered - *listen).count();
}

// Kubelet restart: kubelet.sock listening -> Register received by the kubelet simulator.
void BM_KubeletRestartToRegister(benchmark::State& state) {
  Node& node = SharedNode();
  for (auto _ : state) {
    if (!node.kubelet().Restart().ok() || !node.WaitForCounts(kH200, 8, 8)) {
      state.SkipWithError("kubelet restart: the agent did not register again");
      break;
    }
    const std::optional<double> ms = RegisterDelayMs(node.kubelet(), kH200);
    if (!ms) {
      state.SkipWithError("kubelet restart: no Register after the listen event");
      break;
    }
    state.SetIterationTime(*ms / 1000.0);
  }
}
BENCHMARK(BM_KubeletRestartToRegister)->UseManualTime()->Iterations(20)->Unit(benchmark::kMicrosecond);

// The agent as a container runtime starts it: a new mount namespace, the node bind-mounted where the image
// expects /sys, /dev and the kubelet directory, /proc mounted, chroot onto the image root, and the binary and
// its libraries at the image's paths (/usr/bin/<name>, /usr/lib/<triplet>, /lib64). `ld_cache`: the image has an
// /etc/ld.so.cache (as Debian images do); without one the loader searches its default paths.
class ImageRoot {
 public:
  ImageRoot(const std::string& binary, bool ld_cache, const std::string& name = "vfio-gpu-agent")
      : dir_("va-bench-image"), exe_("/usr/bin/" + name) {
    const std::filesystem::path root = dir_.path();
    for (const char* sub : {"usr/bin", "usr/lib/x86_64-linux-gnu", "lib64", "etc", "sys", "dev", "proc", "tmp",
                            "var/lib/kubelet/device-plugins", "usr/share/misc"}) {
      std::filesystem::create_directories(root / sub);
    }
    std::filesystem::create_symlink("usr/lib", root / "lib");
    std::filesystem::copy_file(binary, root / std::filesystem::path(exe_).relative_path());
    // The libraries the loader maps, from ldd, copied to the image's paths.
    FILE* ldd = ::popen(("ldd " + binary).c_str(), "r");
    char line[512];
    while (ldd != nullptr && std::fgets(line, sizeof line, ldd) != nullptr) {
      std::string text(line);
      auto arrow = text.find("=> /");
      std::string path;
      if (arrow != std::string::npos) path = text.substr(arrow + 3, text.find(' ', arrow + 3) - arrow - 3);
      else if (text.find("\t/") == 0) path = text.substr(1, text.find(' ') - 1);
      if (path.empty()) continue;
      const std::filesystem::path source = std::filesystem::canonical(path);
      const std::filesystem::path name = std::filesystem::path(path).filename();
      const std::filesystem::path target = name.string().starts_with("ld-linux")
                                               ? root / "lib64" / name
                                               : root / "usr/lib/x86_64-linux-gnu" / name;
      std::filesystem::copy_file(source, target, std::filesystem::copy_options::overwrite_existing);
    }
    if (ldd != nullptr) ::pclose(ldd);
    if (std::filesystem::exists("/usr/share/misc/pci.ids")) {
      std::filesystem::copy_file("/usr/share/misc/pci.ids", root / "usr/share/misc/pci.ids");
    }
    if (ld_cache) ok_ = std::system(("ldconfig -r " + root.string() + " 2>/dev/null").c_str()) == 0;
    else ok_ = true;
  }
  bool ok() const { return ok_; }
  const std::filesystem::path& root() const { return dir_.path(); }
  // The binary's path inside the image.
  const std::string& exe() const { return exe_; }

 private:
  vfio_agent::testing::TempDir dir_;
  std::string exe_;
  bool ok_ = false;
};

// A plain-directory copy of the simulated node's sysfs. On a node the kernel answers sysfs from memory; on
// sysfs-sim every open, read and listing is a round trip to another process (FUSE), which on this 2-core VM
// makes the first scan several times dearer than the agent's own work. Write-only attributes (bind, unbind,
// remove, reset) become empty files; the simulator's control directory is left out.
absl::Status CopyAsPlainTree(const std::filesystem::path& from, const std::filesystem::path& to) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(to, ec);
  for (auto it = fs::recursive_directory_iterator(from, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    const fs::path relative = it->path().lexically_relative(from);
    if (*relative.begin() == ".sim") {
      it.disable_recursion_pending();
      continue;
    }
    const fs::path target = to / relative;
    if (it->is_symlink()) {
      fs::create_symlink(fs::read_symlink(it->path()), target, ec);
    } else if (it->is_directory()) {
      fs::create_directory(target, ec);
    } else {
      std::ifstream in(it->path(), std::ios::binary);
      std::ofstream out(target, std::ios::binary);
      if (!out) return absl::InternalError("create " + target.string());
      if (in && in.peek() != std::ifstream::traits_type::eof()) out << in.rdbuf();
    }
    if (ec) return absl::InternalError("copy " + it->path().string() + ": " + ec.message());
  }
  if (ec) return absl::InternalError("list " + from.string() + ": " + ec.message());
  return absl::OkStatus();
}

// Every path the child needs, built by the parent: the child shares its memory (CLONE_VM) and must not
// allocate while other threads may hold the allocator's lock.
struct ContainerLaunch {
  std::string root, sysfs, sys_target, dev, dev_target, kubelet_dir, kubelet_target, proc_target;
  std::vector<const char*> argv;  // argv[0] is the binary's path inside the image
  Clock::time_point exec_at;  // written by the child just before execve: the runtime's share ends here
};

// Runs in the clone()d child (CLONE_VM | CLONE_VFORK, as posix_spawn does): namespace, mounts, chroot, exec.
int ContainerChild(void* arg) {
  auto& l = *static_cast<ContainerLaunch*>(arg);
  if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) _exit(120);
  if (::mount(l.sysfs.c_str(), l.sys_target.c_str(), nullptr, MS_BIND, nullptr) != 0 ||
      ::mount(l.dev.c_str(), l.dev_target.c_str(), nullptr, MS_BIND, nullptr) != 0 ||
      ::mount(l.kubelet_dir.c_str(), l.kubelet_target.c_str(), nullptr, MS_BIND, nullptr) != 0 ||
      ::mount("proc", l.proc_target.c_str(), "proc", 0, nullptr) != 0) {
    _exit(121);
  }
  if (::chroot(l.root.c_str()) != 0 || ::chdir("/") != 0) _exit(122);
  static const char* const envp[] = {"PATH=/usr/bin", nullptr};
  l.exec_at = Clock::now();
  ::execve(l.argv[0], const_cast<char* const*>(l.argv.data()), const_cast<char* const*>(envp));
  _exit(127);
}

// One way of starting the agent, and what its starts measured.
struct LaunchWay {
  std::string label;
  std::string binary;
  const ImageRoot* image = nullptr;  // null: posix_spawn with the host's paths
  std::filesystem::path sysfs;       // the FUSE mount or its plain copy
  bool go_peer = false;              // the Go stack's plugin (tests/bench/go_peer), not the agent
  bool nvidia_peer = false;          // NVIDIA's kubevirt-gpu-device-plugin: no flags, its image's paths only
  std::vector<double> launch_ms;     // launch -> Register received by the kubelet simulator
  std::vector<double> exec_ms;       // execve -> Register (the container's setup left out)
  std::vector<double> rss_kb;        // VmRSS once the kubelet lists the 8 devices, per start
};

// The first event of `kind` about the benchmark's resource at or after index `from`, whose detail contains
// `detail`.
std::optional<kubeletsim::Event> EventSince(const kubeletsim::KubeletSim& kubelet, size_t from,
                                            std::string_view kind, std::string_view detail = "") {
  const std::vector<kubeletsim::Event> events = kubelet.Events();
  for (size_t i = from; i < events.size(); ++i) {
    if (events[i].kind == kind && events[i].resource == kH200 && events[i].detail.find(detail) != std::string::npos) {
      return events[i];
    }
  }
  return std::nullopt;
}

// Starts the agent once the way `way` says, against `kubelet` (listening in `kubelet_dir`); records launch ->
// Register at the clock's resolution. Returns false when no Register came (a failed run, not a time). The
// agent is stopped only once the kubelet lists its 8 GPUs, and the next start waits until the kubelet saw
// this agent's stream end, so that no start meets the previous one's teardown.
bool LaunchOnce(LaunchWay& way, const std::filesystem::path& dev_root, kubeletsim::KubeletSim& kubelet,
                const std::filesystem::path& kubelet_dir) {
  const size_t events_before = kubelet.Events().size();
  const std::string sysfs = way.sysfs.string(), dev = dev_root.string(), kdir = kubelet_dir.string();
  // The Go peer advertises 8 devices of the same resource; it reads no sysfs. In the image both run with their
  // defaults (/sys, /dev, /var/lib/kubelet/device-plugins), where the node is mounted.
  std::vector<const char*> argv = {way.binary.c_str(), "serve", "--sysfs-root", sysfs.c_str(), "--dev-root",
                                   dev.c_str(), "--kubelet-dir", kdir.c_str(), nullptr};
  if (way.go_peer) argv = {way.binary.c_str(), "--kubelet-dir", kdir.c_str(), "--resource", kH200, "--devices", "8", nullptr};
  ContainerLaunch launch;
  if (way.image != nullptr) {
    const std::filesystem::path& root = way.image->root();
    launch = {root.string(), sysfs, (root / "sys").string(), dev, (root / "dev").string(), kdir,
              (root / "var/lib/kubelet/device-plugins").string(), (root / "proc").string(), {}, {}};
    launch.argv = {way.image->exe().c_str(), "serve", nullptr};
    if (way.go_peer) launch.argv = {way.image->exe().c_str(), "--resource", kH200, "--devices", "8", nullptr};
    // NVIDIA's plugin takes no flags: it walks /sys/bus/pci/devices, names the resource from /usr/pci.ids and
    // registers at /var/lib/kubelet/device-plugins/kubelet.sock, all of which the mounts above provide.
    if (way.nvidia_peer) launch.argv = {way.image->exe().c_str(), nullptr};
  }
  if (way.nvidia_peer && way.image == nullptr) return false;  // absolute paths: only ever in its image
  static char stack[64 * 1024];
  const Clock::time_point start = Clock::now();
  pid_t pid = 0;
  if (way.image == nullptr) {
    if (::posix_spawn(&pid, argv[0], nullptr, nullptr, const_cast<char* const*>(argv.data()), environ) != 0) return false;
    launch.exec_at = start;
  } else {
    pid = ::clone(ContainerChild, stack + sizeof stack, CLONE_VM | CLONE_VFORK | SIGCHLD, &launch);
    if (pid < 0) return false;
  }
  const bool listed = kubelet.WaitFor(
      [&](const kubeletsim::KubeletSim& k) { return EventSince(k, events_before, "list", "healthy=8 ").has_value(); },
      std::chrono::seconds(10));
  const std::optional<kubeletsim::Event> registered = EventSince(kubelet, events_before, "register");
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0 && listed) way.rss_kb.push_back(std::stod(line.substr(6)));
  }
  // VA_LAUNCH_SMAPS_DIR: the last start's /proc/<pid>/smaps per way, to say what the RSS is made of.
  if (const char* smaps_dir = std::getenv("VA_LAUNCH_SMAPS_DIR"); smaps_dir != nullptr && listed) {
    std::ifstream smaps("/proc/" + std::to_string(pid) + "/smaps");  // procfs: no size, so no copy_file
    std::ofstream(std::filesystem::path(smaps_dir) / (way.label + ".smaps"), std::ios::trunc) << smaps.rdbuf();
  }
  ::kill(pid, SIGTERM);
  int wstatus = 0;
  ::waitpid(pid, &wstatus, 0);
  kubelet.WaitFor(
      [&](const kubeletsim::KubeletSim& k) { return EventSince(k, events_before, "stream_end").has_value(); },
      std::chrono::seconds(5));
  // Lets sysfs-sim and the kubelet simulator finish with the stopped agent (FUSE releases of its open files,
  // the stream's teardown) before the next start is timed.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (!listed || !registered || registered->at < launch.exec_at) return false;
  way.launch_ms.push_back(std::chrono::duration<double, std::milli>(registered->at - start).count());
  way.exec_ms.push_back(std::chrono::duration<double, std::milli>(registered->at - launch.exec_at).count());
  return true;
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

// Launch -> Register, every way of starting interleaved in one run: round after round, each way once per round
// (in a shuffled order), all against one kubelet simulator; medians in ms at the clock's resolution.
//   direct             posix_spawn with the host's paths, on the FUSE node (the figure reported before)
//   direct_plain       the same on a plain copy of the node (see CopyAsPlainTree)
//   container          mount namespace + chroot into an image with /etc/ld.so.cache, on the plain copy: as a
//                      container runtime starts the agent on a node, whose sysfs the kernel answers (the target)
//   container_fuse     the same on the FUSE node
//   container_nocache  the image without /etc/ld.so.cache, on the plain copy
// VA_AGENT_BIN_BASELINE=<binary> runs every way with that binary too, interleaved (base_<way>_ms), and reports
// ratio_<way> = this binary / baseline. VA_GO_PEER_BIN=<go_peer> (tests/bench/go_peer) starts the Go stack's
// plugin in the same rounds, directly (go_direct) and in its own image (go_container), and reports
// ratio_go_direct (the agent's direct_plain / go_direct), ratio_go_container, and rss_ratio_go_<way> (the agents'
// median VmRSS once listed / the peer's). VA_NVIDIA_PEER_BIN=<binary> (NVIDIA/kubevirt-gpu-device-plugin, built as
// tests/bench/README.md says) starts NVIDIA's plugin in the same rounds, in its own image only (nvidia_container: it
// reads the absolute /sys, /usr/pci.ids and /var/lib/kubelet paths, so it cannot start directly on a temp tree),
// with VA_NVIDIA_PEER_PCI_IDS (default: the host's /usr/share/misc/pci.ids; a pci.ids without 10de:2335 names the
// resource by hex id, which the kubelet simulator then never lists as the H200s) at its image's /usr/pci.ids, and
// reports ratio_nvidia_container (the agent's container / nvidia_container) and rss_ratio_nvidia. VA_LAUNCH_ROUNDS (default 11) starts per way. A missed Register fails
// the run (and the exit status). load1_* are /proc/loadavg's 1-minute load before and after.
bool launch_failed = false;

void BM_LaunchToRegister(benchmark::State& state) {
  const char* binary = AgentBinaryOrSkip(state);
  if (binary == nullptr) {
    for (auto _ : state) {
    }
    return;
  }
  const char* baseline = std::getenv("VA_AGENT_BIN_BASELINE");
  const char* go_peer = std::getenv("VA_GO_PEER_BIN");
  const int rounds = std::getenv("VA_LAUNCH_ROUNDS") ? std::atoi(std::getenv("VA_LAUNCH_ROUNDS")) : 11;
  Node& node = SharedNode();
  vfio_agent::testing::TempDir plain("va-bench-plain-sysfs");
  if (absl::Status copied = CopyAsPlainTree(node.options.paths.sysfs_root, plain.path()); !copied.ok()) {
    state.SkipWithError(copied.ToString().c_str());
    return;
  }
  std::vector<std::string> binaries = {binary};
  if (baseline != nullptr) binaries.push_back(baseline);
  std::vector<std::unique_ptr<ImageRoot>> images;
  std::vector<LaunchWay> ways;
  for (size_t b = 0; b < binaries.size(); ++b) {
    images.push_back(std::make_unique<ImageRoot>(binaries[b], /*ld_cache=*/true));
    images.push_back(std::make_unique<ImageRoot>(binaries[b], /*ld_cache=*/false));
    if (!images[images.size() - 2]->ok() || !images.back()->ok()) {
      state.SkipWithError("could not build the image root");
      return;
    }
    const std::string prefix = b == 0 ? "" : "base_";
    const ImageRoot* cached = images[images.size() - 2].get();
    const std::filesystem::path fuse = node.options.paths.sysfs_root;
    auto add = [&](const std::string& label, const ImageRoot* image, const std::filesystem::path& sysfs) {
      LaunchWay way;
      way.label = prefix + label;
      way.binary = binaries[b];
      way.image = image;
      way.sysfs = sysfs;
      ways.push_back(std::move(way));
    };
    add("direct", nullptr, fuse);
    add("direct_plain", nullptr, plain.path());
    add("container", cached, plain.path());
    add("container_fuse", cached, fuse);
    add("container_nocache", images.back().get(), plain.path());
  }
  constexpr size_t kWaysPerAgent = 5;
  if (go_peer != nullptr) {
    images.push_back(std::make_unique<ImageRoot>(go_peer, /*ld_cache=*/true, "go_peer"));
    if (!images.back()->ok()) {
      state.SkipWithError("could not build the Go peer's image root");
      return;
    }
    for (const ImageRoot* image : std::vector<const ImageRoot*>{nullptr, images.back().get()}) {
      LaunchWay way;
      way.label = image == nullptr ? "go_direct" : "go_container";
      way.binary = go_peer;
      way.image = image;
      way.sysfs = plain.path();
      way.go_peer = true;
      ways.push_back(std::move(way));
    }
  }
  const char* nvidia_peer = std::getenv("VA_NVIDIA_PEER_BIN");
  if (nvidia_peer != nullptr) {
    images.push_back(std::make_unique<ImageRoot>(nvidia_peer, /*ld_cache=*/true, "nvidia-kubevirt-gpu-device-plugin"));
    const char* pci_ids = std::getenv("VA_NVIDIA_PEER_PCI_IDS");
    std::error_code ec;
    // Where its image (deployments/container/Dockerfile) puts the pci.ids it ships: pciIdsFilePath.
    std::filesystem::copy_file(pci_ids != nullptr ? pci_ids : "/usr/share/misc/pci.ids",
                               images.back()->root() / "usr/pci.ids", ec);
    if (!images.back()->ok() || ec) {
      state.SkipWithError("could not build NVIDIA's plugin's image root (or copy its pci.ids)");
      return;
    }
    LaunchWay way;
    way.label = "nvidia_container";
    way.binary = nvidia_peer;
    way.image = images.back().get();
    way.sysfs = plain.path();
    way.nvidia_peer = true;
    ways.push_back(std::move(way));
  }
  vfio_agent::testing::TempDir dir("va-bench-launch");
  kubeletsim::Options kubelet_options;
  kubelet_options.dir = dir.path();
  kubeletsim::KubeletSim kubelet(kubelet_options);
  if (!kubelet.Start().ok()) {
    state.SkipWithError("kubelet sim");
    return;
  }
  state.counters["load1_before"] = LoadAverage1();
  for (auto _ : state) {
    // A fresh order every round (seeded): with a fixed cycle each way would always follow the same one, and a
    // start right after one on the FUSE node meets sysfs-sim still releasing that agent's files.
    std::mt19937 shuffle_rng(11);
    std::vector<size_t> order(ways.size());
    std::iota(order.begin(), order.end(), 0);
    for (int round = 0; round < rounds && !launch_failed; ++round) {
      std::shuffle(order.begin(), order.end(), shuffle_rng);
      for (size_t i : order) {
        LaunchWay& way = ways[i];
        if (!LaunchOnce(way, node.options.paths.dev_root, kubelet, dir.path())) {
          launch_failed = true;
          state.SkipWithError(("no Register from the agent started as " + way.label).c_str());
          break;
        }
      }
    }
    if (launch_failed) break;
    state.SetIterationTime(Median(ways[2].launch_ms) / 1000.0);  // ways[2]: "container", the target
  }
  if (launch_failed) return;
  state.counters["load1_after"] = LoadAverage1();
  std::map<std::string, const LaunchWay*> by_label;
  for (const LaunchWay& way : ways) {
    by_label[way.label] = &way;
    const double launch = Median(way.launch_ms), exec = Median(way.exec_ms);
    state.counters[way.label + "_ms"] = launch;
    fprintf(stderr, "launch: %-22s median %7.3f ms (min %7.3f, max %7.3f, n=%zu), exec -> Register %7.3f ms, RSS %.0f kB\n",
            way.label.c_str(), launch, *std::min_element(way.launch_ms.begin(), way.launch_ms.end()),
            *std::max_element(way.launch_ms.begin(), way.launch_ms.end()), way.launch_ms.size(), exec,
            Median(way.rss_kb));
  }
  state.counters["container_exec_ms"] = Median(ways[2].exec_ms);
  state.counters["rss_registered_kB"] = Median(ways[2].rss_kb);
  if (baseline != nullptr) {
    for (size_t i = 0; i < kWaysPerAgent; ++i) {
      state.counters["ratio_" + ways[i].label] =
          Median(ways[i].launch_ms) / Median(ways[i + kWaysPerAgent].launch_ms);
    }
  }
  if (go_peer != nullptr) {
    // The peer reads no sysfs: it is compared with the agent on the plain tree (the kernel's sysfs stands in).
    for (const auto& [agent, peer] : {std::pair{"direct_plain", "go_direct"}, std::pair{"container", "go_container"}}) {
      const LaunchWay& a = *by_label.at(agent);
      const LaunchWay& g = *by_label.at(peer);
      const std::string way = std::string(peer).substr(3);
      state.counters["go_" + way + "_rss_kB"] = Median(g.rss_kb);
      state.counters["ratio_go_" + way] = Median(a.launch_ms) / Median(g.launch_ms);
      state.counters["rss_ratio_go_" + way] = Median(a.rss_kb) / Median(g.rss_kb);
    }
    state.counters["rss_ratio_go"] = state.counters["rss_ratio_go_container"];
  }
  if (nvidia_peer != nullptr) {
    // Both in their images on the plain tree: NVIDIA's plugin scans it as the agent does.
    const LaunchWay& a = *by_label.at("container");
    const LaunchWay& n = *by_label.at("nvidia_container");
    state.counters["nvidia_container_rss_kB"] = Median(n.rss_kb);
    state.counters["ratio_nvidia_container"] = Median(a.launch_ms) / Median(n.launch_ms);
    state.counters["rss_ratio_nvidia"] = Median(a.rss_kb) / Median(n.rss_kb);
  }
}
BENCHMARK(BM_LaunchToRegister)->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);

// Idle cost with the production defaults (no --rescan-interval; udev on, which on the simulator hears only the
// host's own PCI events): the agent's CPU over VA_IDLE_SECONDS (default 20) once registered on the idle 8-GPU
// node. schedstat counts nanoseconds; utime+stime would count 10 ms ticks. Exited threads of the interval
// are not counted, so the thread count is reported too. `run` 0: `serve`; 1: `run` (the same plugin plus the
// gRPC health server, metrics, the pod-resources check and its periodic resync; no API server); 2: the Go stack's
// smallest plugin (tests/bench/go_peer, VA_GO_PEER_BIN), registered with the same 8 devices, for a ratio in one run.
void BM_IdleCpu(benchmark::State& state) {
  const bool go_peer = state.range(0) == 2;
  const char* binary = go_peer ? std::getenv("VA_GO_PEER_BIN") : AgentBinaryOrSkip(state);
  if (go_peer && binary == nullptr) state.SkipWithError("set VA_GO_PEER_BIN=<go_peer built from tests/bench/go_peer>");
  if (binary == nullptr) {
    for (auto _ : state) {
    }
    return;
  }
  const int seconds = bench::IdleSeconds();
  Node& node = SharedNode();
  vfio_agent::testing::TempDir dir("va-bench-idle");
  kubeletsim::Options kubelet_options;
  kubelet_options.dir = dir.path();
  const bool run = state.range(0) == 1;
  if (run) kubelet_options.pod_resources_socket = dir.path() / "pod-resources.sock";
  kubeletsim::KubeletSim kubelet(kubelet_options);
  if (!kubelet.Start().ok()) {
    state.SkipWithError("kubelet sim");
    return;
  }
  bench::IdleCpu idle;
  for (auto _ : state) {
    const std::string sysfs = node.options.paths.sysfs_root.string(), dev = node.options.paths.dev_root.string(),
                      kdir = dir.path().string(), pod_resources = kubelet_options.pod_resources_socket.string(),
                      health_port = std::to_string(vfio_agent::testing::UnusedLoopbackPort()), metrics_port = std::to_string(vfio_agent::testing::UnusedLoopbackPort());
    std::vector<const char*> argv = {binary, run ? "run" : "serve", "--sysfs-root", sysfs.c_str(), "--dev-root",
                                     dev.c_str(), "--kubelet-dir", kdir.c_str(), "--log-level", "warn"};
    if (go_peer) argv = {binary, "--kubelet-dir", kdir.c_str(), "--resource", kH200, "--devices", "8"};
    if (run) {
      argv.insert(argv.end(), {"--pod-resources-socket", pod_resources.c_str(), "--listen-address", "127.0.0.1",
                               "--health-port", health_port.c_str(), "--metrics-port", metrics_port.c_str()});
    }
    argv.push_back(nullptr);
    // Never the caller's cluster: `run` would talk to the API server that these point at.
    std::vector<char*> env = bench::AgentEnvironment();
    pid_t pid = 0;
    if (::posix_spawn(&pid, binary, nullptr, nullptr, const_cast<char* const*>(argv.data()), env.data()) != 0) {
      state.SkipWithError("posix_spawn failed");
      break;
    }
    const bool registered = kubelet.WaitFor(
        [&](const kubeletsim::KubeletSim& k) {
          auto resources = k.Resources();
          auto it = resources.find(kH200);
          return it != resources.end() && it->second.registered && it->second.allocatable == 8;
        },
        std::chrono::seconds(10));
    // Past the start: gRPC's and the settle rescan's first moments are not idle.
    std::this_thread::sleep_for(std::chrono::seconds(1));
    idle = bench::MeasureIdle(pid, std::chrono::seconds(seconds));
    ::kill(pid, SIGTERM);
    int wstatus = 0;
    ::waitpid(pid, &wstatus, 0);
    if (!registered) {
      state.SkipWithError("the agent did not register");
      break;
    }
    state.SetIterationTime(idle.cpu_ms / 1000.0);
  }
  bench::SetIdleCounters(state, idle, seconds);
}
BENCHMARK(BM_IdleCpu)->ArgName("run")->Arg(0)->Arg(1)->Arg(2)->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace vfio_agent::plugin::testing

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  vfio_agent::plugin::testing::shared_node.reset();
  return vfio_agent::plugin::testing::launch_failed ? 1 : 0;
}
