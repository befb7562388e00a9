// Where the names tests read their inputs: the checked-in pci.ids snapshots and override files
// (tests/names/testdata) and the machine's own pci.ids from Debian's pciutils.
#pragma once

#include <filesystem>

namespace vfio_agent::names::testdata {

inline const std::filesystem::path kDir = VA_NAMES_TESTDATA;
inline const std::filesystem::path kDebianPciIds = "/usr/share/misc/pci.ids";

}  // namespace vfio_agent::names::testdata
