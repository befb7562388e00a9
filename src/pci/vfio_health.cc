#include "vfio_gpu_agent/pci/vfio_health.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "vfio_gpu_agent/common/fs.h"

namespace vfio_agent::pci {

std::string VfioUnhealthyReason(const HostPaths& paths, const Function& fn, const GroupAssessment* group,
                                bool iommufd) {
  if (!IsVfioDriver(fn.driver)) {
    return fn.driver.empty() ? "no driver" : absl::StrCat("driver ", fn.driver);
  }
  if (!fn.iommu_group) return "no IOMMU group";
  if (std::string missing = MissingVfioNode(paths, *fn.iommu_group, fn.vfio_cdevs, iommufd); !missing.empty()) {
    return missing;
  }
  // vfio-pci parks an idle device in D3cold; a config read would wake it (seconds of power-up per GPU, on
  // every rescan). Its state is known without one: bound, group node present, vfio wakes it on open.
  absl::StatusOr<std::string> power = fs::ReadTrimmed(paths.PciDevice(fn.bdf) / "power_state");
  if (power.ok() && *power == "D3cold") return "";
  absl::StatusOr<uint16_t> vendor = ReadConfigVendor(paths, fn.bdf);
  if (!vendor.ok()) return absl::StrCat("config space unreadable: ", vendor.status().message());
  if (*vendor == 0xffff) return "config space reads 0xffff (device off the bus)";
  if (group == nullptr || !group->viable) {
    std::string reason = absl::StrCat("IOMMU group ", *fn.iommu_group, " not viable");
    if (group != nullptr && !group->blockers.empty()) absl::StrAppend(&reason, ": ", group->blockers.front());
    return reason;
  }
  return "";
}

std::string MissingVfioNode(const HostPaths& paths, int group, const std::vector<std::string>& cdevs, bool iommufd) {
  const std::filesystem::path group_node = paths.VfioDir() / std::to_string(group);
  if (fs::Exists(group_node)) return "";
  if (iommufd && !cdevs.empty() && std::all_of(cdevs.begin(), cdevs.end(), [&](const std::string& cdev) {
        return fs::Exists(paths.VfioDir() / "devices" / cdev);
      })) {
    return "";
  }
  return absl::StrCat("no ", group_node.string());
}

absl::StatusOr<uint16_t> ReadConfigVendor(const HostPaths& paths, const std::string& bdf) {
  const std::filesystem::path config = paths.PciDevice(bdf) / "config";
  int fd = ::open(config.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fs::ErrnoStatus(errno, "open", config);
  unsigned char bytes[2] = {0, 0};
  ssize_t n = ::pread(fd, bytes, sizeof bytes, 0);
  int err = errno;
  ::close(fd);
  if (n < 0) return fs::ErrnoStatus(err, "read", config);
  if (n < 2) return absl::UnavailableError(absl::StrCat("short read of ", config.string()));
  return static_cast<uint16_t>(bytes[0] | (bytes[1] << 8));
}

}  // namespace vfio_agent::pci
