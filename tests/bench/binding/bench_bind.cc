// Wall time of binding 8 GPUs whose unbind from nvidia takes 1 s each (sysfs-sim `unbind-delay`):
// groups in parallel (one worker per group) versus serial (parallelism 1). Expect ~1 s versus ~8 s.
//   bench_bind --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <memory>

#include "sim_process.h"
#include "vfio_gpu_agent/binding/binder.h"

namespace {

namespace stdfs = std::filesystem;
using vfio_agent::binding::Bind;
using vfio_agent::binding::BinderOptions;
using vfio_agent::binding::BindReport;
using vfio_agent::binding::Outcome;

constexpr const char* kGpus[] = {"0000:18:00.0", "0000:2a:00.0", "0000:3b:00.0", "0000:5d:00.0",
                                 "0000:9a:00.0", "0000:ab:00.0", "0000:bb:00.0", "0000:db:00.0"};

// Puts every GPU back on nvidia with a 1 s unbind, as on a node that has just booted.
bool ResetNode(const vfio_agent::sim::SimProcess& sim) {
  for (const char* gpu : kGpus) {
    if (!sim.Control(std::string("set-driver ") + gpu + " nvidia").ok()) return false;
    if (!sim.Control(std::string("unbind-delay ") + gpu + " 1000").ok()) return false;
  }
  return true;
}

void BM_Bind8GpusSlowUnbind(benchmark::State& state) {
  std::string tmpl = (stdfs::temp_directory_path() / "va-bench-bind-XXXXXX").string();
  const stdfs::path root = mkdtemp(tmpl.data());
  auto sim = vfio_agent::sim::SimProcess::Start(vfio_agent::sim::NodeFile("hgx-h200-8gpu.json"), root);
  if (!sim.ok()) {
    state.SkipWithError(std::string(sim.status().message()).c_str());
    return;
  }
  BinderOptions options;
  options.targets = vfio_agent::binding::Targets::EverySelected();
  options.paths.sysfs_root = (*sim)->sysfs_root();
  options.paths.dev_root = (*sim)->dev_root();
  options.paths.modules_root = root / "modules";
  options.kernel_release = "bench";
  options.parallelism = static_cast<int>(state.range(0));
  for (auto _ : state) {
    state.PauseTiming();
    if (!ResetNode(**sim)) {
      state.SkipWithError("resetting the simulated node failed");
      break;
    }
    state.ResumeTiming();
    absl::StatusOr<BindReport> report = Bind(options);
    state.PauseTiming();
    int bound = 0;
    if (report.ok()) {
      for (const auto& device : report->devices) bound += device.outcome == Outcome::kBound;
    }
    if (bound != 8) {
      state.SkipWithError("not all 8 GPUs were bound");
      break;
    }
    state.ResumeTiming();
  }
  sim->reset();
  stdfs::remove_all(root);
}

// Arg: parallelism (0 = one worker per group, 1 = serial).
BENCHMARK(BM_Bind8GpusSlowUnbind)->ArgName("parallelism")->Arg(0)->Arg(1)->Iterations(1)->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
