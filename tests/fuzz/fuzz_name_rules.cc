// Name rules: slug, resource name validity, KubeVirt's env name, and --resource-name overrides resolved
// against the pinned table (collisions, invalid names).
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <cctype>
#include <cstdlib>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "vfio_gpu_agent/names/resource_names.h"

using namespace vfio_agent;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider input(data, size);
  std::string text = input.ConsumeRandomLengthString(256);
  std::string slug = names::Slug(text);
  for (char c : slug) {
    // Slug's contract: only [A-Za-z0-9_] survive.
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) std::abort();
  }
  (void)names::ValidateExtendedResourceName(text);
  (void)names::ValidateResourceNamePart(text);
  (void)names::ValidateResourceDomain(text);
  (void)names::KubevirtEnvName(text);

  std::vector<names::NameOverride> overrides;
  while (input.remaining_bytes() > 0 && overrides.size() < 8) {
    auto parsed = names::ParseOverride(input.ConsumeRandomLengthString(64));
    if (parsed.ok()) overrides.push_back(*parsed);
  }
  std::vector<std::pair<uint16_t, uint16_t>> ids;
  for (const auto& o : overrides) ids.emplace_back(o.vendor_id, o.device_id);
  for (const auto& [device, name] : names::PinnedNames()) ids.emplace_back(0x10de, device);
  names::NameResolver resolver(nullptr, "nvidia.com", overrides);
  std::set<std::string> distinct;
  for (const auto& [key, name] : resolver.Resolve(ids)) {
    if (!names::ValidateExtendedResourceName(name.resource_name).ok()) std::abort();
    if (!distinct.insert(name.resource_name).second) std::abort();
  }
  return 0;
}
