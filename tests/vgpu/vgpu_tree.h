// vGPU additions to a SysfsTree (support/sysfs_tree.h), laid down as the kernel and NVIDIA's vGPU manager show
// them: mdev parents and instances, and the nvidia/ attributes of SR-IOV vGPU functions. Local to the vGPU and
// plugin tests until the shared tree builder has them.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/sysfs_tree.h"

namespace vfio_agent::testing::vgpu_tree {

namespace stdfs = std::filesystem;

inline void Write(const stdfs::path& path, const std::string& content) {
  stdfs::create_directories(path.parent_path());
  std::ofstream(path) << content;
}

inline void RelativeLink(const stdfs::path& target, const stdfs::path& link) {
  stdfs::create_directories(link.parent_path());
  stdfs::remove(link);
  stdfs::create_symlink(target.lexically_relative(link.parent_path()), link);
}

struct TypeSpec {
  std::string id;    // "nvidia-222"
  std::string name;  // "GRID T4-1Q"
  int available = 16;
};

// class/mdev_bus/<bdf> -> the device, with mdev_supported_types/<id>/{name,available_instances,create}.
inline void AddMdevParent(SysfsTree& tree, const std::string& bdf, const std::vector<TypeSpec>& types) {
  const stdfs::path dir = tree.DeviceDir(bdf);
  for (const TypeSpec& type : types) {
    const stdfs::path type_dir = dir / "mdev_supported_types" / type.id;
    Write(type_dir / "name", type.name + "\n");
    Write(type_dir / "available_instances", std::to_string(type.available) + "\n");
    Write(type_dir / "create", "");
  }
  RelativeLink(dir, tree.root() / "class/mdev_bus" / bdf);
}

// <parent dir>/<uuid> with mdev_type and iommu_group links; bus/mdev/devices/<uuid> -> it; and the group.
inline void AddMdev(SysfsTree& tree, const std::string& uuid, const std::string& parent_bdf,
                    const std::string& type_id, int group) {
  const stdfs::path dir = tree.DeviceDir(parent_bdf) / uuid;
  stdfs::create_directories(dir);
  RelativeLink(tree.DeviceDir(parent_bdf) / "mdev_supported_types" / type_id, dir / "mdev_type");
  const stdfs::path group_dir = tree.root() / "kernel/iommu_groups" / std::to_string(group);
  RelativeLink(dir, group_dir / "devices" / uuid);
  RelativeLink(group_dir, dir / "iommu_group");
  RelativeLink(dir, tree.root() / "bus/mdev/devices" / uuid);
}

// What `remove` does: the instance and its links go.
inline void RemoveMdev(SysfsTree& tree, const std::string& uuid, const std::string& parent_bdf) {
  stdfs::remove(tree.root() / "bus/mdev/devices" / uuid);
  stdfs::remove_all(tree.DeviceDir(parent_bdf) / uuid);
}

inline void SetVgpuType(SysfsTree& tree, const std::string& bdf, const std::string& content) {
  Write(tree.DeviceDir(bdf) / "nvidia/current_vgpu_type", content);
}

inline void SetCreatableTypes(SysfsTree& tree, const std::string& bdf, const std::string& content) {
  Write(tree.DeviceDir(bdf) / "nvidia/creatable_vgpu_types", content);
}

inline void SetDriverVersion(SysfsTree& tree, const std::string& version) {
  Write(tree.root() / "module/nvidia/version", version + "\n");
}

}  // namespace vfio_agent::testing::vgpu_tree
