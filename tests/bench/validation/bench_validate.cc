// Run: bench_validate --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
// Target (issue 8): `validate` with every layer on the simulated 8x H200 node, bound, served and registered
// with the kubelet simulator (pod-resources on), median under 50 ms; it writes nothing outside --status-dir.
// BM_ValidateProcess runs the CLI binary (VA_AGENT_BIN) as an operator would; BM_ValidateAllLayers the library.
#include <benchmark/benchmark.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <map>

#include "plugin_harness.h"
#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/validation/validate.h"

namespace vfio_agent::validation {
namespace {

using plugin::testing::kH200;
using plugin::testing::kH200Gpus;
using plugin::testing::Node;

constexpr char kKubevirtCr[] = R"(apiVersion: kubevirt.io/v1
kind: KubeVirt
metadata: {name: kubevirt, namespace: kubevirt}
spec:
  configuration:
    developerConfiguration:
      featureGates: [HostDevices, GPU]
    permittedHostDevices:
      pciHostDevices:
      - pciVendorSelector: "10DE:2335"
        resourceName: nvidia.com/GH100_H200_SXM_141GB
        externalResourceProvider: true
)";

struct Bench {
  std::unique_ptr<Node> node;
  vfio_agent::testing::TempDir dir{"va-bench-validate"};
  ValidateOptions options;
  std::filesystem::path cr_file;
};

std::unique_ptr<Bench> shared;

Bench& Shared() {
  static Bench* bench = [] {
    spdlog::set_level(spdlog::level::warn);
    shared = std::make_unique<Bench>();
    auto node = Node::Create("hgx-h200-8gpu.json");
    if (!node.ok()) {
      fprintf(stderr, "sysfs-sim: %s\n", node.status().ToString().c_str());
      std::abort();
    }
    shared->node = *std::move(node);
    Node& n = *shared->node;
    const std::filesystem::path pod_resources = shared->dir.path() / "pod-resources/kubelet.sock";
    std::filesystem::create_directories(pod_resources.parent_path());
    kubeletsim::Options kubelet;
    kubelet.pod_resources_socket = pod_resources;
    if (!n.BindToVfio(kH200Gpus).ok() || !n.StartKubelet(kubelet).ok() ||
        !n.StartAgent().ok() || !n.WaitForCounts(kH200, 8, 8)) {
      fprintf(stderr, "node setup failed\n");
      std::abort();
    }
    ValidateOptions& o = shared->options;
    o.paths = n.options.paths;
    o.paths.proc_root = n.options.paths.sysfs_root.parent_path() / "proc";
    o.paths.pod_resources_socket = pod_resources;
    o.status_dir = shared->dir.path() / "validations";
    o.kubevirt_cr = kKubevirtCr;
    shared->cr_file = shared->dir.path() / "kubevirt.yaml";
    std::ofstream(shared->cr_file) << kKubevirtCr;
    return shared.get();
  }();
  return *bench;
}

// Everything validate could write to, except the status directory: path -> (mtime, size), plus the sysfs
// simulator's log of writes to kernel attributes.
std::map<std::string, std::pair<int64_t, int64_t>> Footprint(const ValidateOptions& o) {
  std::map<std::string, std::pair<int64_t, int64_t>> seen;
  for (const auto& root : {o.paths.dev_root, o.paths.proc_root, o.paths.kubelet_dir, o.paths.pod_resources_socket.parent_path()}) {
    std::error_code ec;
    for (auto it = std::filesystem::recursive_directory_iterator(root, ec); !ec && it != std::filesystem::end(it);
         it.increment(ec)) {
      struct stat st {};
      if (::lstat(it->path().c_str(), &st) == 0) seen[it->path().string()] = {st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec, st.st_size};
    }
  }
  std::ifstream log(o.paths.sysfs_root / ".sim/log");
  std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  seen["sysfs-sim log"] = {0, static_cast<int64_t>(text.size())};
  return seen;
}

void Report(benchmark::State& state, const report::v1::ValidateReport& report,
            const std::map<std::string, std::pair<int64_t, int64_t>>& before) {
  const auto after = Footprint(Shared().options);
  int changed = 0;
  for (const auto& [path, stamp] : after) {
    auto it = before.find(path);
    if (it == before.end() || it->second != stamp) {
      fprintf(stderr, "written outside --status-dir: %s\n", path.c_str());
      ++changed;
    }
  }
  changed += static_cast<int>(before.size() > after.size());
  state.counters["checks"] = report.checks_size();
  state.counters["failed"] = report.counts().fail();
  state.counters["writes_outside_status_dir"] = changed;
  std::vector<std::string> status;
  for (const auto& e : std::filesystem::directory_iterator(*Shared().options.status_dir)) status.push_back(e.path().filename());
  std::sort(status.begin(), status.end());
  if (changed != 0) state.SkipWithError("validate wrote outside --status-dir");
  if (report.counts().fail() != 0) state.SkipWithError(report.summary().c_str());
  if (status != std::vector<std::string>{"vfio-pci-ready", "workload-type"}) state.SkipWithError("status files");
}

// state.range(0) == 1: layers 1-2 only, to show what the host layers cost against the RPC layers.
void BM_ValidateAllLayers(benchmark::State& state) {
  Bench& bench = Shared();
  ValidateOptions options = bench.options;
  if (state.range(0) == 1) options.layers = {Layer::kPlatform, Layer::kDevices};
  const auto before = Footprint(bench.options);
  report::v1::ValidateReport last;
  for (auto _ : state) {
    auto report = Validate(options);
    if (!report.ok()) {
      state.SkipWithError(report.status().ToString().c_str());
      break;
    }
    last = *std::move(report);
  }
  Report(state, last, before);
}
BENCHMARK(BM_ValidateAllLayers)->ArgName("host_layers_only")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->MinTime(1.0);

// The binary, from posix_spawn to exit, with every layer and the status files.
void BM_ValidateProcess(benchmark::State& state) {
  const char* binary = std::getenv("VA_AGENT_BIN");
  if (binary == nullptr || !std::filesystem::exists(binary)) {
    state.SkipWithError("set VA_AGENT_BIN=<build>/src/cli/vfio-gpu-agent");
    for (auto _ : state) {
    }
    return;
  }
  Bench& bench = Shared();
  const ValidateOptions& o = bench.options;
  const std::vector<std::string> args = {binary, "validate", "--sysfs-root", o.paths.sysfs_root, "--dev-root",
                                         o.paths.dev_root, "--proc-root", o.paths.proc_root, "--kubelet-dir",
                                         o.paths.kubelet_dir, "--pod-resources-socket", o.paths.pod_resources_socket,
                                         "--status-dir", o.status_dir->string(), "--kubevirt-cr", bench.cr_file,
                                         "--json", "--log-level", "error"};
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  const auto before = Footprint(o);
  int exit_code = 0;
  for (auto _ : state) {
    pid_t pid = 0;
    if (::posix_spawn(&pid, binary, &actions, nullptr, argv.data(), environ) != 0) {
      state.SkipWithError("posix_spawn failed");
      break;
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  posix_spawn_file_actions_destroy(&actions);
  state.counters["exit_code"] = exit_code;
  report::v1::ValidateReport unused;
  Report(state, unused, before);
  if (exit_code != 0) state.SkipWithError("validate did not exit 0");
}
BENCHMARK(BM_ValidateProcess)->Unit(benchmark::kMillisecond)->MinTime(1.0);

}  // namespace
}  // namespace vfio_agent::validation

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  vfio_agent::validation::shared.reset();  // stops the agent, the kubelet simulator and sysfs-sim
  return 0;
}
