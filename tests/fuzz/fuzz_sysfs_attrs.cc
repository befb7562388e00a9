// Every parser of a sysfs attribute or address the scan reads: hex ids and class, decimal numa_node and group
// names, modalias, link targets (driver, iommu_group, physfn), BDFs and class prefix lists.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "attr_parsers.h"
#include "device_reader.h"
#include "vfio_gpu_agent/pci/inventory.h"
#include "vfio_gpu_agent/pci/selection.h"

using namespace vfio_agent;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)pci::internal::ParseHex(text);
  (void)pci::internal::ParseDecimal(text);
  pci::Function fn;
  if (pci::internal::ParseModalias(text, &fn) && text.size() < 4) std::abort();
  std::string base = pci::internal::LinkBasename(text);
  if (base.find('/') != std::string::npos && base != "/") std::abort();
  auto bdf = pci::CanonicalBdf(text);
  // A canonical BDF is a fixed point of CanonicalBdf and passes the scan's allocation-free check.
  if (bdf.ok()) {
    if (!pci::internal::IsCanonicalBdf(*bdf)) std::abort();
    auto again = pci::CanonicalBdf(*bdf);
    if (!again.ok() || *again != *bdf) std::abort();
  }
  if (pci::internal::IsCanonicalBdf(text)) {
    auto canonical = pci::CanonicalBdf(text);
    if (!canonical.ok() || *canonical != text) std::abort();
  }
  (void)pci::ParseClassPrefixes(text);
  return 0;
}
