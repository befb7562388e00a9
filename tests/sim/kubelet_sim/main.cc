// kubelet-sim: the kubelet simulator as a command, for the demo and manual runs.
//   kubelet-sim --dir D [--pod-resources-socket S] [--wait RESOURCE=N ...] [--timeout-ms T]
//               [--admit NAME:RESOURCE=COUNT ...] [--describe] [--events] [--serve-forever]
#include <csignal>
#include <cstdio>
#include <iostream>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kubelet_sim.h"

namespace ks = vfio_agent::kubeletsim;

namespace {

struct Args {
  ks::Options options;
  std::vector<std::pair<std::string, int64_t>> waits;
  std::vector<ks::PodSpec> pods;
  int64_t timeout_ms = 10000;
  bool describe = false, events = false, serve_forever = false;
};

constexpr char kUsage[] =
    "usage: kubelet-sim --dir D [--pod-resources-socket S] [--wait RESOURCE=N ...] [--timeout-ms T]\n"
    "                   [--admit NAME:RESOURCE=COUNT ...] [--describe] [--events] [--serve-forever]\n"
    "                   [--kubelet-sock-delay-ms T] [--mode resource-keyed|instance-keyed|legacy-1.24]\n";

bool ParseResourceCount(const std::string& text, std::string* resource, int64_t* count) {
  const size_t eq = text.rfind('=');
  if (eq == std::string::npos || eq == 0) return false;
  *resource = text.substr(0, eq);
  return absl::SimpleAtoi(text.substr(eq + 1), count) && *count >= 0;
}

bool Parse(int argc, char** argv, Args* args, std::string* error) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (flag == "--describe") { args->describe = true; continue; }
    if (flag == "--events") { args->events = true; continue; }
    if (flag == "--serve-forever") { args->serve_forever = true; continue; }
    static const std::set<std::string> kValueFlags = {"--dir", "--pod-resources-socket", "--timeout-ms",
                                                      "--kubelet-sock-delay-ms", "--mode", "--wait", "--admit"};
    if (kValueFlags.count(flag) == 0) { *error = "unknown flag " + flag; return false; }
    const char* v = value();
    if (v == nullptr) { *error = flag + ": missing value"; return false; }
    const std::string text = v;
    if (flag == "--dir") {
      args->options.dir = text;
    } else if (flag == "--pod-resources-socket") {
      args->options.pod_resources_socket = text;
    } else if (flag == "--timeout-ms") {
      if (!absl::SimpleAtoi(text, &args->timeout_ms)) { *error = "--timeout-ms: not a number: " + text; return false; }
    } else if (flag == "--kubelet-sock-delay-ms") {
      int64_t ms = 0;
      if (!absl::SimpleAtoi(text, &ms)) { *error = "--kubelet-sock-delay-ms: not a number: " + text; return false; }
      args->options.kubelet_sock_delay = std::chrono::milliseconds(ms);
    } else if (flag == "--mode") {
      if (text == "resource-keyed") args->options.mode = ks::Mode::kResourceKeyed;
      else if (text == "instance-keyed") args->options.mode = ks::Mode::kInstanceKeyed;
      else if (text == "legacy-1.24") args->options.mode = ks::Mode::kLegacy124;
      else { *error = "--mode: unknown mode " + text; return false; }
    } else if (flag == "--wait") {
      std::string resource;
      int64_t count = 0;
      if (!ParseResourceCount(text, &resource, &count)) { *error = "--wait: want RESOURCE=N, got " + text; return false; }
      args->waits.emplace_back(resource, count);
    } else if (flag == "--admit") {
      const size_t colon = text.find(':');
      std::string resource;
      int64_t count = 0;
      if (colon == std::string::npos || colon == 0 || !ParseResourceCount(text.substr(colon + 1), &resource, &count)) {
        *error = "--admit: want NAME:RESOURCE=COUNT, got " + text;
        return false;
      }
      ks::PodSpec pod;
      pod.name = text.substr(0, colon);
      pod.limits[resource] = count;
      args->pods.push_back(pod);
    }
  }
  if (args->options.dir.empty()) { *error = "--dir is required"; return false; }
  return true;
}

void PrintPod(const ks::AdmittedPod& pod) {
  std::cout << "pod " << pod.name << ": admitted\n";
  for (const auto& [resource, ids] : pod.devices) {
    std::cout << "  " << resource << ": " << absl::StrJoin(ids, ",") << "\n";
    auto preferred = pod.preferred_calls_result.find(resource);
    if (preferred != pod.preferred_calls_result.end()) {
      std::cout << "  GetPreferredAllocation answered: " << absl::StrJoin(preferred->second, ",") << "\n";
    }
    auto it = pod.responses.find(resource);
    if (it == pod.responses.end()) continue;
    const auto& response = it->second;
    std::cout << "  Allocate response:\n    envs:\n";
    const std::map<std::string, std::string> envs(response.envs().begin(), response.envs().end());
    for (const auto& [k, v] : envs) std::cout << "      " << k << "=" << v << "\n";
    std::cout << "    devices:\n";
    for (const auto& d : response.devices()) {
      std::cout << "      " << d.host_path() << " -> " << d.container_path() << " (" << d.permissions() << ")\n";
    }
    std::cout << "    mounts:\n";
    for (const auto& m : response.mounts()) {
      std::cout << "      " << m.host_path() << " -> " << m.container_path() << (m.read_only() ? " (ro)" : " (rw)")
                << "\n";
    }
    std::cout << "    annotations:\n";
    const std::map<std::string, std::string> annotations(response.annotations().begin(),
                                                         response.annotations().end());
    for (const auto& [k, v] : annotations) std::cout << "      " << k << "=" << v << "\n";
    std::cout << "    cdi_devices:\n";
    for (const auto& c : response.cdi_devices()) std::cout << "      " << c.name() << "\n";
  }
}

void PrintEvents(const ks::KubeletSim& sim, std::chrono::steady_clock::time_point t0) {
  for (const auto& e : sim.Events()) {
    const double ms = std::chrono::duration<double, std::milli>(e.at - t0).count();
    std::cout << absl::StrFormat("%9.3f ms  %-15s %-30s %s\n", ms, e.kind, e.resource, e.detail);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  std::string error;
  if (!Parse(argc, argv, &args, &error)) {
    std::cerr << "kubelet-sim: " << error << "\n" << kUsage;
    return 2;
  }
  // Block before any thread exists so that every thread inherits the mask and sigwait sees the signal.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  const auto t0 = std::chrono::steady_clock::now();
  ks::KubeletSim sim(args.options);
  if (auto status = sim.Start(); !status.ok()) {
    std::cerr << "kubelet-sim: start: " << status << "\n";
    return 1;
  }
  std::cout << "kubelet-sim: listening on " << sim.kubelet_socket().string() << std::endl;
  int rc = 0;
  for (const auto& [resource, want] : args.waits) {
    const bool ok = sim.WaitFor(
        [&, resource = resource, want = want](const ks::KubeletSim& s) {
          const auto resources = s.Resources();
          auto it = resources.find(resource);
          return it != resources.end() && it->second.allocatable >= want;
        },
        std::chrono::milliseconds(args.timeout_ms));
    if (!ok) {
      const auto resources = sim.Resources();
      auto it = resources.find(resource);
      std::cerr << absl::StrFormat(
          "kubelet-sim: timed out after %d ms waiting for %s: %d healthy of %d wanted (%s)\n", args.timeout_ms,
          resource, it == resources.end() ? 0 : it->second.allocatable, want,
          it == resources.end() ? "never registered"
                                : (it->second.registered ? "registered" : "registration ended"));
      rc = 1;
      break;
    }
    std::cout << absl::StrFormat("kubelet-sim: %s has %d healthy devices\n", resource, want);
  }
  for (size_t i = 0; rc == 0 && i < args.pods.size(); ++i) {
    auto pod = sim.Admit(args.pods[i]);
    if (!pod.ok()) {
      std::cerr << "kubelet-sim: admission of pod " << args.pods[i].name << " failed: " << pod.status().message()
                << "\n";
      rc = 1;
      break;
    }
    PrintPod(*pod);
  }
  if (args.describe) std::cout << sim.DescribeNode();
  if (args.events) PrintEvents(sim, t0);
  if (rc == 0 && args.serve_forever) {
    int sig = 0;
    sigwait(&signals, &sig);
    std::cout << "kubelet-sim: signal " << sig << ", stopping" << std::endl;
  }
  sim.Stop();
  return rc;
}
