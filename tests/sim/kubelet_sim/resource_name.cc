// R2: the kubelet's IsExtendedResourceName, checked in Register.
#include <string_view>

#include "kubelet_sim.h"

namespace vfio_agent::kubeletsim {
namespace {

bool IsAlnum(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }
bool IsLowerAlnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

// Lower-case RFC 1123 subdomain: dot-separated labels of [a-z0-9-], alphanumeric at both ends, <= 253 chars.
bool IsDns1123Subdomain(std::string_view s) {
  if (s.empty() || s.size() > 253) return false;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find('.', start);
    if (end == std::string_view::npos) end = s.size();
    const std::string_view label = s.substr(start, end - start);
    if (label.empty() || !IsLowerAlnum(label.front()) || !IsLowerAlnum(label.back())) return false;
    for (char c : label) {
      if (!IsLowerAlnum(c) && c != '-') return false;
    }
    start = end + 1;
  }
  return true;
}

// The name part of a qualified name: 1-63 chars, alphanumeric at both ends, [-A-Za-z0-9_.] inside.
bool IsQualifiedNamePart(std::string_view s) {
  if (s.empty() || s.size() > 63 || !IsAlnum(s.front()) || !IsAlnum(s.back())) return false;
  for (char c : s) {
    if (!IsAlnum(c) && c != '-' && c != '_' && c != '.') return false;
  }
  return true;
}

}  // namespace

bool IsExtendedResourceName(const std::string& name) {
  if (name.find('/') == std::string::npos) return false;           // not domain-qualified
  if (name.find("kubernetes.io/") != std::string::npos) return false;  // native resource namespace
  if (name.rfind("requests.", 0) == 0) return false;               // quota prefix
  const std::string qualified = "requests." + name;
  const size_t slash = qualified.find('/');
  if (qualified.find('/', slash + 1) != std::string::npos) return false;
  return IsDns1123Subdomain(std::string_view(qualified).substr(0, slash)) &&
         IsQualifiedNamePart(std::string_view(qualified).substr(slash + 1));
}

}  // namespace vfio_agent::kubeletsim
