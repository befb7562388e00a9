#include <malloc.h>

#include <iostream>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "vfio_gpu_agent/cli/commands.h"

namespace {

constexpr const char* kUsage = R"(usage: vfio-gpu-agent <command> [options]

Turns a Kubernetes GPU node into a KubeVirt GPU-passthrough node.

commands:
  inspect   describe the selected PCI functions, their IOMMU groups and resource names
  bind      move every selected GPU, with its whole IOMMU group, to vfio-pci
  unbind    give devices back to their host driver (only when asked)
  serve     advertise vfio-bound GPUs to the kubelet (Device Plugin API v1beta1)
  run       bind, then serve: what the DaemonSet runs
  kubevirt-config  print the KubeVirt permittedHostDevices entries for this node's GPUs
  validate  check the passthrough chain (platform, devices, plugin, kubelet, KubeVirt) and say how to fix it
  claim-router  (cluster-level, one Deployment) label allocated DRA claims with their node, for the agents' watches

`vfio-gpu-agent <command> --help` lists a command's options. Every option can also be set through an
environment variable VFIO_GPU_AGENT_<OPTION> (e.g. VFIO_GPU_AGENT_SYSFS_ROOT).
)";

}  // namespace

int main(int argc, char** argv) {
  using namespace vfio_agent::cli;
  // Debian's abseil is built without NDEBUG, so every absl::Mutex::Lock (all of gRPC's locks) runs the
  // deadlock detector, whose lock graph lives in never-returned LowLevelAlloc pages: under churn (kubelet
  // restarts, new connections) it held ~40 % of `run`'s RSS growth (bench_daemon BM_RssAfterChurn, 1600
  // rounds: +1584 kB with it, +924 kB without), and `serve` takes the same locks. A node agent does not run a
  // debug check on every lock. Set before any thread starts.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // One malloc arena: glibc gives each new thread its own (up to 8 per core), and every thread gRPC's sync servers
  // start leaves an arena holding its high-water mark. bench_dra, 2x10,000 DRA prepare/unprepare cycles: +84 kB
  // then +1,776 kB with the default, +56 then +16 kB with one arena. The agent allocates little, from a few
  // threads at a time, so the shared arena's lock costs nothing measurable.
  mallopt(M_ARENA_MAX, 1);
  if (argc < 2) {
    std::cerr << kUsage;
    return kExitUsage;
  }
  std::string command = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "--help" || command == "-h" || command == "help") {
    std::cout << kUsage;
    return kExitOk;
  }
  if (command == "--version") {
    std::cout << "vfio-gpu-agent " << VFIO_AGENT_VERSION << "\n";
    return kExitOk;
  }
  if (command == "inspect") return RunInspect(args, std::cout);
  if (command == "bind") return RunBind(args, std::cout);
  if (command == "unbind") return RunUnbind(args, std::cout);
  if (command == "serve") return RunServe(args, std::cout);
  if (command == "run") return RunRun(args, std::cout);
  if (command == "kubevirt-config") return RunKubevirtConfig(args, std::cout);
  if (command == "validate") return RunValidate(args, std::cout);
  if (command == "claim-router") return RunClaimRouter(args, std::cout);
  std::cerr << "vfio-gpu-agent: unknown command \"" << command << "\"\n\n" << kUsage;
  return kExitUsage;
}
