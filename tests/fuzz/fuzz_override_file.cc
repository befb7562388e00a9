// --resource-name-file: one VID:DID=NAME per line, comments and blank lines.
#include <cstddef>
#include <cstdint>

#include "fuzz_input_file.h"
#include "vfio_gpu_agent/names/resource_names.h"

using namespace vfio_agent;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::InputFile input(data, size);
  auto overrides = names::LoadOverrideFile(input.path());
  if (!overrides.ok()) return 0;
  for (const auto& o : *overrides) {
    if (!names::ValidateResourceNamePart(o.name).ok()) {
      // Accepted overrides are accepted as written; the resolver fixes invalid ones, so only exercise it.
      names::NameResolver resolver(nullptr, "nvidia.com", *overrides);
      (void)resolver.Resolve({{o.vendor_id, o.device_id}});
    }
  }
  return 0;
}
