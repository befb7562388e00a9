// Test support ("support/sysfs_tree.h", library va_test_support): a plain-directory sysfs tree with the
// kernel's PCI layout, built from one struct per device.
//
//   vfio_agent::testing::TempDir dir;
//   vfio_agent::testing::SysfsTree tree(dir.path());
//   tree.AddDevice({.bdf = "0000:3b:00.0", .device = 0x2335, .driver = "nvidia", .iommu_group = 12});
//   auto inventory = vfio_agent::pci::Scan(tree.root());
//
// Layout written (paths relative to root()):
//   devices/pci<dddd>:<bb>/[<parent BDF>/]<BDF>/   real device directory with the attribute files
//       vendor device subsystem_vendor subsystem_device ("0x10de\n"), class ("0x030200\n"),
//       modalias ("pci:v000010DEd00002335sv000010DEsd000018BEbc03sc02i00\n"),
//       numa_node ("-1\n"), driver_override ("(null)\n"), config (64 bytes: ids, class, header type),
//       driver -> bus/pci/drivers/<name>, iommu_group -> kernel/iommu_groups/<n>, physfn -> <PF dir>,
//       virtfn<N> -> <VF dir> (on the PF), consumer:pci:<BDF> -> devices/virtual/devlink/pci:<sup>--pci:<con>,
//       supplier:pci:<BDF> (on a consumer that exists when its supplier is added), vfio-dev/<vfioN>/
//   bus/pci/devices/<BDF> -> devices/.../<BDF>        (all symlinks are relative, as in the kernel)
//   bus/pci/drivers/<name>/{bind,unbind,new_id,remove_id} and <BDF> -> device dir; bus/pci/{drivers_probe,rescan}
//   kernel/iommu_groups/<n>/devices/<BDF> -> device dir  (kernel/iommu_groups exists, empty, with IOMMU off)
// vGPU (the same files the FUSE simulator serves, see tests/sim/sysfs_sim/README.md):
//   class/mdev_bus/<parent BDF> -> device dir                         (AddMdevParent)
//   <parent>/mdev_supported_types/<type id>/{name, available_instances, device_api, description, create, devices/}
//   <parent>/<uuid>/{mdev_type -> type dir, iommu_group, driver -> bus/mdev/drivers/nvidia-vgpu-vfio,
//       subsystem -> bus/mdev, remove, uevent}; bus/mdev/devices/<uuid>, kernel/iommu_groups/<n>/devices/<uuid>,
//       <type dir>/devices/<uuid> -> the instance                  (AddMdev, RemoveMdev)
//   <dev>/nvidia/creatable_vgpu_types ("ID    : vGPU Name\n" then "<id padded to 6>: <name>\n" lines) and
//       <dev>/nvidia/current_vgpu_type ("0\n" or the id)             (SetVgpuCatalog, SetCurrentVgpuType)
//
// It is a plain tree: writing bind/unbind files does nothing. Use the FUSE simulator for kernel reactions.
// Builder failures mean the test itself is broken, so they print the path and abort instead of returning.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace vfio_agent::testing {

// A fresh directory under the system temp dir, removed with its content on destruction.
class TempDir {
 public:
  explicit TempDir(std::string_view prefix = "va-test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

struct FakePciDevice {
  std::string bdf{};  // canonical "0000:3b:00.0"
  uint16_t vendor = 0x10de;
  uint16_t device = 0x2335;
  uint16_t subsystem_vendor = 0x10de;
  uint16_t subsystem_device = 0x18be;
  uint32_t class_code = 0x030200;
  uint8_t header_type = 0;              // 1 for PCI-PCI bridges; config byte 0x0e
  bool multifunction = false;           // bit 7 of the header type byte
  std::optional<int> numa_node = -1;    // nullopt: no numa_node file
  std::string driver{};                   // "" unbound; the driver directory is created on demand
  std::string driver_override{};          // "" is written as "(null)"
  std::optional<int> iommu_group{};       // nullopt: no iommu_group link (IOMMU off)
  std::string parent{};                   // BDF of an upstream bridge added earlier; "" = on the root bus
  std::optional<std::string> physfn{};    // PF BDF (added earlier) when this is an SR-IOV VF
  std::vector<std::string> consumers{};   // device-link consumers: GPU -> its HDA/USB/UCSI functions
  std::vector<std::string> vfio_cdevs{};  // "vfio0", ... under vfio-dev/
  bool config = true;                   // false: no config file
  std::string reset_method = "flr bus";  // "": no reset method (the kernel then shows neither reset nor reset_method)
  bool modalias = true;                 // false: no modalias file (ids only in vendor, device, ...)
};

struct FakeMdevType {
  std::string id{};    // "nvidia-230"
  std::string name{};  // "GRID T4-1Q"
  int available_instances = 0;
  std::string description{};
};

struct FakeMdev {
  std::string uuid{};    // lower case, as the kernel names it
  std::string parent{};  // BDF passed to AddMdevParent before
  std::string type_id{};
  int iommu_group = 0;
};

struct FakeVgpuType {
  int id = 0;          // 1414
  std::string name{};  // "NVIDIA H200X-1-18C"
};

class SysfsTree {
 public:
  // Creates the skeleton (bus/pci/devices, bus/pci/drivers, kernel/iommu_groups, devices) under `root`.
  explicit SysfsTree(std::filesystem::path root);

  const std::filesystem::path& root() const { return root_; }

  void AddDevice(const FakePciDevice& device);
  // Creates bus/pci/drivers/<name> with its control files; AddDevice does this for the device's driver.
  void AddDriver(const std::string& name);
  // Moves the driver link and the driver's BDF link; "" leaves the device unbound.
  void BindDriver(const std::string& bdf, const std::string& driver);
  // Overwrites (or creates) an attribute file of a device, e.g. to write a malformed "vendor".
  // Writing or removing vendor, device, subsystem_* or class also removes modalias, which the kernel
  // derives from the same values: the tree never shows ids that disagree.
  void WriteAttribute(const std::string& bdf, const std::string& name, std::string_view content);
  void RemoveAttribute(const std::string& bdf, const std::string& name);
  // An mdev parent: the class/mdev_bus link and one directory per type, with the values given.
  void AddMdevParent(const std::string& bdf, const std::vector<FakeMdevType>& types);
  // An mdev instance on its parent, with its links on the mdev bus and in its IOMMU group.
  void AddMdev(const FakeMdev& mdev);
  void RemoveMdev(const std::string& uuid);
  // SR-IOV vGPU attributes under <dev>/nvidia/: the types creatable now (none = the header only, a full card)
  // and, for a VF, its current type (0 = no vGPU).
  void SetVgpuCatalog(const std::string& bdf, const std::vector<FakeVgpuType>& creatable);
  void SetCurrentVgpuType(const std::string& bdf, int type_id);
  // Absolute path of the device's real directory under devices/.
  std::filesystem::path DeviceDir(const std::string& bdf) const;

 private:
  // Both paths relative to root_; the link gets a relative target, like the kernel's.
  void Link(const std::filesystem::path& target, const std::filesystem::path& link) const;
  const std::filesystem::path& RelativeDir(const std::string& bdf) const;

  std::filesystem::path root_;
  std::map<std::string, std::filesystem::path> device_dirs_;  // BDF -> dir relative to root_
  std::map<std::string, int> vf_counts_;                      // PF BDF -> virtfn links so far
  std::map<std::string, FakeMdev> mdevs_;                     // uuid -> instance
};

}  // namespace vfio_agent::testing
