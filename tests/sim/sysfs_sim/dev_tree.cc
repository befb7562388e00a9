#include "dev_tree.h"

#include <fstream>
#include <set>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace vfio_agent::sim {
namespace fs = std::filesystem;

namespace {

std::set<std::string> Wanted(const KernelState& state) {
  std::set<std::string> want;
  if (state.iommu) want.insert("vfio/vfio");
  for (const auto& d : state.devices) {
    if (!d.present || d.driver.empty()) continue;
    if (IsVfioDriver(d.driver)) {
      want.insert(absl::StrCat("vfio/", d.spec.iommu_group));
      want.insert(absl::StrCat("vfio/devices/vfio", d.vfio_index));
    } else if (d.driver == "nvidia" && d.nvidia_index >= 0) {
      want.insert("nvidiactl");
      want.insert(absl::StrCat(IsNvSwitch(d.spec) ? "nvidia-nvswitch" : "nvidia", d.nvidia_index));
    }
  }
  return want;
}

bool Managed(const std::string& relative) {
  return absl::StartsWith(relative, "vfio/") || absl::StartsWith(relative, "nvidia");
}

}  // namespace

absl::Status SyncDevTree(const KernelState& state, const fs::path& dev_root) {
  std::error_code ec;
  const std::set<std::string> want = Wanted(state);
  std::set<std::string> have;
  for (const auto& e : fs::directory_iterator(dev_root, ec)) {
    if (e.is_regular_file()) have.insert(e.path().filename().string());
  }
  for (const char* sub : {"vfio", "vfio/devices"}) {
    for (const auto& e : fs::directory_iterator(dev_root / sub, ec)) {
      if (e.is_regular_file()) have.insert(absl::StrCat(sub, "/", e.path().filename().string()));
    }
  }
  for (const auto& name : have) {
    if (Managed(name) && !want.count(name) && !fs::remove(dev_root / name, ec) && ec) {
      return absl::InternalError(absl::StrCat("remove ", (dev_root / name).string(), ": ", ec.message()));
    }
  }
  if (state.iommu) fs::create_directories(dev_root / "vfio/devices", ec);
  for (const auto& name : want) {
    if (have.count(name)) continue;
    fs::create_directories((dev_root / name).parent_path(), ec);
    std::ofstream create(dev_root / name);
    if (!create) return absl::InternalError(absl::StrCat("create ", (dev_root / name).string()));
  }
  return absl::OkStatus();
}

}  // namespace vfio_agent::sim
