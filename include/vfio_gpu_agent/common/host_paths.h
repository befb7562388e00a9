// Every path the agent touches on the host goes through one of these roots, so the same code runs
// against the real host, a temporary tree in a test, or the FUSE simulator.
#pragma once

#include <filesystem>

namespace vfio_agent {

struct HostPaths {
  std::filesystem::path sysfs_root = "/sys";
  std::filesystem::path dev_root = "/dev";
  std::filesystem::path proc_root = "/proc";
  std::filesystem::path kubelet_dir = "/var/lib/kubelet/device-plugins";
  std::filesystem::path pod_resources_socket = "/var/lib/kubelet/pod-resources/kubelet.sock";
  std::filesystem::path modules_root = "/lib/modules";

  std::filesystem::path PciDevices() const { return sysfs_root / "bus/pci/devices"; }
  std::filesystem::path PciDevice(const std::string& bdf) const { return PciDevices() / bdf; }
  std::filesystem::path PciDrivers() const { return sysfs_root / "bus/pci/drivers"; }
  std::filesystem::path PciDriver(const std::string& driver) const { return PciDrivers() / driver; }
  std::filesystem::path IommuGroups() const { return sysfs_root / "kernel/iommu_groups"; }
  std::filesystem::path VfioDir() const { return dev_root / "vfio"; }
};

}  // namespace vfio_agent
