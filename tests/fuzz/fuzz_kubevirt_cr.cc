// The KubeVirt CR reader (YAML or JSON from kubectl, one object or a List) and the pciVendorSelector parser.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "kubevirt_cr.h"

using namespace vfio_agent;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto cr = validation::ParseKubevirtCr(text);
  if (cr.ok()) {
    if (cr->objects < 1) std::abort();  // a parsed CR came from at least one KubeVirt object
    for (size_t i = 0; i < cr->pci_host_devices.size(); ++i) {
      if (cr->pci_host_devices[i].index != static_cast<int>(i)) std::abort();
      (void)validation::ParsePciVendorSelector(cr->pci_host_devices[i].pci_vendor_selector);
    }
  }
  (void)validation::ParsePciVendorSelector(text);
  return 0;
}
