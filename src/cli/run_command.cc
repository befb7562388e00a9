#include <pthread.h>

#include <csignal>
#include <iostream>

#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/cli/commands.h"

namespace vfio_agent::cli {

int RunRun(const std::vector<std::string>& args, std::ostream& out) {
  std::vector<FlagSpec> specs = BindFlags();
  for (auto& spec : ServeFlags()) specs.push_back(std::move(spec));
  ParsedCommand cmd;
  if (auto exit = ParseCommand("run",
                               "The DaemonSet's job: bind every selected GPU to vfio (as `bind`), then advertise the\n"
                               "vfio-bound ones to the kubelet (as `serve`) until SIGTERM. A device that could not be\n"
                               "bound is reported and not advertised; the others are served. Nothing is unbound on stop.",
                               specs, args, out, &cmd)) {
    return *exit;
  }
  auto bind_options = BinderOptionsFromFlags(cmd);
  if (!bind_options.ok()) {
    std::cerr << "vfio-gpu-agent run: " << bind_options.status().message() << "\n";
    return kExitUsage;
  }
  auto db = LazyNameDatabase(cmd.common);
  auto serve_options = ServeOptionsFromFlags(cmd, db.get());
  if (!serve_options.ok()) {
    std::cerr << "vfio-gpu-agent run: " << serve_options.status().message() << "\n";
    return kExitUsage;
  }
  // Serve waits for SIGTERM with sigwait; the binder's worker threads are started first and inherit this
  // mask, so the signal can only be taken by Serve and never kills the process on a worker thread.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto report = binding::Bind(*bind_options);
  if (!report.ok()) {
    // Without a readable sysfs there is nothing to serve either.
    std::cerr << "vfio-gpu-agent run: " << report.status().message() << "\n";
    return kExitError;
  }
  out << (cmd.common.json ? binding::BindReportToJson(*report) : binding::FormatBindReport(*report)) << std::flush;
  if (!report->ok()) spdlog::error("run: some devices are not on their vfio driver (see the report); serving the others");
  if (auto status = plugin::Serve(*serve_options); !status.ok()) {
    std::cerr << "vfio-gpu-agent run: " << status.message() << "\n";
    return kExitError;
  }
  return kExitOk;
}

}  // namespace vfio_agent::cli
