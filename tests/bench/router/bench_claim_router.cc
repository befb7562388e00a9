// The claim router against a real kube-apiserver (not in CI; tests/bench/README.md, "Claim routing"): 1,000
// simulated agents' claim watches in this one process, N claims created, allocated by the scheduler's status
// write (admin identity) spread over the 1,000 nodes, and deleted; once with the router and each agent watching
// its own node's label (routed), once with every agent watching every claim and no router (naive). Per phase:
// the claim events each agent received, the API server's CPU time (/proc/<pid>/stat) and its
// apiserver_watch_events_total / apiserver_request_total for resourceclaims (/metrics), and in the routed phase
// the time from the allocation's status write to its agent's ADDED event (the router's label included).
//
//   bench_claim_router --kubeconfig /tmp/realcluster/state/admin.kubeconfig --claims 1000 [--agents 1000]
//                      [--namespace vfio-router-bench] [--apiserver-pid PID] [--phases routed,naive]
//
// Creates the namespace (and its Lease) and deletes it at the end.
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "api_client.h"
#include "config.h"
#include "nlohmann/json.hpp"
#include "vfio_gpu_agent/kube/claim_routing.h"
#include "vfio_gpu_agent/router/claim_router.h"

namespace {

using namespace std::chrono_literals;
using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using vfio_agent::kube::ApiClient;
using vfio_agent::kube::ApiResponse;

constexpr char kDriver[] = "gpu.vfio-agent.cozystack.io";

struct Options {
  std::string kubeconfig;
  int agents = 1000;
  int claims = 1000;
  std::string ns = "vfio-router-bench";
  long apiserver_pid = 0;
  std::string phases = "routed,naive";
  int writers = 8;
  int singles = 50;  // routed phase: claims allocated one at a time afterwards, each waited for
};

std::string NodeName(int i) {
  char name[32];
  std::snprintf(name, sizeof(name), "bench-node-%04d", i);
  return name;
}

// utime + stime of a process, in clock ticks turned into seconds.
double CpuSeconds(long pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream fields(text.substr(close + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

long FindApiserverPid() {
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return 0;
  long found = 0;
  while (dirent* entry = readdir(proc)) {
    const long pid = std::atol(entry->d_name);
    if (pid <= 0) continue;
    std::ifstream in(absl::StrCat("/proc/", pid, "/cmdline"));
    std::string argv0;
    std::getline(in, argv0, '\0');
    if (argv0.size() >= 14 && argv0.substr(argv0.size() - 14) == "kube-apiserver") found = pid;
  }
  closedir(proc);
  return found;
}

// Sum of a metric's samples whose labels contain every `needles` entry (Prometheus text format).
double MetricSum(const std::string& text, const std::string& name, const std::vector<std::string>& needles) {
  double sum = 0;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(name + "{", 0) != 0 && line.rfind(name + " ", 0) != 0) continue;
    if (!std::all_of(needles.begin(), needles.end(), [&](const std::string& n) { return line.find(n) != std::string::npos; })) {
      continue;
    }
    sum += std::stod(line.substr(line.rfind(' ') + 1));
  }
  return sum;
}

struct Sample {
  double cpu = 0;
  double watch_events = 0;
  double requests = 0;
  double longrunning = 0;
};

Sample Measure(ApiClient& client, long pid) {
  Sample s;
  s.cpu = CpuSeconds(pid);
  absl::StatusOr<ApiResponse> metrics = client.Send("GET", "/metrics", "", "", 30s);
  if (metrics.ok() && metrics->code == 200) {
    s.watch_events = MetricSum(metrics->body, "apiserver_watch_events_total", {"resource=\"resourceclaims\""});
    s.requests = MetricSum(metrics->body, "apiserver_request_total", {"resource=\"resourceclaims\""});
    s.longrunning = MetricSum(metrics->body, "apiserver_longrunning_requests",
                              {"resource=\"resourceclaims\"", "verb=\"WATCH\""});
  } else {
    std::cerr << "GET /metrics failed\n";
  }
  return s;
}

// One simulated agent's claim watch: counts events without parsing whole objects (the client's CPU is not what
// is measured, and 1,000 full JSON parses per claim would starve the API server of this machine's 2 cores).
struct AgentWatch {
  std::thread thread;
  vfio_agent::kube::StreamCanceller cancel;
  std::atomic<uint64_t> added{0}, modified{0}, deleted{0};
};

std::string FieldAfter(absl::string_view line, absl::string_view key) {
  const size_t at = line.find(key);
  if (at == absl::string_view::npos) return "";
  const size_t start = at + key.size();
  const size_t end = line.find('"', start);
  return std::string(line.substr(start, end - start));
}

class Bench {
 public:
  Bench(Options options, std::shared_ptr<ApiClient> client) : o_(std::move(options)), client_(std::move(client)) {}

  int Run() {
    if (o_.apiserver_pid == 0) o_.apiserver_pid = FindApiserverPid();
    if (o_.apiserver_pid == 0) {
      std::cerr << "no kube-apiserver process found (--apiserver-pid)\n";
      return 1;
    }
    const Json ns = {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", o_.ns}}}};
    auto created = client_->Send("POST", "/api/v1/namespaces", "application/json", ns.dump(), 30s);
    if (!created.ok() || (created->code != 201 && created->code != 409)) {
      std::cerr << "namespace: " << (created.ok() ? created->body : std::string(created.status().message())) << "\n";
      return 1;
    }
    std::cout << "apiserver pid " << o_.apiserver_pid << ", " << o_.agents << " agents, " << o_.claims
              << " claims, " << o_.writers << " allocation writers\n";
    // The API server's CPU with none of this running: the rest of the cluster's share of each phase's window.
    const double idle_start = CpuSeconds(o_.apiserver_pid);
    std::this_thread::sleep_for(10s);
    std::printf("apiserver CPU at rest before the phases: %.3f s per s (10 s)\n",
                (CpuSeconds(o_.apiserver_pid) - idle_start) / 10);
    int rc = 0;
    for (const std::string phase : {"routed", "naive"}) {
      if (o_.phases.find(phase) == std::string::npos) continue;
      if (!RunPhase(phase == "routed")) rc = 1;
    }
    // The figures are printed already; a namespace left behind is still the run's failure, to be cleaned by hand.
    absl::StatusOr<ApiResponse> deleted =
        client_->Send("DELETE", absl::StrCat("/api/v1/namespaces/", o_.ns), "", "", 30s);
    if (!deleted.ok() || deleted->code / 100 != 2) {
      const std::string why =
          deleted.ok() ? absl::StrCat("HTTP ", deleted->code, " ", deleted->body) : deleted.status().ToString();
      std::cerr << "namespace " << o_.ns << " not deleted: " << why << "\n";
      return 1;
    }
    std::cout << "namespace " << o_.ns << " deleted\n";
    return rc;
  }

 private:
  std::string ClaimsPath() const { return absl::StrCat("/apis/resource.k8s.io/v1/namespaces/", o_.ns, "/resourceclaims"); }

  bool RunPhase(bool routed) {
    const std::string phase = routed ? "routed" : "naive";
    const std::string prefix = routed ? "r-" : "n-";
    // The list every agent starts its watch from (one list, as each agent lists once at its start).
    auto list = client_->Send("GET", "/apis/resource.k8s.io/v1/resourceclaims?limit=1", "", "", 30s);
    if (!list.ok() || list->code != 200) {
      std::cerr << "list: " << (list.ok() ? list->body : std::string(list.status().message())) << "\n";
      return false;
    }
    const std::string version = Json::parse(list->body)["metadata"]["resourceVersion"].get<std::string>();

    std::unique_ptr<vfio_agent::router::ClaimRouter> router;
    std::thread router_thread;
    if (routed) {
      auto connected = vfio_agent::router::ClaimRouter::Connect(
          {.kubeconfig = o_.kubeconfig, .lease_namespace = o_.ns, .identity = "bench-router"});
      if (!connected.ok()) {
        std::cerr << connected.status() << "\n";
        return false;
      }
      router = *std::move(connected);
      router_thread = std::thread([&] { (void)router->Run(); });
      while (!router->leading()) std::this_thread::sleep_for(10ms);
    }

    std::vector<std::unique_ptr<AgentWatch>> agents;
    std::mutex seen_mu;
    std::map<std::string, Clock::time_point> labeled_seen;  // routed: claim -> its agent's ADDED
    for (int i = 0; i < o_.agents; ++i) {
      auto agent = std::make_unique<AgentWatch>();
      AgentWatch* a = agent.get();
      std::string path = "/apis/resource.k8s.io/v1/resourceclaims?watch=true&allowWatchBookmarks=true";
      if (routed) {
        absl::StrAppend(&path, "&labelSelector=", std::string(vfio_agent::kube::kClaimNodeLabel), "%3D",
                        vfio_agent::kube::ClaimNodeLabelValue(NodeName(i)));
      }
      absl::StrAppend(&path, "&resourceVersion=", version, "&timeoutSeconds=3600");
      a->thread = std::thread([this, a, path, routed, &seen_mu, &labeled_seen] {
        (void)client_->Stream(path, [&](absl::string_view line) {
          const std::string type = FieldAfter(line, "{\"type\":\"");
          if (type == "ADDED") {
            ++a->added;
            if (routed) {
              const auto now = Clock::now();
              std::lock_guard lock(seen_mu);
              labeled_seen.emplace(FieldAfter(line, "\"metadata\":{\"name\":\""), now);
            }
          } else if (type == "MODIFIED") {
            ++a->modified;
          } else if (type == "DELETED") {
            ++a->deleted;
          }
          return true;
        }, 3700s, a->cancel);
      });
      agents.push_back(std::move(agent));
    }
    // Every watch registered at the server before the burst starts (the router's own counts as one more).
    const double want = o_.agents + (routed ? 1 : 0);
    const auto deadline = Clock::now() + 300s;
    while (Measure(*client_, o_.apiserver_pid).longrunning < want && Clock::now() < deadline) std::this_thread::sleep_for(200ms);
    std::this_thread::sleep_for(1s);  // let the watch starts' own work settle out of the window

    const Sample before = Measure(*client_, o_.apiserver_pid);
    const auto started = Clock::now();
    std::map<std::string, Clock::time_point> allocated_at;  // the status write sent
    std::map<std::string, Clock::time_point> answered_at;   // its answer read
    std::mutex allocated_mu;
    // Create, allocate, delete: N writers each taking every writers-th claim.
    auto parallel = [&](auto&& each) {
      std::vector<std::thread> writers;
      for (int w = 0; w < o_.writers; ++w) {
        writers.emplace_back([&, w] {
          for (int i = w; i < o_.claims; i += o_.writers) each(i);
        });
      }
      for (auto& t : writers) t.join();
    };
    std::atomic<int> failures{0};
    auto check = [&](const absl::StatusOr<ApiResponse>& r, const char* what) {
      if (!r.ok() || r->code / 100 != 2) {
        if (failures++ < 5) {
          std::cerr << what << ": " << (r.ok() ? absl::StrCat(r->code, " ", r->body.substr(0, 400))
                                               : std::string(r.status().message())) << "\n";
        }
      }
    };
    parallel([&](int i) {
      const Json claim = {{"apiVersion", "resource.k8s.io/v1"}, {"kind", "ResourceClaim"},
                          {"metadata", {{"name", prefix + std::to_string(i)}, {"namespace", o_.ns}}},
                          {"spec", {{"devices", {{"requests", {{{"name", "gpu"},
                                                                {"exactly", {{"deviceClassName", "bench-gpu"}}}}}}}}}}};
      check(client_->Send("POST", ClaimsPath(), "application/json", claim.dump(), 30s), "create");
    });
    const auto created = Clock::now();
    parallel([&](int i) {
      const std::string node = NodeName(i % o_.agents);
      const Json status = {{"status", {{"allocation", {
          {"devices", {{"results", {{{"request", "gpu"}, {"driver", kDriver}, {"pool", node}, {"device", "gpu-0"}}}}}},
          {"nodeSelector", {{"nodeSelectorTerms", {{{"matchFields", {{{"key", "metadata.name"}, {"operator", "In"},
                                                                       {"values", {node}}}}}}}}}}}}}}};
      const std::string name = prefix + std::to_string(i);
      {
        std::lock_guard lock(allocated_mu);
        allocated_at[name] = Clock::now();
      }
      check(client_->Send("PATCH", absl::StrCat(ClaimsPath(), "/", name, "/status"), "application/merge-patch+json",
                          status.dump(), 30s),
            "allocate");
      std::lock_guard lock(allocated_mu);
      answered_at[name] = Clock::now();
    });
    const auto allocated = Clock::now();
    if (routed) {
      // Every claim labeled and seen by its agent.
      const auto wait_until = Clock::now() + 300s;
      auto seen_all = [&] {
        std::lock_guard lock(seen_mu);
        return static_cast<int>(labeled_seen.size()) >= o_.claims;
      };
      while (!seen_all() && Clock::now() < wait_until) std::this_thread::sleep_for(5ms);
    }
    const auto routed_all = Clock::now();
    parallel([&](int i) {
      check(client_->Send("DELETE", absl::StrCat(ClaimsPath(), "/", prefix, i), "", "", 30s), "delete");
    });
    // Every agent has seen every deletion meant for it.
    const uint64_t want_deleted = routed ? o_.claims : static_cast<uint64_t>(o_.claims) * o_.agents;
    const auto wait_deleted = Clock::now() + 600s;
    auto total = [&](auto member) {
      uint64_t sum = 0;
      for (auto& a : agents) sum += (a.get()->*member).load();
      return sum;
    };
    while (total(&AgentWatch::deleted) < want_deleted && Clock::now() < wait_deleted) std::this_thread::sleep_for(20ms);
    const auto finished = Clock::now();
    const Sample after = Measure(*client_, o_.apiserver_pid);

    uint64_t per_agent_max = 0;
    for (auto& a : agents) per_agent_max = std::max<uint64_t>(per_agent_max, a->added + a->modified + a->deleted);
    const uint64_t events = total(&AgentWatch::added) + total(&AgentWatch::modified) + total(&AgentWatch::deleted);
    auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
    std::printf("[%s] %d claims: create %.0f ms, allocate %.0f ms, labeled+seen %.0f ms, delete+seen %.0f ms; "
                "%d write failures\n", phase.c_str(), o_.claims, ms(created - started), ms(allocated - created),
                ms(routed_all - allocated), ms(finished - routed_all), failures.load());
    std::printf("[%s] agent events: %llu in all (added %llu, modified %llu, deleted %llu), %.2f per agent, max %llu "
                "per agent, %.3f per agent per claim\n",
                phase.c_str(), (unsigned long long)events, (unsigned long long)total(&AgentWatch::added),
                (unsigned long long)total(&AgentWatch::modified), (unsigned long long)total(&AgentWatch::deleted),
                double(events) / o_.agents, (unsigned long long)per_agent_max, double(events) / o_.agents / o_.claims);
    std::printf("[%s] apiserver: CPU %.2f s, apiserver_watch_events_total(resourceclaims) +%.0f, "
                "apiserver_request_total(resourceclaims) +%.0f, wall %.1f s\n",
                phase.c_str(), after.cpu - before.cpu, after.watch_events - before.watch_events,
                after.requests - before.requests, ms(finished - started) / 1000);
    auto report = [&](const char* what, const std::map<std::string, Clock::time_point>& from) {
      std::vector<double> latencies;
      std::lock_guard lock(seen_mu);
      for (const auto& [name, seen] : labeled_seen) {
        auto it = from.find(name);
        if (it != from.end()) latencies.push_back(ms(seen - it->second));
      }
      std::sort(latencies.begin(), latencies.end());
      if (latencies.empty()) return;
      std::printf("[routed] %s -> the agent's ADDED (the router's label included), %zu claims: median %.2f ms, "
                  "p99 %.2f ms, max %.2f ms\n", what, latencies.size(), latencies[latencies.size() / 2],
                  latencies[latencies.size() * 99 / 100], latencies.back());
    };
    if (routed) {
      report("burst: allocation write sent", allocated_at);
      report("burst: allocation write answered", answered_at);
      std::printf("[routed] router: %llu labels, %llu patch errors, %llu events\n",
                  (unsigned long long)router->counters().labeled.load(),
                  (unsigned long long)router->counters().patch_errors.load(),
                  (unsigned long long)router->counters().events.load());
      // One allocation at a time, each waited for: the path's own latency, without a burst's queue.
      std::map<std::string, Clock::time_point> single_sent, single_answered;
      {
        std::lock_guard lock(seen_mu);
        labeled_seen.clear();
      }
      for (int i = 0; i < o_.singles; ++i) {
        const std::string name = "s-" + std::to_string(i);
        const std::string node = NodeName((i * 37) % o_.agents);
        const Json claim = {{"apiVersion", "resource.k8s.io/v1"}, {"kind", "ResourceClaim"},
                            {"metadata", {{"name", name}, {"namespace", o_.ns}}},
                            {"spec", {{"devices", {{"requests", {{{"name", "gpu"},
                                                                  {"exactly", {{"deviceClassName", "bench-gpu"}}}}}}}}}}};
        check(client_->Send("POST", ClaimsPath(), "application/json", claim.dump(), 30s), "create");
        const Json status = {{"status", {{"allocation", {
            {"devices", {{"results", {{{"request", "gpu"}, {"driver", kDriver}, {"pool", node}, {"device", "gpu-0"}}}}}},
            {"nodeSelector", {{"nodeSelectorTerms", {{{"matchFields", {{{"key", "metadata.name"}, {"operator", "In"},
                                                                         {"values", {node}}}}}}}}}}}}}}};
        single_sent[name] = Clock::now();
        check(client_->Send("PATCH", absl::StrCat(ClaimsPath(), "/", name, "/status"), "application/merge-patch+json",
                            status.dump(), 30s), "allocate");
        single_answered[name] = Clock::now();
        const auto wait_until = Clock::now() + 30s;
        auto seen = [&] {
          std::lock_guard lock(seen_mu);
          return labeled_seen.count(name) > 0;
        };
        while (!seen() && Clock::now() < wait_until) std::this_thread::sleep_for(1ms);
        check(client_->Send("DELETE", absl::StrCat(ClaimsPath(), "/", name), "", "", 30s), "delete");
      }
      report("one at a time: allocation write sent", single_sent);
      report("one at a time: allocation write answered", single_answered);
    }
    std::fflush(stdout);
    for (auto& a : agents) a->cancel.Cancel();
    for (auto& a : agents) a->thread.join();
    if (router) {
      router->Stop();
      router_thread.join();
    }
    return failures.load() == 0;
  }

  Options o_;
  std::shared_ptr<ApiClient> client_;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--kubeconfig") o.kubeconfig = value;
    else if (flag == "--agents") o.agents = std::stoi(value);
    else if (flag == "--claims") o.claims = std::stoi(value);
    else if (flag == "--namespace") o.ns = value;
    else if (flag == "--apiserver-pid") o.apiserver_pid = std::stol(value);
    else if (flag == "--phases") o.phases = value;
    else if (flag == "--writers") o.writers = std::stoi(value);
    else if (flag == "--singles") o.singles = std::stoi(value);
    else {
      std::cerr << "unknown flag " << flag << "\n";
      return 2;
    }
  }
  auto config = vfio_agent::kube::LoadKubeconfig(o.kubeconfig);
  if (!config.ok()) {
    std::cerr << config.status() << "\n";
    return 2;
  }
  auto client = std::make_shared<ApiClient>(*std::move(config));
  return Bench(std::move(o), std::move(client)).Run();
}
