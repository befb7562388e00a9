// An agent process a benchmark starts and watches: where its binary is, an environment that cannot reach the
// caller's cluster, and its CPU time from schedstat (nanosecond resolution; utime+stime counts 10 ms ticks).
#pragma once

#include <benchmark/benchmark.h>
#include <sys/types.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

extern char** environ;

namespace vfio_agent::bench {

// VA_AGENT_BIN, or nullptr after marking the benchmark skipped.
inline const char* AgentBinaryOrSkip(benchmark::State& state) {
  const char* binary = std::getenv("VA_AGENT_BIN");
  if (binary == nullptr || !std::filesystem::exists(binary)) {
    state.SkipWithError("set VA_AGENT_BIN=<build>/src/cli/vfio-gpu-agent");
    return nullptr;
  }
  return binary;
}

// This process's environment without what would point the agent at the caller's cluster or config.
inline std::vector<char*> AgentEnvironment() {
  std::vector<char*> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry = *e;
    if (!entry.starts_with("VFIO_GPU_AGENT_") && !entry.starts_with("KUBERNETES_") &&
        !entry.starts_with("NODE_NAME=")) {
      env.push_back(*e);
    }
  }
  env.push_back(nullptr);
  return env;
}

// Per-thread CPU (name/tid -> ms), to say where an idle agent's time goes.
inline std::map<std::string, double> CpuMsByThread(pid_t pid) {
  std::map<std::string, double> out;
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    std::ifstream schedstat(task.path() / "schedstat"), comm(task.path() / "comm");
    double ns = 0;
    std::string name;
    std::getline(comm, name);
    if (schedstat >> ns) out[name + "/" + task.path().filename().string()] = ns / 1e6;
  }
  return out;
}

struct IdleCpu {
  double cpu_ms = 0;  // over the interval, live threads only
  int threads = 0;    // at its end
};

// Sleeps `interval` and says what `pid` spent meanwhile; each thread that spent 0.05 ms or more is printed to
// stderr ("idle: thread <name>/<tid> <ms> ms"), to say where the time goes.
inline IdleCpu MeasureIdle(pid_t pid, std::chrono::seconds interval) {
  const auto before = CpuMsByThread(pid);
  std::this_thread::sleep_for(interval);
  const auto after = CpuMsByThread(pid);
  IdleCpu idle{.threads = static_cast<int>(after.size())};
  for (const auto& [thread, ms] : after) {
    auto it = before.find(thread);
    const double used = ms - (it == before.end() ? 0 : it->second);
    idle.cpu_ms += used;
    if (used >= 0.05) fprintf(stderr, "idle: thread %s %.2f ms\n", thread.c_str(), used);
  }
  return idle;
}

inline double LoadAverage1() {
  std::ifstream loadavg("/proc/loadavg");
  double load = -1;
  loadavg >> load;
  return load;
}

}  // namespace vfio_agent::bench
