// The api layer: whether the admission policy that holds each agent to its own Node is installed and bound.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cluster_check_util.h"
#include "nlohmann/json.hpp"
#include "vfio_gpu_agent/validation/check.h"

namespace vfio_agent::validation {
namespace {

using cluster::MakeCheck;
using Json = nlohmann::json;
using Outcome = ApiObjectRead::Outcome;

constexpr char kId[] = "api.admission_policy";
constexpr char kPolicyFile[] = "daemonset/base/agent/admission-policy.yaml";
constexpr char kLost[] =
    "without it every agent's token may patch any Node's status (capacity, allocatable, conditions) and write "
    "Events about any Node, so one compromised agent can steer VMs across the cluster";
constexpr char kRule[] =
    "ClusterRole rule {apiGroups: [\"admissionregistration.k8s.io\"], resources: [\"validatingadmissionpolicies\", "
    "\"validatingadmissionpolicybindings\"], resourceNames: [\"%s\"], verbs: [\"get\"]}";

std::string Rule(const std::string& name) {
  std::string rule = kRule;
  rule.replace(rule.find("%s"), 2, name);
  return rule;
}

std::string InstallFix() {
  return absl::StrCat("Apply the overlay again (`kubectl apply -k daemonset/overlays/<yours>`; it includes ",
                      kPolicyFile, "), or that file alone with the overlay's ServiceAccount in its matchConditions; "
                      "Kubernetes >= 1.30.");
}

// Field access that never throws: the server's objects are read as they come, whatever their shape.
const Json& Field(const Json& object, const char* key) {
  static const Json kNull;
  if (!object.is_object()) return kNull;
  auto it = object.find(key);
  return it == object.end() ? kNull : *it;
}

std::string Text(const Json& object, const char* key, const std::string& absent) {
  const Json& value = Field(object, key);
  return value.is_string() ? value.get<std::string>() : absent;
}

std::vector<std::string> Texts(const Json& list, const char* key) {
  std::vector<std::string> out;
  if (!list.is_array()) return out;
  for (const Json& item : list) {
    if (key == nullptr && item.is_string()) out.push_back(item.get<std::string>());
    if (key != nullptr) out.push_back(Text(item, key, ""));
  }
  return out;
}

// One line about the object for evidence: what decides whether it holds anything.
std::string PolicySummary(const Json& policy) {
  const Json& spec = Field(policy, "spec");
  const std::vector<std::string> conditions = Texts(Field(spec, "matchConditions"), "expression");
  const Json& validations = Field(spec, "validations");
  return absl::StrCat("failurePolicy ", Text(spec, "failurePolicy", "(default Fail)"), ", ",
                      validations.is_array() ? validations.size() : 0, " validations, matchConditions: ",
                      conditions.empty() ? "(none: every user)" : absl::StrJoin(conditions, " && "));
}

std::vector<std::string> Actions(const Json& binding) {
  return Texts(Field(Field(binding, "spec"), "validationActions"), nullptr);
}

std::string BindingSummary(const Json& binding) {
  return absl::StrCat("policyName ", Text(Field(binding, "spec"), "policyName", "(none)"), ", validationActions [",
                      absl::StrJoin(Actions(binding), ","), "]");
}

std::vector<Check> One(const std::string& subject, Result result, std::string message, std::vector<Evidence> evidence,
                       std::string fix) {
  return {MakeCheck(kId, Layer::kApi, subject, result, std::move(message), std::move(evidence), std::move(fix))};
}

}  // namespace

std::vector<Check> ApiChecks(const std::optional<AdmissionPolicyRead>& read) {
  if (!read) {
    return One("node", Result::kSkip,
               "not checked: no cluster to read the admission policy from (--kubeconfig, or in-cluster)", {}, "");
  }
  const std::string& name = read->name;
  const ApiObjectRead& policy = read->policy;
  const ApiObjectRead& binding = read->binding;
  const std::string credentials = absl::StrCat("(credentials: ", read->credentials, ")");
  std::vector<Evidence> evidence = {
      {policy.request, policy.outcome == Outcome::kFound ? PolicySummary(Json::parse(policy.body, nullptr, false))
                                                         : absl::StrCat(policy.body, " ", credentials)},
      {binding.request, binding.outcome == Outcome::kFound ? BindingSummary(Json::parse(binding.body, nullptr, false))
                                                           : absl::StrCat(binding.body, " ", credentials)}};
  auto any = [&](Outcome outcome) { return policy.outcome == outcome || binding.outcome == outcome; };

  // What the server could not tell first: those say nothing about whether the policy is there.
  if (any(Outcome::kNotServed)) {
    return One(name, Result::kWarn,
               absl::StrCat("the API server does not serve admissionregistration.k8s.io/v1 "
                            "ValidatingAdmissionPolicies (Kubernetes < 1.30): nothing holds an agent to its own "
                            "Node; ", kLost),
               std::move(evidence),
               absl::StrCat("Kubernetes >= 1.30 (pod-bound tokens name their node from 1.30, GA in 1.32), then ",
                            InstallFix(), " Until then RBAC alone bounds the agent (docs/admission-policy.md)."));
  }
  if (any(Outcome::kForbidden)) {
    return One(name, Result::kWarn,
               absl::StrCat("the agent's account may not read the admission policy ", name,
                            " (403), so whether each agent is held to its own Node is unknown"),
               std::move(evidence),
               absl::StrCat("Add to the agent's ClusterRole (daemonset/base/agent/rbac.yaml ships it) the ", Rule(name),
                            "; or check as an administrator: `kubectl get validatingadmissionpolicy,"
                            "validatingadmissionpolicybinding ", name, "`."));
  }
  if (any(Outcome::kUnauthorized)) {
    return One(name, Result::kWarn,
               "the API server did not accept the credentials (401), so the admission policy could not be read",
               std::move(evidence),
               absl::StrCat("In the pod: the service account token is missing or expired; with --kubeconfig: its "
                            "user's credentials. The account needs the ", Rule(name), "."));
  }
  if (any(Outcome::kUnavailable)) {
    return One(name, Result::kSkip,
               absl::StrCat("not checked: the admission policy could not be read from the API server (",
                            policy.outcome == Outcome::kUnavailable ? policy.body : binding.body, ")"),
               std::move(evidence), "");
  }

  if (policy.outcome == Outcome::kAbsent) {
    return One(name, Result::kWarn,
               absl::StrCat("the admission policy ", name, " is not installed: ", kLost), std::move(evidence),
               InstallFix());
  }
  if (binding.outcome == Outcome::kAbsent) {
    return One(name, Result::kWarn,
               absl::StrCat("the admission policy ", name, " is installed but not bound (no "
                            "ValidatingAdmissionPolicyBinding ", name, "), so it holds nothing: ", kLost),
               std::move(evidence), InstallFix());
  }
  const Json bound = Json::parse(binding.body, nullptr, false);
  const std::string policy_name = Text(Field(bound, "spec"), "policyName", "");
  if (policy_name != name) {
    return One(name, Result::kWarn,
               absl::StrCat("the binding ", name, " binds policy \"", policy_name, "\", not ", name,
                            ", so the policy holds nothing: ", kLost),
               std::move(evidence), absl::StrCat("Set spec.policyName: ", name, " in the binding (", kPolicyFile, ")."));
  }
  const std::vector<std::string> actions = Actions(bound);
  if (std::find(actions.begin(), actions.end(), "Deny") == actions.end()) {
    return One(name, Result::kWarn,
               absl::StrCat("the binding ", name, " only ", actions.empty() ? "names no action" : "warns or audits",
                            " (validationActions [", absl::StrJoin(actions, ","), "]), so a write it rejects still "
                            "happens: ", kLost),
               std::move(evidence), absl::StrCat("Set validationActions: [Deny] in the binding (", kPolicyFile, ")."));
  }
  return One(name, Result::kPass,
             absl::StrCat("the admission policy ", name, " is installed and bound with Deny: each agent writes only "
                          "its own Node's GPUPassthroughReady condition and Events about that Node"),
             std::move(evidence), "");
}

}  // namespace vfio_agent::validation
