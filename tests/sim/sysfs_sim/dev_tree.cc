#include "dev_tree.h"

#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <set>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace vfio_agent::sim {
namespace fs = std::filesystem;

namespace {

bool VfioLoaded(const KernelState& state) {
  const auto& missing = state.platform.missing_modules;
  return VfioModuleLoaded(state) && std::find(missing.begin(), missing.end(), "vfio") == missing.end();
}

std::set<std::string> Wanted(const KernelState& state) {
  std::set<std::string> want;
  // The vfio module creates its container node whether or not an IOMMU is on.
  if (VfioLoaded(state)) want.insert("vfio/vfio");
  if (state.iommu && state.platform.iommufd) want.insert("iommu");
  for (const auto& d : state.devices) {
    if (!d.present || d.driver.empty()) continue;
    // A VF with a vGPU type is a VFIO device of the nvidia driver itself (vendor-specific VFIO framework).
    if (IsVfioDriver(d.driver) || d.vgpu_type != 0) {
      want.insert(absl::StrCat("vfio/", d.spec.iommu_group));
      want.insert(absl::StrCat("vfio/devices/vfio", d.vfio_index));
    } else if (d.driver == "nvidia" && d.nvidia_index >= 0) {
      want.insert("nvidiactl");
      want.insert(absl::StrCat(IsNvSwitch(d.spec) ? "nvidia-nvswitch" : "nvidia", d.nvidia_index));
    }
  }
  for (const auto& mdev : state.mdevs) want.insert(absl::StrCat("vfio/", mdev.iommu_group));
  return want;
}

bool Managed(const std::string& relative) {
  return absl::StartsWith(relative, "vfio/") || absl::StartsWith(relative, "nvidia") || relative == "iommu";
}

// Character devices like the kernel's, all with the numbers of /dev/null (1:3) so that a test can hold one open
// as a VM or a CUDA process would. Without the privilege to mknod (not root), an empty regular file stands in.
bool CreateNode(const std::filesystem::path& path) {
  if (::mknod(path.c_str(), S_IFCHR | 0600, makedev(1, 3)) == 0) return true;
  if (errno != EPERM && errno != EACCES) return false;
  std::ofstream create(path);
  return static_cast<bool>(create);
}

bool IsNode(const std::filesystem::directory_entry& e) { return e.is_character_file() || e.is_regular_file(); }

}  // namespace

absl::Status SyncDevTree(const KernelState& state, const fs::path& dev_root) {
  std::error_code ec;
  const std::set<std::string> want = Wanted(state);
  std::set<std::string> have;
  for (const auto& e : fs::directory_iterator(dev_root, ec)) {
    if (IsNode(e)) have.insert(e.path().filename().string());
  }
  for (const char* sub : {"vfio", "vfio/devices"}) {
    for (const auto& e : fs::directory_iterator(dev_root / sub, ec)) {
      if (IsNode(e)) have.insert(absl::StrCat(sub, "/", e.path().filename().string()));
    }
  }
  for (const auto& name : have) {
    if (Managed(name) && !want.count(name) && !fs::remove(dev_root / name, ec) && ec) {
      return absl::InternalError(absl::StrCat("remove ", (dev_root / name).string(), ": ", ec.message()));
    }
  }
  if (VfioLoaded(state)) fs::create_directories(dev_root / "vfio/devices", ec);
  for (const auto& name : want) {
    if (have.count(name)) continue;
    fs::create_directories((dev_root / name).parent_path(), ec);
    if (!CreateNode(dev_root / name)) return absl::InternalError(absl::StrCat("create ", (dev_root / name).string()));
  }
  return absl::OkStatus();
}

absl::Status WriteProcFiles(const PlatformSpec& platform, const fs::path& proc_root) {
  std::error_code ec;
  fs::create_directories(proc_root, ec);
  std::string cpuinfo;
  for (int cpu = 0; cpu < 2; ++cpu) {
    absl::StrAppend(&cpuinfo, "processor\t: ", cpu, "\nvendor_id\t: ", platform.amd ? "AuthenticAMD" : "GenuineIntel",
                    "\nmodel name\t: simulated CPU\naddress sizes\t: ", platform.phys_bits,
                    " bits physical, 57 bits virtual\n\n");
  }
  for (const auto& [name, content] : {std::pair<const char*, std::string>{"cmdline", platform.cmdline + "\n"},
                                      {"cpuinfo", cpuinfo}}) {
    std::ofstream out(proc_root / name, std::ios::trunc);
    out << content;
    if (!out) return absl::InternalError(absl::StrCat("write ", (proc_root / name).string()));
  }
  return absl::OkStatus();
}

}  // namespace vfio_agent::sim
