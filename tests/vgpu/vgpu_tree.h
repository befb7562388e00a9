// vGPU additions to a SysfsTree (support/sysfs_tree.h), laid down as the kernel and NVIDIA's vGPU manager show
// them: mdev parents and instances, and the nvidia/ attributes of SR-IOV vGPU functions as raw text (so a test can
// lay malformed or oddly spaced files).
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

struct TypeSpec {
  std::string id;    // "nvidia-222"
  std::string name;  // "GRID T4-1Q"
  int available = 16;
};

// The mdev layout is the shared tree builder's (SysfsTree::AddMdevParent/AddMdev/RemoveMdev, which the simulator
// test checks against sysfs-sim); these keep the vGPU tests' short call forms.
inline void AddMdevParent(SysfsTree& tree, const std::string& bdf, const std::vector<TypeSpec>& types) {
  std::vector<FakeMdevType> fakes;
  for (const TypeSpec& type : types) {
    fakes.push_back({.id = type.id, .name = type.name, .available_instances = type.available});
  }
  tree.AddMdevParent(bdf, fakes);
}

inline void AddMdev(SysfsTree& tree, const std::string& uuid, const std::string& parent_bdf,
                    const std::string& type_id, int group) {
  tree.AddMdev({.uuid = uuid, .parent = parent_bdf, .type_id = type_id, .iommu_group = group});
}

inline void RemoveMdev(SysfsTree& tree, const std::string& uuid) { tree.RemoveMdev(uuid); }

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
