#include "lease.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "api_client.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace vfio_agent::router {
namespace {

using Json = nlohmann::json;

// metav1.MicroTime: RFC 3339 with exactly six fractional digits.
std::string MicroTimeNow() { return absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", absl::Now(), absl::UTCTimeZone()); }

absl::Status Failed(const absl::StatusOr<kube::ApiResponse>& response, const std::string& request) {
  if (!response.ok()) return kube::TransportError(response.status());
  const std::string what = absl::StrCat(request, ": ", response->code, " ", kube::ServerMessage(*response));
  switch (response->code) {
    case 401: return absl::UnauthenticatedError(what);
    case 403: return absl::PermissionDeniedError(what);
    case 400:
    case 422: return absl::InvalidArgumentError(what);
    default: return absl::UnavailableError(what);
  }
}

}  // namespace

LeaseLock::LeaseLock(std::shared_ptr<kube::ApiClient> client, std::string namespace_name, std::string name,
                     std::string identity, std::chrono::milliseconds duration, std::chrono::milliseconds timeout)
    : client_(std::move(client)),
      namespace_name_(std::move(namespace_name)),
      name_(std::move(name)),
      identity_(std::move(identity)),
      duration_(duration),
      timeout_(timeout),
      path_(absl::StrCat("/apis/coordination.k8s.io/v1/namespaces/", namespace_name_, "/leases/", name_)) {}

absl::StatusOr<bool> LeaseLock::TryAcquireOrRenew() {
  const auto now = std::chrono::steady_clock::now();
  const int duration_seconds = static_cast<int>(std::max<int64_t>(
      1, std::chrono::duration_cast<std::chrono::seconds>(duration_ + std::chrono::milliseconds(999)).count()));
  absl::StatusOr<kube::ApiResponse> got = client_->Send("GET", path_, "", "", timeout_);
  if (got.ok() && got->code == 404) {
    const std::string collection = absl::StrCat("/apis/coordination.k8s.io/v1/namespaces/", namespace_name_, "/leases");
    const std::string stamp = MicroTimeNow();
    const Json lease = {{"apiVersion", "coordination.k8s.io/v1"},
                        {"kind", "Lease"},
                        {"metadata", {{"name", name_}, {"namespace", namespace_name_}}},
                        {"spec", {{"holderIdentity", identity_},
                                  {"leaseDurationSeconds", duration_seconds},
                                  {"acquireTime", stamp},
                                  {"renewTime", stamp},
                                  {"leaseTransitions", 0}}}};
    absl::StatusOr<kube::ApiResponse> created = client_->Send("POST", collection, "application/json", lease.dump(), timeout_);
    if (created.ok() && created->code == 409) return false;  // another candidate created it first
    if (!created.ok() || created->code / 100 != 2) return Failed(created, absl::StrCat("POST ", client_->Url(collection)));
    const Json stored = Json::parse(created->body, nullptr, /*allow_exceptions=*/false);
    observed_version_ = stored.is_object() ? stored["metadata"].value("resourceVersion", "") : "";
    observed_holder_ = identity_;
    observed_at_ = now;
    acquire_time_ = stamp;
    transitions_ = 0;
    held_ = true;
    return true;
  }
  if (!got.ok() || got->code / 100 != 2) return Failed(got, absl::StrCat("GET ", client_->Url(path_)));
  const Json lease = Json::parse(got->body, nullptr, /*allow_exceptions=*/false);
  if (!lease.is_object() || !lease.contains("metadata") || !lease["metadata"].is_object()) {
    return absl::DataLossError(absl::StrCat("GET ", client_->Url(path_), ": the answer is not a Lease"));
  }
  const std::string version = lease["metadata"].value("resourceVersion", "");
  const Json spec = lease.contains("spec") && lease["spec"].is_object() ? lease["spec"] : Json::object();
  const std::string holder = spec.value("holderIdentity", "");
  const int64_t their_duration = spec.value("leaseDurationSeconds", int64_t{0});
  const int64_t transitions = spec.value("leaseTransitions", int64_t{0});
  if (version != observed_version_) {
    observed_version_ = version;
    observed_holder_ = holder;
    observed_at_ = now;
  }
  if (!holder.empty() && holder != identity_ &&
      now < observed_at_ + std::chrono::seconds(std::max<int64_t>(their_duration, 1))) {
    held_ = false;
    return false;  // held by another replica that renewed it within its duration, as far as we have seen
  }
  const bool ours = holder == identity_;
  const std::string stamp = MicroTimeNow();
  if (!ours || acquire_time_.empty()) acquire_time_ = ours ? spec.value("acquireTime", stamp) : stamp;
  transitions_ = ours ? transitions : transitions + 1;
  Json updated = lease;
  updated["spec"] = {{"holderIdentity", identity_},
                     {"leaseDurationSeconds", duration_seconds},
                     {"acquireTime", acquire_time_},
                     {"renewTime", stamp},
                     {"leaseTransitions", transitions_}};
  absl::StatusOr<kube::ApiResponse> put = client_->Send("PUT", path_, "application/json", updated.dump(), timeout_);
  if (put.ok() && put->code == 409) {
    held_ = false;
    return false;  // someone wrote it since our GET: whoever it was, they act on a newer record than ours
  }
  if (!put.ok() || put->code / 100 != 2) return Failed(put, absl::StrCat("PUT ", client_->Url(path_)));
  const Json stored = Json::parse(put->body, nullptr, /*allow_exceptions=*/false);
  observed_version_ = stored.is_object() && stored.contains("metadata") ? stored["metadata"].value("resourceVersion", "") : "";
  observed_holder_ = identity_;
  observed_at_ = now;
  if (!ours) spdlog::info("claim-router {}: took lease {} over from \"{}\"", identity_, path_, holder);
  held_ = true;
  return true;
}

absl::Status LeaseLock::Release() {
  if (!held_) return absl::OkStatus();
  held_ = false;
  absl::StatusOr<kube::ApiResponse> got = client_->Send("GET", path_, "", "", timeout_);
  if (!got.ok() || got->code / 100 != 2) return Failed(got, absl::StrCat("GET ", client_->Url(path_)));
  Json lease = Json::parse(got->body, nullptr, /*allow_exceptions=*/false);
  if (!lease.is_object() || !lease.contains("spec") || lease["spec"].value("holderIdentity", "") != identity_) {
    return absl::OkStatus();  // no longer ours: nothing to hand back
  }
  const std::string stamp = MicroTimeNow();
  lease["spec"]["holderIdentity"] = "";
  lease["spec"]["leaseDurationSeconds"] = 1;
  lease["spec"]["renewTime"] = stamp;
  lease["spec"]["acquireTime"] = stamp;
  absl::StatusOr<kube::ApiResponse> put = client_->Send("PUT", path_, "application/json", lease.dump(), timeout_);
  if (put.ok() && put->code == 409) return absl::OkStatus();  // taken meanwhile
  if (!put.ok() || put->code / 100 != 2) return Failed(put, absl::StrCat("PUT ", client_->Url(path_)));
  return absl::OkStatus();
}

}  // namespace vfio_agent::router
