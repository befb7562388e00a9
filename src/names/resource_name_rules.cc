// The character-level rules: the peer plugin's slug, the kubelet's extended-resource check (R2),
// KubeVirt's env name and Cozystack's pinned table.
#include <map>
#include <string>
#include <string_view>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "string_views.h"
#include "vfio_gpu_agent/names/resource_names.h"

namespace vfio_agent::names {
namespace {

// 253 for "requests." + domain, as the kubelet validates the quota form of the name.
constexpr size_t kMaxDomain = 253 - (sizeof("requests.") - 1);

// Go's regexp \s, which the peer uses to collapse whitespace runs.
bool IsGoSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\f' || c == '\r'; }

bool IsDnsLabelChar(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'; }

// KubeVirt's ResourceNameToEnvVar behind a prefix: upper-case, '/' and '.' -> '_', everything else kept.
std::string KubevirtEnvVar(std::string_view prefix, std::string_view resource_name) {
  std::string out(prefix);
  for (char c : resource_name) out.push_back(c == '/' || c == '.' ? '_' : absl::ascii_toupper(c));
  return out;
}

absl::Status ValidateDnsSubdomain(std::string_view domain) {
  if (domain.empty()) return absl::InvalidArgumentError("the domain is empty");
  if (domain.size() > kMaxDomain) {
    return absl::InvalidArgumentError(
        absl::StrCat("the domain is ", domain.size(), " characters, at most ", kMaxDomain, " allowed"));
  }
  size_t start = 0;
  while (start <= domain.size()) {
    size_t dot = domain.find('.', start);
    std::string_view label = domain.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start);
    if (label.empty() || label.front() == '-' || label.back() == '-') {
      return absl::InvalidArgumentError(absl::StrCat(
          "the domain \"", AsAbsl(domain),
          "\" is not a DNS-1123 subdomain (labels are non-empty, alphanumeric at both ends)"));
    }
    for (char c : label) {
      if (!IsDnsLabelChar(c)) {
        return absl::InvalidArgumentError(absl::StrCat("the domain \"", AsAbsl(domain),
                                                       "\" is not a lower-case DNS-1123 subdomain (bad character '",
                                                       std::string(1, c), "')"));
      }
    }
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return absl::OkStatus();
}

absl::Status Invalid(std::string_view resource_name, const absl::Status& why) {
  return absl::InvalidArgumentError(
      absl::StrCat("\"", AsAbsl(resource_name), "\" is not a valid extended resource name: ", why.message()));
}

}  // namespace

absl::Status ValidateResourceNamePart(std::string_view name) {
  if (name.empty()) return absl::InvalidArgumentError("the name part is empty");
  if (name.size() > kMaxResourceNamePart) {
    return absl::InvalidArgumentError(
        absl::StrCat("the name part is ", name.size(), " characters, at most ", kMaxResourceNamePart, " allowed"));
  }
  if (!absl::ascii_isalnum(name.front()) || !absl::ascii_isalnum(name.back())) {
    return absl::InvalidArgumentError("the name part must start and end with [A-Za-z0-9]");
  }
  for (char c : name) {
    if (!absl::ascii_isalnum(c) && c != '-' && c != '_' && c != '.') {
      return absl::InvalidArgumentError(
          absl::StrCat("the name part contains '", std::string(1, c), "' (only [-A-Za-z0-9_.] allowed)"));
    }
  }
  return absl::OkStatus();
}

std::string Slug(std::string_view pci_ids_name) {
  std::string_view trimmed = AsStd(absl::StripAsciiWhitespace(AsAbsl(pci_ids_name)));
  std::string out;
  out.reserve(trimmed.size());
  bool in_space = false;
  for (char c : trimmed) {
    if (IsGoSpace(c)) {
      if (!in_space) out.push_back('_');
      in_space = true;
      continue;
    }
    in_space = false;
    // '/' and '.' become '_' before the whitespace collapse in the peer, so " / " gives three '_'.
    if (c == '/' || c == '.' || c == '_') {
      out.push_back('_');
    } else if (absl::ascii_isalnum(c)) {
      out.push_back(absl::ascii_toupper(c));
    }
  }
  return out;
}

absl::Status ValidateResourceDomain(std::string_view domain) {
  if (absl::StrCat(AsAbsl(domain), "/").find("kubernetes.io/") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("resource domain \"", AsAbsl(domain), "\" is reserved for native resources (kubernetes.io)"));
  }
  if (domain.starts_with("requests.")) {
    return absl::InvalidArgumentError(
        absl::StrCat("resource domain \"", AsAbsl(domain), "\" starts with \"requests.\", reserved for quotas"));
  }
  if (absl::Status s = ValidateDnsSubdomain(domain); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("resource domain: ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status ValidateExtendedResourceName(std::string_view resource_name) {
  size_t slash = resource_name.find('/');
  if (slash == std::string_view::npos) {
    return Invalid(resource_name, absl::InvalidArgumentError("it has no domain (no '/')"));
  }
  if (resource_name.find("kubernetes.io/") != std::string_view::npos) {
    return Invalid(resource_name, absl::InvalidArgumentError("kubernetes.io/ is reserved for native resources"));
  }
  if (resource_name.starts_with("requests.")) {
    return Invalid(resource_name, absl::InvalidArgumentError("the prefix requests. is reserved for quotas"));
  }
  std::string_view domain = resource_name.substr(0, slash);
  std::string_view name = resource_name.substr(slash + 1);
  if (name.find('/') != std::string_view::npos) {
    return Invalid(resource_name, absl::InvalidArgumentError("it contains more than one '/'"));
  }
  if (absl::Status s = ValidateDnsSubdomain(domain); !s.ok()) return Invalid(resource_name, s);
  if (absl::Status s = ValidateResourceNamePart(name); !s.ok()) return Invalid(resource_name, s);
  return absl::OkStatus();
}

std::string KubevirtEnvName(std::string_view resource_name) { return KubevirtEnvVar("PCI_RESOURCE_", resource_name); }

std::string KubevirtMdevEnvName(std::string_view resource_name) {
  return KubevirtEnvVar("MDEV_PCI_RESOURCE_", resource_name);
}

absl::StatusOr<std::string> VgpuResourceName(std::string_view domain, std::string_view type_name) {
  std::string name;
  bool in_space = false;
  for (char c : type_name) {
    if (IsGoSpace(c)) {
      in_space = true;
      continue;
    }
    if (in_space && !name.empty()) name.push_back('_');
    in_space = false;
    name.push_back(c);
  }
  std::string resource_name = absl::StrCat(AsAbsl(domain), "/", name);
  if (absl::Status valid = ValidateExtendedResourceName(resource_name); !valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("vGPU type \"", AsAbsl(type_name), "\" gives no valid resource name: ", valid.message()));
  }
  return resource_name;
}

const std::map<uint16_t, std::string>& PinnedNames() {
  // Verbatim from Cozystack's gpu-passthrough-defaults.yaml (permittedHostDevices): these must not
  // change when the host's pci.ids is older (no 2335, 26b9) or spells a name differently (2330, 2321).
  static const auto* const kPinned = new std::map<uint16_t, std::string>{
      {0x2335, "GH100_H200_SXM_141GB"},
      {0x2330, "GH100_H100_SXM5_80GB"},
      {0x2331, "GH100_H100_PCIE"},
      {0x2321, "GH100_H100L_94GB"},
      {0x26b9, "AD102GL_L40S"},
      {0x26b5, "AD102GL_L40"},
      {0x27b8, "AD104GL_L4"},
      {0x20b2, "GA100_A100_SXM4_80GB"},
      {0x20b0, "GA100_A100_SXM4_40GB"},
      {0x20b5, "GA100_A100_PCIE_80GB"},
      {0x20f1, "GA100_A100_PCIE_40GB"},
      {0x20b7, "GA100GL_A30_PCIE"},
      {0x2235, "GA102GL_A40"},
      {0x2236, "GA102GL_A10"},
      {0x1eb8, "TU104GL_TESLA_T4"},
      {0x1db1, "GV100GL_TESLA_V100_SXM2_16GB"},
      {0x1db5, "GV100GL_TESLA_V100_SXM2_32GB"},
      {0x1db4, "GV100GL_TESLA_V100_PCIE_16GB"},
      {0x1df6, "GV100GL_TESLA_V100S_PCIE_32GB"},
  };
  return *kPinned;
}

const char* NameSourceName(NameSource source) {
  switch (source) {
    case NameSource::kOverride:
      return "override";
    case NameSource::kPinned:
      return "pinned";
    case NameSource::kPciIds:
      return "pci.ids";
    case NameSource::kDeviceId:
      return "device-id";
  }
  return "unknown";
}

}  // namespace vfio_agent::names
