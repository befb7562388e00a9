#include "vfio_gpu_agent/router/claim_router.h"

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <vector>
#include <thread>

#include "absl/strings/str_cat.h"
#include "api_client.h"
#include "config.h"
#include "lease.h"
#include "list_watch.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/common/thread_name.h"
#include "vfio_gpu_agent/kube/claim_routing.h"

namespace vfio_agent::router {
namespace {

using Json = nlohmann::json;
using namespace std::chrono_literals;

constexpr char kClaimsPath[] = "/apis/resource.k8s.io/v1/resourceclaims";
// A page of the cluster-wide list: the apiserver's own default for its clients' lists (client-go's pager).
constexpr int kListPage = 500;

absl::StatusOr<ClaimRoute> RouteOfJson(const Json& claim, std::string_view driver) {
  if (!claim.is_object() || !claim.contains("metadata") || !claim["metadata"].is_object()) {
    return absl::DataLossError("not a ResourceClaim: no metadata");
  }
  const Json& meta = claim["metadata"];
  ClaimRoute route{.namespace_name = meta.value("namespace", ""), .name = meta.value("name", ""),
                   .uid = meta.value("uid", "")};
  if (route.namespace_name.empty() || route.name.empty()) {
    return absl::DataLossError("not a ResourceClaim: no metadata.namespace or metadata.name");
  }
  const std::string label_key(kube::kClaimNodeLabel);
  if (meta.contains("labels") && meta["labels"].is_object() && meta["labels"].contains(label_key) &&
      meta["labels"][label_key].is_string()) {
    route.current = meta["labels"][label_key].get<std::string>();
  }
  const Json* results = nullptr;
  if (claim.contains("status") && claim["status"].is_object()) {
    const Json& status = claim["status"];
    if (status.contains("allocation") && status["allocation"].is_object() &&
        status["allocation"].contains("devices") && status["allocation"]["devices"].is_object() &&
        status["allocation"]["devices"].contains("results") && status["allocation"]["devices"]["results"].is_array()) {
      results = &status["allocation"]["devices"]["results"];
    }
  }
  if (results == nullptr) return route;
  std::string pool;
  for (const Json& result : *results) {
    if (!result.is_object() || result.value("driver", "") != driver) continue;
    const std::string this_pool = result.value("pool", "");
    if (this_pool.empty()) continue;
    if (pool.empty()) {
      pool = this_pool;
    } else if (this_pool != pool) {
      route.several_pools = true;
    }
  }
  if (!pool.empty()) route.wanted = kube::ClaimNodeLabelValue(pool);
  return route;
}

// The label worker's queue: one entry per claim, the newest wish wins (a claim allocated, then reallocated before
// the first PATCH went out, is patched once with the second node). Owned by Routing; both threads use it.
struct LabelQueue {
  struct Item {
    std::string uid;
    std::optional<std::string> wanted;
    std::chrono::steady_clock::time_point not_before{};
    int failures = 0;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, Item> items;  // "namespace/name"
  std::deque<std::string> order;      // keys in the order they became due
  std::set<std::string> busy;         // keys a writer is patching now: one PATCH per claim at a time
  bool stopping = false;
};

}  // namespace

absl::StatusOr<ClaimRoute> RouteOf(std::string_view claim_json, std::string_view driver) {
  const Json claim = Json::parse(claim_json, nullptr, /*allow_exceptions=*/false);
  return RouteOfJson(claim, driver);
}

// The work of a leader: the claim watch ("claim-watch" thread, owns the connection) and the label writers
// (kLabelWriters "claim-label" threads, each owning the PATCH it sends). Started when this replica becomes the
// leader, destroyed when it stops being one: a former leader writes nothing more.
//
// Several writers because every PATCH is a request of its own (a new connection and TLS handshake each, as
// every kube::ApiClient request): one writer labeled a burst of 40 allocations on the real API server in 15 ms
// steps, the last ~0.5 s after its allocation (tests/bench/README.md, "Claim routing").
constexpr int kLabelWriters = 8;
class Routing {
 public:
  Routing(std::shared_ptr<kube::ApiClient> client, const RouterOptions& options,
          std::shared_ptr<RouterCounters> counters)
      : client_(std::move(client)), options_(options), counters_(std::move(counters)) {
    for (int i = 0; i < kLabelWriters; ++i) writers_.emplace_back([this] { WriteLabels(); });
    // Every list (the first, and after a 410: what the watch missed) considers every claim again.
    watcher_ = std::make_unique<kube::ListWatcher>(
        client_, kClaimsPath, "ResourceClaims", "claim-watch",
        kube::ListWatcher::Handlers{
            .listed =
                [this](const Json& list, bool /*relisted*/) {
                  ++counters_->lists;
                  if (!list.contains("items") || !list["items"].is_array()) return;
                  for (const Json& claim : list["items"]) Consider(claim);
                },
            .event =
                [this](const std::string& type, const Json& claim) {
                  ++counters_->events;
                  if (type == "DELETED") {
                    Forget(claim);
                  } else {
                    Consider(claim);
                  }
                }},
        kListPage);
  }
  ~Routing() {
    {
      std::lock_guard lock(queue_.mu);
      queue_.stopping = true;
    }
    queue_.cv.notify_all();
    watcher_.reset();  // joins its thread: no Consider after this
    for (std::thread& writer : writers_) writer.join();
  }

 private:
  void Consider(const Json& claim) {
    absl::StatusOr<ClaimRoute> route = RouteOfJson(claim, options_.driver);
    if (!route.ok()) {
      spdlog::warn("claim-router: a claim event without namespace and name: {}", std::string(route.status().message()));
      return;
    }
    const std::string key = absl::StrCat(route->namespace_name, "/", route->name);
    std::lock_guard lock(queue_.mu);
    if (route->settled()) {
      // Already as wanted (our own PATCH coming back, or a claim of another driver): drop an older wish.
      queue_.items.erase(key);
      return;
    }
    if (route->several_pools) {
      spdlog::warn("claim-router: claim {} has {} devices in several pools; labeled for the first ({})", key,
                   options_.driver, *route->wanted);
    }
    auto [it, added] = queue_.items.try_emplace(key);
    it->second.uid = route->uid;
    it->second.wanted = route->wanted;
    it->second.failures = 0;
    it->second.not_before = {};
    queue_.order.push_back(key);
    queue_.cv.notify_all();  // the watch thread waits on it too (backoff)
  }

  void Forget(const Json& claim) {
    if (!claim.contains("metadata") || !claim["metadata"].is_object()) return;
    std::lock_guard lock(queue_.mu);
    queue_.items.erase(absl::StrCat(claim["metadata"].value("namespace", ""), "/", claim["metadata"].value("name", "")));
  }

  void WriteLabels() {
    NameThisThread("claim-label");
    std::unique_lock lock(queue_.mu);
    while (true) {
      std::string key;
      LabelQueue::Item item;
      auto next_due = std::chrono::steady_clock::time_point::max();
      const auto now = std::chrono::steady_clock::now();
      // The first due key; a key may be in `order` more than once (or no longer in `items`): each is taken once.
      for (auto it = queue_.order.begin(); it != queue_.order.end();) {
        auto found = queue_.items.find(*it);
        if (found == queue_.items.end()) {
          it = queue_.order.erase(it);
          continue;
        }
        if (queue_.busy.count(*it)) {  // in flight: its newer wish waits for that PATCH's end
          ++it;
          continue;
        }
        if (found->second.not_before <= now) {
          key = *it;
          item = found->second;
          queue_.items.erase(found);
          queue_.order.erase(it);
          break;
        }
        next_due = std::min(next_due, found->second.not_before);
        ++it;
      }
      if (queue_.stopping) return;
      if (key.empty()) {
        if (next_due == std::chrono::steady_clock::time_point::max()) {
          queue_.cv.wait(lock);
        } else {
          queue_.cv.wait_until(lock, next_due);
        }
        continue;
      }
      queue_.busy.insert(key);
      lock.unlock();
      const absl::Status written = Patch(key, item);
      lock.lock();
      queue_.busy.erase(key);
      queue_.cv.notify_all();  // a wish that waited for this key
      if (written.ok() || queue_.stopping) continue;
      ++counters_->patch_errors;
      // Retried with a doubling backoff (100 ms to 30 s), unless a newer wish for the claim came meanwhile.
      const auto backoff = std::min<std::chrono::milliseconds>(100ms * (1 << std::min(item.failures, 9)), 30s);
      spdlog::warn("claim-router: label of claim {}: {}; retried in {} ms", key, std::string(written.message()), backoff.count());
      auto [it, added] = queue_.items.try_emplace(key, item);
      if (added) {
        it->second.failures = item.failures + 1;
        it->second.not_before = std::chrono::steady_clock::now() + backoff;
        queue_.order.push_back(key);
      }
    }
  }

  absl::Status Patch(const std::string& key, const LabelQueue::Item& item) {
    const size_t slash = key.find('/');
    const std::string path = absl::StrCat("/apis/resource.k8s.io/v1/namespaces/", key.substr(0, slash),
                                          "/resourceclaims/", key.substr(slash + 1));
    // A merge patch of the one label (null removes it); the uid makes a claim deleted and created again under the
    // same name fail (422: uid is immutable) instead of being labeled from its predecessor's allocation.
    Json labels = Json::object();
    labels[std::string(kube::kClaimNodeLabel)] = item.wanted ? Json(*item.wanted) : Json(nullptr);
    Json meta = {{"labels", std::move(labels)}};
    if (!item.uid.empty()) meta["uid"] = item.uid;
    const Json patch = {{"metadata", std::move(meta)}};
    absl::StatusOr<kube::ApiResponse> answer =
        client_->Send("PATCH", path, "application/merge-patch+json", patch.dump(), options_.request_timeout);
    if (!answer.ok()) return kube::TransportError(answer.status());
    // Gone, or recreated: its own events say what the new one needs.
    if (answer->code == 404 || answer->code == 409 || answer->code == 422) {
      spdlog::info("claim-router: claim {} changed under the label ({}): {}", key, answer->code,
                   kube::ServerMessage(*answer));
      return absl::OkStatus();
    }
    if (answer->code / 100 != 2) {
      return absl::UnavailableError(
          absl::StrCat("PATCH ", client_->Url(path), ": ", answer->code, " ", kube::ServerMessage(*answer)));
    }
    if (item.wanted) {
      ++counters_->labeled;
      spdlog::info("claim-router: claim {} labeled {}={}", key, kube::kClaimNodeLabel, *item.wanted);
    } else {
      ++counters_->unlabeled;
      spdlog::info("claim-router: claim {} unlabeled (no longer allocated to {})", key, options_.driver);
    }
    return absl::OkStatus();
  }

  const std::shared_ptr<kube::ApiClient> client_;
  const RouterOptions options_;
  const std::shared_ptr<RouterCounters> counters_;
  LabelQueue queue_;
  std::vector<std::thread> writers_;
  std::unique_ptr<kube::ListWatcher> watcher_;  // its thread ("claim-watch") calls Consider and Forget
};

struct ClaimRouter::Impl {
  RouterOptions options;
  std::shared_ptr<kube::ApiClient> client;
  std::unique_ptr<LeaseLock> lease;
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
};

absl::StatusOr<std::unique_ptr<ClaimRouter>> ClaimRouter::Connect(RouterOptions options) {
  if (options.identity.empty()) return absl::InvalidArgumentError("no identity for the lease (--identity, POD_NAME)");
  if (!kube::IsDnsSubdomain(options.lease_namespace)) {
    return absl::InvalidArgumentError(absl::StrCat("invalid lease namespace \"", options.lease_namespace, "\""));
  }
  if (!kube::IsDnsSubdomain(options.lease_name)) {
    return absl::InvalidArgumentError(absl::StrCat("invalid lease name \"", options.lease_name, "\""));
  }
  if (!kube::IsDnsSubdomain(options.driver) || options.driver.size() > 63) {
    return absl::InvalidArgumentError(absl::StrCat("invalid DRA driver name \"", options.driver, "\""));
  }
  if (!(options.lease_duration > options.renew_deadline && options.renew_deadline > options.retry_period &&
        options.retry_period > 0ms)) {
    return absl::InvalidArgumentError(
        "lease durations: the lease duration must exceed the renew deadline, which must exceed the retry period "
        "(> 0): a leader must give up before a standby may take over");
  }
  absl::StatusOr<kube::ClusterConfig> config = kube::LoadClusterConfig(options.kubeconfig, options.service_account_dir);
  if (!config.ok()) return config.status();
  auto impl = std::make_unique<Impl>();
  impl->client = std::make_shared<kube::ApiClient>(*std::move(config));
  // Each request must end before the renew deadline, or a hung one would keep a replica acting past it.
  options.request_timeout = std::min(options.request_timeout, options.renew_deadline / 2);
  impl->lease = std::make_unique<LeaseLock>(impl->client, options.lease_namespace, options.lease_name, options.identity,
                                            options.lease_duration, options.request_timeout);
  impl->options = std::move(options);
  return std::unique_ptr<ClaimRouter>(new ClaimRouter(std::move(impl)));
}

ClaimRouter::ClaimRouter(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)), counters_(std::make_shared<RouterCounters>()) {}

ClaimRouter::~ClaimRouter() = default;

void ClaimRouter::Stop() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
}

absl::Status ClaimRouter::Run() {
  NameThisThread("claim-lease");
  const RouterOptions& options = impl_->options;
  std::unique_ptr<Routing> routing;
  auto last_renewal = std::chrono::steady_clock::time_point{};
  std::string failing;
  spdlog::info("claim-router {}: candidate for lease {} (duration {} ms, renew deadline {} ms, retry {} ms)",
               options.identity, impl_->lease->path(), options.lease_duration.count(), options.renew_deadline.count(),
               options.retry_period.count());
  while (true) {
    {
      std::lock_guard lock(impl_->mu);
      if (impl_->stop) break;
    }
    const auto attempt = std::chrono::steady_clock::now();
    absl::StatusOr<bool> held = impl_->lease->TryAcquireOrRenew();
    if (!held.ok()) {
      if (failing != held.status().message()) spdlog::warn("claim-router {}: lease: {}", options.identity, std::string(held.status().message()));
      failing = std::string(held.status().message());
    } else {
      failing.clear();
    }
    if (held.ok() && *held) {
      last_renewal = attempt;
      if (!routing) {
        ++counters_->terms;
        spdlog::info("claim-router {}: leading; routing claims of {}", options.identity, options.driver);
        routing = std::make_unique<Routing>(impl_->client, options, counters_);
        leading_ = true;
      }
    } else if (routing && (held.ok() || attempt - last_renewal >= options.renew_deadline)) {
      // Another replica holds it, or no renewal got through within the deadline: stop before a standby may
      // take over (lease duration > renew deadline).
      spdlog::warn("claim-router {}: lost the lease; routing stopped", options.identity);
      leading_ = false;
      routing.reset();
    }
    std::unique_lock lock(impl_->mu);
    impl_->cv.wait_until(lock, attempt + options.retry_period, [this] { return impl_->stop; });
  }
  const bool was_leading = routing != nullptr;
  leading_ = false;
  routing.reset();
  if (!was_leading) return absl::OkStatus();
  absl::Status released = impl_->lease->Release();
  if (released.ok()) spdlog::info("claim-router {}: lease released", options.identity);
  return released;
}

}  // namespace vfio_agent::router
