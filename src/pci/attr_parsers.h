// The pure parsers behind the sysfs attribute reads of device_reader.cc, separate from the I/O so that
// tests/fuzz can feed them arbitrary bytes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "vfio_gpu_agent/pci/inventory.h"

namespace vfio_agent::pci::internal {

// "0x10de\n", "10de": hex attributes (vendor, device, class, subsystem_*); surrounding whitespace allowed.
std::optional<uint32_t> ParseHex(std::string_view text);

// "1\n", "-1": decimal attributes (numa_node) and group names.
std::optional<int> ParseDecimal(std::string_view text);

// "pci:v000010DEd00002335sv000010DEsd000018BEbc03sc02i00": the kernel prints it from the same config-space
// values as vendor, device, subsystem_* and class, so one read replaces five. Anything else is rejected
// (false, `fn` untouched) and the caller reads the individual files.
bool ParseModalias(std::string_view text, Function* fn);

// The last component of a link target ("../../../kernel/iommu_groups/73" -> "73"), trailing slashes ignored.
std::string LinkBasename(std::string_view target);

// std::string_view without surrounding ASCII whitespace (this abseil's string_view is not std's).
std::string_view TrimWhitespace(std::string_view text);

}  // namespace vfio_agent::pci::internal
