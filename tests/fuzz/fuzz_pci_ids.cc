// pci.ids loader (the vendor filter in front of libpci and libpci's parser) and the names built from it.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fuzz_input_file.h"
#include "vfio_gpu_agent/names/resource_names.h"

using namespace vfio_agent;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::InputFile input(data, size);
  auto db = names::LoadPciIds(input.path());
  if (!db.ok()) return 0;
  // Ids from the input's first bytes plus the ones the seeds name, so lookups hit the parsed entries.
  const uint16_t kDevices[] = {0x2335, 0x2330, 0x26b9, 0x2236, 0x1eb8, 0x0000, 0xffff};
  std::vector<std::pair<uint16_t, uint16_t>> ids;
  for (uint16_t device : kDevices) ids.emplace_back(0x10de, device);
  if (size >= 4) ids.emplace_back(static_cast<uint16_t>(data[0] << 8 | data[1]), static_cast<uint16_t>(data[2] << 8 | data[3]));
  for (const auto& [vendor, device] : ids) {
    auto name = (*db)->DeviceName(vendor, device);
    if (!name) continue;
    std::string slug = names::Slug(*name);
    (void)names::ValidateResourceNamePart(slug);
  }
  names::NameResolver resolver(db->get(), "nvidia.com", {});
  auto resolved = resolver.Resolve(ids);
  std::set<std::string> distinct;
  for (const auto& [key, name] : resolved) {
    // The resolver promises valid names, one per device id, whatever pci.ids says.
    if (!names::ValidateExtendedResourceName(name.resource_name).ok()) std::abort();
    if (!distinct.insert(name.resource_name).second) std::abort();
  }
  return 0;
}
