#include "support/sysfs_tree.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <system_error>

#include "absl/strings/str_format.h"

namespace vfio_agent::testing {
namespace {

namespace stdfs = std::filesystem;

[[noreturn]] void Die(std::string_view what, const stdfs::path& path, std::string_view detail) {
  std::fprintf(stderr, "sysfs_tree: %.*s %s: %.*s\n", static_cast<int>(what.size()), what.data(), path.c_str(),
               static_cast<int>(detail.size()), detail.data());
  std::abort();
}

void CheckEc(const std::error_code& ec, std::string_view what, const stdfs::path& path) {
  if (ec) Die(what, path, ec.message());
}

void MakeDirs(const stdfs::path& dir) {
  std::error_code ec;
  stdfs::create_directories(dir, ec);
  CheckEc(ec, "mkdir", dir);
}

void WriteFile(const stdfs::path& path, std::string_view content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(content.data(), static_cast<std::streamsize>(content.size()));
  if (!out) Die("write", path, std::strerror(errno));
}

void RemoveIfPresent(const stdfs::path& path) {
  std::error_code ec;
  stdfs::remove(path, ec);
  CheckEc(ec, "remove", path);
}

std::string Hex(uint32_t value, int digits) { return absl::StrFormat("0x%0*x\n", digits, value); }

// The first 64 bytes of a type-0/1 configuration header, little-endian as on the wire.
std::string ConfigHeader(const FakePciDevice& d) {
  std::array<uint8_t, 64> c{};
  auto put16 = [&](size_t at, uint16_t v) {
    c[at] = static_cast<uint8_t>(v & 0xff);
    c[at + 1] = static_cast<uint8_t>(v >> 8);
  };
  put16(0x00, d.vendor);
  put16(0x02, d.device);
  c[0x09] = static_cast<uint8_t>(d.class_code & 0xff);
  c[0x0a] = static_cast<uint8_t>((d.class_code >> 8) & 0xff);
  c[0x0b] = static_cast<uint8_t>((d.class_code >> 16) & 0xff);
  c[0x0e] = static_cast<uint8_t>((d.header_type & 0x7f) | (d.multifunction ? 0x80 : 0));
  if (d.header_type == 0) {
    put16(0x2c, d.subsystem_vendor);
    put16(0x2e, d.subsystem_device);
  }
  return std::string(reinterpret_cast<const char*>(c.data()), c.size());
}

// As the kernel prints it: "pci:v000010DEd00002335sv000010DEsd000018BEbc03sc02i00".
std::string Modalias(const FakePciDevice& d) {
  return absl::StrFormat("pci:v%08Xd%08Xsv%08Xsd%08Xbc%02Xsc%02Xi%02X\n", d.vendor, d.device, d.subsystem_vendor,
                         d.subsystem_device, d.class_code >> 16, (d.class_code >> 8) & 0xff, d.class_code & 0xff);
}

// The kernel derives modalias from the same values as these files, so the two can never disagree.
bool FeedsModalias(std::string_view attribute) {
  return attribute == "vendor" || attribute == "device" || attribute == "subsystem_vendor" ||
         attribute == "subsystem_device" || attribute == "class";
}

}  // namespace

TempDir::TempDir(std::string_view prefix) {
  std::error_code ec;
  stdfs::path base = stdfs::temp_directory_path(ec);
  CheckEc(ec, "temp_directory_path", base);
  std::string templ = (base / (std::string(prefix) + "-XXXXXX")).string();
  if (::mkdtemp(templ.data()) == nullptr) Die("mkdtemp", templ, std::strerror(errno));
  path_ = templ;
}

TempDir::~TempDir() {
  std::error_code ec;
  stdfs::remove_all(path_, ec);
  // Visible rather than a silent leftover in /tmp (e.g. a simulator still mounted on it).
  if (ec) std::fprintf(stderr, "TempDir: cannot remove %s: %s\n", path_.c_str(), ec.message().c_str());
}

SysfsTree::SysfsTree(stdfs::path root) : root_(std::move(root)) {
  for (const char* dir : {"bus/pci/devices", "bus/pci/drivers", "kernel/iommu_groups", "devices/virtual/devlink"}) {
    MakeDirs(root_ / dir);
  }
  WriteFile(root_ / "bus/pci/drivers_probe", "");
  WriteFile(root_ / "bus/pci/rescan", "");
}

void SysfsTree::Link(const stdfs::path& target, const stdfs::path& link) const {
  std::error_code ec;
  stdfs::create_symlink(target.lexically_relative(link.parent_path()), root_ / link, ec);
  CheckEc(ec, "symlink", root_ / link);
}

const stdfs::path& SysfsTree::RelativeDir(const std::string& bdf) const {
  auto it = device_dirs_.find(bdf);
  if (it == device_dirs_.end()) Die("unknown device", root_, bdf);
  return it->second;
}

stdfs::path SysfsTree::DeviceDir(const std::string& bdf) const { return root_ / RelativeDir(bdf); }

void SysfsTree::AddDriver(const std::string& name) {
  const stdfs::path dir = root_ / "bus/pci/drivers" / name;
  if (stdfs::is_directory(dir)) return;
  MakeDirs(dir);
  for (const char* file : {"bind", "unbind", "new_id", "remove_id"}) WriteFile(dir / file, "");
}

void SysfsTree::AddDevice(const FakePciDevice& d) {
  if (device_dirs_.count(d.bdf) != 0) Die("duplicate device", root_, d.bdf);
  // The root bus directory is named after the domain and bus of the device ("pci0000:3b").
  const stdfs::path dir = d.parent.empty() ? stdfs::path("devices") / ("pci" + d.bdf.substr(0, 7)) / d.bdf
                                           : RelativeDir(d.parent) / d.bdf;
  device_dirs_[d.bdf] = dir;
  const stdfs::path abs = root_ / dir;
  MakeDirs(abs);
  WriteFile(abs / "vendor", Hex(d.vendor, 4));
  WriteFile(abs / "device", Hex(d.device, 4));
  WriteFile(abs / "subsystem_vendor", Hex(d.subsystem_vendor, 4));
  WriteFile(abs / "subsystem_device", Hex(d.subsystem_device, 4));
  WriteFile(abs / "class", Hex(d.class_code, 6));
  if (d.modalias) WriteFile(abs / "modalias", Modalias(d));
  WriteFile(abs / "driver_override", d.driver_override.empty() ? "(null)\n" : d.driver_override + "\n");
  if (d.numa_node) WriteFile(abs / "numa_node", absl::StrFormat("%d\n", *d.numa_node));
  if (d.config) WriteFile(abs / "config", ConfigHeader(d));
  if (!d.reset_method.empty()) {
    WriteFile(abs / "reset_method", d.reset_method + "\n");
    WriteFile(abs / "reset", "");
  }
  Link(dir, stdfs::path("bus/pci/devices") / d.bdf);

  if (d.iommu_group) {
    const stdfs::path group = stdfs::path("kernel/iommu_groups") / std::to_string(*d.iommu_group);
    MakeDirs(root_ / group / "devices");
    Link(group, dir / "iommu_group");
    Link(dir, group / "devices" / d.bdf);
  }
  if (d.physfn) {
    const stdfs::path& pf = RelativeDir(*d.physfn);
    Link(pf, dir / "physfn");
    Link(dir, pf / ("virtfn" + std::to_string(vf_counts_[*d.physfn]++)));
  }
  for (const std::string& consumer : d.consumers) {
    const stdfs::path devlink = stdfs::path("devices/virtual/devlink") / ("pci:" + d.bdf + "--pci:" + consumer);
    MakeDirs(root_ / devlink);
    Link(devlink, dir / ("consumer:pci:" + consumer));
    if (auto it = device_dirs_.find(consumer); it != device_dirs_.end()) {
      Link(devlink, it->second / ("supplier:pci:" + d.bdf));
    }
  }
  for (const std::string& cdev : d.vfio_cdevs) MakeDirs(abs / "vfio-dev" / cdev);
  if (!d.driver.empty()) BindDriver(d.bdf, d.driver);
}

void SysfsTree::BindDriver(const std::string& bdf, const std::string& driver) {
  const stdfs::path& dir = RelativeDir(bdf);
  std::error_code ec;
  const stdfs::path current = stdfs::read_symlink(root_ / dir / "driver", ec);
  if (!ec) {
    RemoveIfPresent(root_ / "bus/pci/drivers" / current.filename() / bdf);
    RemoveIfPresent(root_ / dir / "driver");
  }
  if (driver.empty()) return;
  AddDriver(driver);
  const stdfs::path driver_dir = stdfs::path("bus/pci/drivers") / driver;
  Link(driver_dir, dir / "driver");
  Link(dir, driver_dir / bdf);
}

void SysfsTree::AddMdevParent(const std::string& bdf, const std::vector<FakeMdevType>& types) {
  const stdfs::path& dir = RelativeDir(bdf);
  MakeDirs(root_ / "class/mdev_bus");
  Link(dir, stdfs::path("class/mdev_bus") / bdf);
  for (const FakeMdevType& type : types) {
    const stdfs::path type_dir = root_ / dir / "mdev_supported_types" / type.id;
    MakeDirs(type_dir / "devices");
    WriteFile(type_dir / "name", type.name + "\n");
    WriteFile(type_dir / "available_instances", absl::StrFormat("%d\n", type.available_instances));
    WriteFile(type_dir / "device_api", "vfio-pci\n");
    WriteFile(type_dir / "description", type.description + "\n");
    WriteFile(type_dir / "create", "");
  }
}

void SysfsTree::AddMdev(const FakeMdev& mdev) {
  if (!mdevs_.emplace(mdev.uuid, mdev).second) Die("duplicate mdev", root_, mdev.uuid);
  const stdfs::path parent = RelativeDir(mdev.parent);
  const stdfs::path dir = parent / mdev.uuid;
  const stdfs::path type_dir = parent / "mdev_supported_types" / mdev.type_id;
  const stdfs::path group = stdfs::path("kernel/iommu_groups") / std::to_string(mdev.iommu_group);
  const stdfs::path driver = "bus/mdev/drivers/nvidia-vgpu-vfio";
  for (const stdfs::path& d : {root_ / dir, root_ / group / "devices", root_ / "bus/mdev/devices", root_ / driver}) {
    MakeDirs(d);
  }
  Link(type_dir, dir / "mdev_type");
  Link(group, dir / "iommu_group");
  Link(driver, dir / "driver");
  Link("bus/mdev", dir / "subsystem");
  WriteFile(root_ / dir / "remove", "");
  WriteFile(root_ / dir / "uevent", "DRIVER=nvidia-vgpu-vfio\nMDEV_TYPE=" + mdev.type_id + "\n");
  Link(dir, type_dir / "devices" / mdev.uuid);
  Link(dir, stdfs::path("bus/mdev/devices") / mdev.uuid);
  Link(dir, group / "devices" / mdev.uuid);
}

void SysfsTree::RemoveMdev(const std::string& uuid) {
  auto it = mdevs_.find(uuid);
  if (it == mdevs_.end()) Die("unknown mdev", root_, uuid);
  const FakeMdev& mdev = it->second;
  const stdfs::path parent = root_ / RelativeDir(mdev.parent);
  std::error_code ec;
  stdfs::remove_all(parent / uuid, ec);
  CheckEc(ec, "remove", parent / uuid);
  RemoveIfPresent(parent / "mdev_supported_types" / mdev.type_id / "devices" / uuid);
  RemoveIfPresent(root_ / "bus/mdev/devices" / uuid);
  stdfs::remove_all(root_ / "kernel/iommu_groups" / std::to_string(mdev.iommu_group), ec);
  CheckEc(ec, "remove", root_ / "kernel/iommu_groups" / std::to_string(mdev.iommu_group));
  mdevs_.erase(it);
}

void SysfsTree::SetVgpuCatalog(const std::string& bdf, const std::vector<FakeVgpuType>& creatable) {
  std::string text = "ID    : vGPU Name\n";
  for (const FakeVgpuType& type : creatable) absl::StrAppendFormat(&text, "%-6d: %s\n", type.id, type.name);
  MakeDirs(DeviceDir(bdf) / "nvidia");
  WriteFile(DeviceDir(bdf) / "nvidia/creatable_vgpu_types", text);
}

void SysfsTree::SetCurrentVgpuType(const std::string& bdf, int type_id) {
  MakeDirs(DeviceDir(bdf) / "nvidia");
  WriteFile(DeviceDir(bdf) / "nvidia/current_vgpu_type", absl::StrFormat("%d\n", type_id));
}

void SysfsTree::WriteAttribute(const std::string& bdf, const std::string& name, std::string_view content) {
  const stdfs::path path = DeviceDir(bdf) / name;
  RemoveIfPresent(path);  // may be a symlink (driver, iommu_group) a test wants to replace with a file
  if (FeedsModalias(name)) RemoveIfPresent(DeviceDir(bdf) / "modalias");
  WriteFile(path, content);
}

void SysfsTree::RemoveAttribute(const std::string& bdf, const std::string& name) {
  if (FeedsModalias(name)) RemoveIfPresent(DeviceDir(bdf) / "modalias");
  RemoveIfPresent(DeviceDir(bdf) / name);
}

}  // namespace vfio_agent::testing
