#include "metrics.h"

#include <netdb.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/common/thread_name.h"

namespace vfio_agent::daemon::internal {
namespace {

double Seconds(std::chrono::nanoseconds duration) { return std::chrono::duration<double>(duration).count(); }

// As prometheus-cpp wrote them (its text serializer), so that scrapes and dashboards see the same text.
void WriteValue(std::ostringstream& out, double value) {
  if (std::isnan(value)) {
    out << "NaN";
  } else if (std::isinf(value)) {
    out << (value < 0 ? "-Inf" : "+Inf");
  } else {
    out << value;
  }
}

void WriteEscaped(std::ostringstream& out, const std::string& text, bool quote) {
  for (char c : text) {
    if (c == '\\') out << "\\\\";
    else if (c == '\n') out << "\\n";
    else if (quote && c == '"') out << "\\\"";
    else out << c;
  }
}

// name{a="x",b="y"} with `extra` (a histogram bucket's le) last; nothing for no label at all.
void WriteSeries(std::ostringstream& out, const std::string& name, const std::map<std::string, std::string>& labels,
                 const char* extra_name = nullptr, double extra_value = 0) {
  out << name;
  if (labels.empty() && extra_name == nullptr) return;
  out << '{';
  bool first = true;
  for (const auto& [label, value] : labels) {
    out << (first ? "" : ",") << label << "=\"";
    WriteEscaped(out, value, /*quote=*/true);
    out << '"';
    first = false;
  }
  if (extra_name != nullptr) {
    out << (first ? "" : ",") << extra_name << "=\"";
    WriteValue(out, extra_value);
    out << '"';
  }
  out << '}';
}

constexpr int kRequestTimeoutMs = 2000;   // a client that sends no full request in this long is dropped
constexpr size_t kMaxRequestBytes = 8192;  // request line and headers; a scrape's are a few hundred bytes

}  // namespace

struct Metrics::Family {
  std::string name, help, type;  // type: counter, gauge or histogram
  struct Sample {
    double value = 0;               // counter, gauge
    std::vector<double> buckets;    // histogram: upper bounds, +Inf left implicit
    std::vector<uint64_t> counts;   // per bucket, not cumulative
    double sum = 0;
    uint64_t count = 0;
  };
  std::map<Labels, Sample> samples;
};

// /metrics over HTTP/1.1, one connection at a time on one thread (Prometheus scrapes every 15-60 s), each answered
// and closed. Stop() wakes the thread through an eventfd, so a SIGTERM is not held up (civetweb's master thread
// took 0.5-2 s to notice).
class Metrics::Server {
 public:
  Server(int listener, const Metrics& metrics) : listener_(listener), stop_(::eventfd(0, EFD_CLOEXEC)), metrics_(metrics) {
    thread_ = std::thread([this] {
      NameThisThread("va-metrics");
      Loop();
    });
  }
  ~Server() {
    const uint64_t one = 1;
    (void)!::write(stop_, &one, sizeof one);
    thread_.join();
    ::close(listener_);
    ::close(stop_);
  }

 private:
  void Loop() {
    while (true) {
      pollfd fds[2] = {{listener_, POLLIN, 0}, {stop_, POLLIN, 0}};
      if (::poll(fds, 2, -1) < 0 && errno != EINTR) return;
      if (fds[1].revents != 0) return;
      if ((fds[0].revents & POLLIN) == 0) continue;
      const int client = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) continue;
      Answer(client);
      ::close(client);
    }
  }

  // Reads the request head (up to its blank line) and answers GET /metrics with the scrape, anything else 404.
  void Answer(int client) {
    std::string request;
    char buffer[1024];
    while (request.find("\r\n\r\n") == std::string::npos && request.size() < kMaxRequestBytes) {
      pollfd fds[2] = {{client, POLLIN, 0}, {stop_, POLLIN, 0}};
      if (::poll(fds, 2, kRequestTimeoutMs) <= 0 || fds[1].revents != 0) return;
      const ssize_t n = ::recv(client, buffer, sizeof buffer, 0);
      if (n <= 0) return;
      request.append(buffer, static_cast<size_t>(n));
    }
    const std::string line = request.substr(0, request.find("\r\n"));
    const bool get = line.starts_with("GET ") || line.starts_with("HEAD ");
    const std::string path = line.substr(line.find(' ') + 1, line.rfind(' ') - line.find(' ') - 1);
    const bool scrape = get && (path == "/metrics" || path.starts_with("/metrics?"));
    const std::string body = scrape ? metrics_.Render() : "Not Found\n";
    std::string response = absl::StrCat("HTTP/1.1 ", scrape ? "200 OK" : "404 Not Found",
                                        "\r\nContent-Type: ", scrape ? "text/plain; version=0.0.4" : "text/plain",
                                        "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n");
    if (!line.starts_with("HEAD ")) response += body;
    for (size_t sent = 0; sent < response.size();) {
      const ssize_t n = ::send(client, response.data() + sent, response.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return;
      sent += static_cast<size_t>(n);
    }
  }

  const int listener_;
  const int stop_;
  const Metrics& metrics_;
  std::thread thread_;
};

Metrics::Family& Metrics::Declare(const char* name, const char* help, const char* type) {
  families_.push_back(std::make_unique<Family>(Family{.name = name, .help = help, .type = type, .samples = {}}));
  return *families_.back();
}

void Metrics::Set(Family& family, const Labels& labels, double value) {
  std::lock_guard lock(mu_);
  family.samples[labels].value = value;
}

void Metrics::Increment(Family& family, const Labels& labels) {
  std::lock_guard lock(mu_);
  family.samples[labels].value += 1;
}

void Metrics::Observe(Family& family, const Labels& labels, const std::vector<double>& buckets, double value) {
  std::lock_guard lock(mu_);
  Family::Sample& sample = family.samples[labels];
  if (sample.buckets.empty()) {
    sample.buckets = buckets;
    sample.counts.assign(buckets.size() + 1, 0);
  }
  size_t bucket = 0;
  while (bucket < sample.buckets.size() && value > sample.buckets[bucket]) ++bucket;
  ++sample.counts[bucket];
  sample.sum += value;
  ++sample.count;
}

void Metrics::Clear(Family& family) {
  std::lock_guard lock(mu_);
  family.samples.clear();
}

std::string Metrics::Render() const {
  std::ostringstream out;
  out.precision(16);  // prometheus-cpp's: max_digits10 - 1
  std::lock_guard lock(mu_);
  for (const std::unique_ptr<Family>& family : families_) {
    out << "# HELP " << family->name << ' ';
    WriteEscaped(out, family->help, /*quote=*/false);
    out << "\n# TYPE " << family->name << ' ' << family->type << '\n';
    for (const auto& [labels, sample] : family->samples) {
      if (family->type != "histogram") {
        WriteSeries(out, family->name, labels);
        out << ' ';
        WriteValue(out, sample.value);
        out << '\n';
        continue;
      }
      WriteSeries(out, family->name + "_count", labels);
      out << ' ' << sample.count << '\n';
      WriteSeries(out, family->name + "_sum", labels);
      out << ' ';
      WriteValue(out, sample.sum);
      out << '\n';
      uint64_t cumulative = 0;
      for (size_t i = 0; i <= sample.buckets.size(); ++i) {
        cumulative += sample.counts[i];
        const double le = i < sample.buckets.size() ? sample.buckets[i] : INFINITY;
        WriteSeries(out, family->name + "_bucket", labels, "le", le);
        out << ' ' << cumulative << '\n';
      }
    }
  }
  return out.str();
}

Metrics::Metrics()
    : devices_(Declare("vfio_gpu_agent_devices", "Selected GPUs by resource and state (healthy, unhealthy, unbound)",
                       "gauge")),
      binds_(Declare("vfio_gpu_agent_binds_total", "Bind attempts of one function by outcome", "counter")),
      bind_failures_(Declare("vfio_gpu_agent_bind_failures_total", "Failed or blocked binds by reason", "counter")),
      registrations_(Declare("vfio_gpu_agent_registrations", "Successful Register calls with the kubelet, by resource",
                             "gauge")),
      kubelet_restarts_(Declare("vfio_gpu_agent_kubelet_restarts_total",
                                "Kubelet restarts seen (kubelet.sock re-created after a registration)", "counter")),
      last_reconcile_(Declare("vfio_gpu_agent_last_reconcile_timestamp_seconds",
                              "Unix time of the last finished reconcile pass", "gauge")),
      reconcile_seconds_(Declare("vfio_gpu_agent_reconcile_duration_seconds", "Duration of the last reconcile pass",
                                 "gauge")),
      ready_(Declare("vfio_gpu_agent_ready", "1 when every selected GPU is bound, healthy, registered and allocatable",
                     "gauge")),
      not_ready_(Declare("vfio_gpu_agent_not_ready", "1 for the check that makes the node not ready", "gauge")),
      allocations_(Declare("vfio_gpu_agent_allocations_total",
                           "Allocate calls from the kubelet by resource and result", "counter")),
      allocate_seconds_(Declare("vfio_gpu_agent_allocate_duration_seconds", "Time the plugin spent in Allocate",
                                "histogram")),
      validation_(Declare("vfio_gpu_agent_validation_result",
                          "1 for each check's current result (pass, warn, fail, skip) by check id and subject",
                          "gauge")),
      api_(Declare("vfio_gpu_agent_kube_api",
                   "Kubernetes API client counters since start (requests, failures, condition patches, events)",
                   "gauge")),
      api_pending_writes_(Declare("vfio_gpu_agent_kube_api_pending_writes",
                                  "Writes the API server has not accepted yet, in flight included (the node "
                                  "condition, distinct events)",
                                  "gauge")),
      fabric_(Declare("vfio_gpu_agent_fabric",
                      "Shared-NVSwitch mode: connected (1 while Fabric Manager answers), partitions_supported, "
                      "partitions_active, reconnects",
                      "gauge")),
      partition_activations_(Declare("vfio_gpu_agent_fabric_partition_activations_total",
                                     "Partition activations for an Allocate or a DRA claim's Prepare, by result and "
                                     "FM status",
                                     "counter")),
      partition_releases_(Declare("vfio_gpu_agent_fabric_partition_releases_total",
                                  "Partitions deactivated (no pod held them, their DRA claim ended, or an overlapping "
                                  "one was wanted)",
                                  "counter")),
      // Set once: a restart of the agent's container shows as a new value (changes() over a window).
      start_time_(Declare("vfio_gpu_agent_start_time_seconds", "Unix time this agent process started", "gauge")),
      vgpu_config_(Declare("vfio_gpu_agent_vgpu_config_state",
                           "1 for the vGPU profile config's current outcome on the node (success, pending, failed)",
                           "gauge")),
      prepare_seconds_(Declare("vfio_gpu_agent_dra_prepare_duration_seconds",
                               "DRA NodePrepareResources calls, from the kubelet's call to the answer, by result",
                               "histogram")),
      binding_wait_seconds_(Declare(
          "vfio_gpu_agent_dra_binding_wait_seconds",
          "DRA binding conditions: from a claim's allocation seen by the agent to its binding (or failure) condition "
          "written, by result; the scheduler holds the pod in PreBind meanwhile",
          "histogram")) {
  // The families without labels show 0 from the start, as they did under prometheus-cpp.
  for (Family* family : {&kubelet_restarts_, &last_reconcile_, &reconcile_seconds_, &ready_, &api_pending_writes_,
                         &partition_releases_}) {
    Set(*family, {}, 0);
  }
  Set(start_time_, {}, std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
}

Metrics::~Metrics() = default;

absl::Status Metrics::Listen(const std::string& host, int port) {
  const std::string address = absl::StrCat(host, ":", port);
  std::string name = host;
  if (name.size() >= 2 && name.front() == '[' && name.back() == ']') name = name.substr(1, name.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(name.empty() ? nullptr : name.c_str(), std::to_string(port).c_str(), &hints, &found);
      rc != 0) {
    return absl::UnavailableError(absl::StrCat("metrics on ", address, ": ", ::gai_strerror(rc)));
  }
  int listener = -1, error = 0;
  for (addrinfo* a = found; a != nullptr && listener < 0; a = a->ai_next) {
    listener = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (listener < 0) {
      error = errno;
      continue;
    }
    const int on = 1;
    ::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    if (::bind(listener, a->ai_addr, a->ai_addrlen) != 0 || ::listen(listener, 16) != 0) {
      error = errno;
      ::close(listener);
      listener = -1;
    }
  }
  ::freeaddrinfo(found);
  if (listener < 0) return absl::UnavailableError(absl::StrCat("metrics on ", address, ": ", std::strerror(error)));
  server_ = std::make_unique<Server>(listener, *this);
  return absl::OkStatus();
}

void Metrics::SetDevices(const std::map<std::pair<std::string, std::string>, int>& counts) {
  std::lock_guard lock(mu_);
  devices_.samples.clear();
  for (const auto& [key, count] : counts) {
    devices_.samples[{{"resource", key.first}, {"state", key.second}}].value = count;
  }
}

void Metrics::CountBind(const std::string& outcome) { Increment(binds_, {{"outcome", outcome}}); }

void Metrics::CountBindFailure(const std::string& reason) { Increment(bind_failures_, {{"reason", reason}}); }

void Metrics::SetRegistrations(const std::string& resource, int registrations) {
  Set(registrations_, {{"resource", resource}}, registrations);
}

void Metrics::SetReconciled(std::chrono::system_clock::time_point when, std::chrono::nanoseconds cost) {
  Set(last_reconcile_, {}, std::chrono::duration<double>(when.time_since_epoch()).count());
  Set(reconcile_seconds_, {}, Seconds(cost));
}

void Metrics::SetReady(bool ready, const std::string& check_id) {
  std::lock_guard lock(mu_);
  ready_.samples[{}].value = ready ? 1 : 0;
  not_ready_.samples.clear();
  if (!ready) not_ready_.samples[{{"check", check_id}}].value = 1;
}

void Metrics::SetValidation(const std::vector<validation::Check>& checks) {
  std::lock_guard lock(mu_);
  validation_.samples.clear();
  for (const validation::Check& check : checks) {
    validation_.samples[{{"check", check.id}, {"subject", check.subject}, {"result", validation::ResultName(check.result)}}]
        .value = 1;
  }
}

void Metrics::SetApiStats(const kube::ReporterStats& stats) {
  std::lock_guard lock(mu_);
  auto set = [&](const char* counter, double value) { api_.samples[{{"counter", counter}}].value = value; };
  set("requests", static_cast<double>(stats.requests));
  set("failures", static_cast<double>(stats.failures));
  set("condition_patches", static_cast<double>(stats.condition_patches));
  set("events_created", static_cast<double>(stats.events_created));
  set("events_updated", static_cast<double>(stats.events_updated));
  set("events_dropped", static_cast<double>(stats.events_dropped));
  api_pending_writes_.samples[{}].value = static_cast<double>(stats.pending_writes);
}

void Metrics::OnAllocate(const std::string& resource_name, bool ok, std::chrono::nanoseconds latency) {
  Increment(allocations_, {{"resource", resource_name}, {"result", ok ? "ok" : "rejected"}});
  static const std::vector<double> kBuckets = {1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 1e-1};
  Observe(allocate_seconds_, {{"resource", resource_name}}, kBuckets, Seconds(latency));
}

void Metrics::OnKubeletRestart() { Increment(kubelet_restarts_, {}); }

void Metrics::SetFabric(const fabric::FabricStatus& status) {
  int active = 0;
  for (const fabric::Partition& partition : status.table.partitions()) active += partition.active ? 1 : 0;
  std::lock_guard lock(mu_);
  auto set = [&](const char* value, double v) { fabric_.samples[{{"value", value}}].value = v; };
  set("connected", status.connected && status.error.empty() ? 1 : 0);
  set("partitions_supported", static_cast<double>(status.table.partitions().size()));
  set("partitions_active", active);
  set("reconnects", status.reconnects);
}

void Metrics::CountPartitionActivation(bool ok, const std::string& fm_status) {
  Increment(partition_activations_, {{"result", ok ? "ok" : "failed"}, {"fm_status", ok ? "FM_ST_SUCCESS" : fm_status}});
}

void Metrics::CountPartitionRelease() { Increment(partition_releases_, {}); }

void Metrics::SetVgpuConfigState(const std::string& state) {
  std::lock_guard lock(mu_);
  vgpu_config_.samples.clear();
  if (!state.empty()) vgpu_config_.samples[{{"state", state}}].value = 1;
}

void Metrics::OnPrepare(bool ok, std::chrono::nanoseconds duration) {
  // A Prepare that binds (--bind-on-prepare) takes seconds; one of a GPU already on vfio-pci, milliseconds.
  static const std::vector<double> kBuckets = {1e-3, 1e-2, 0.1, 0.5, 1, 2, 5, 10, 30};
  Observe(prepare_seconds_, {{"result", ok ? "ok" : "failed"}}, kBuckets, Seconds(duration));
}

void Metrics::OnBinding(bool ok, std::chrono::nanoseconds waited) {
  // A bind takes a second or a few; a holder that does not let go, the write timeout (5 s) per function.
  static const std::vector<double> kBuckets = {0.01, 0.1, 0.5, 1, 2, 5, 10, 30, 60};
  Observe(binding_wait_seconds_, {{"result", ok ? "ok" : "failed"}}, kBuckets, Seconds(waited));
}

}  // namespace vfio_agent::daemon::internal
