#include "vfio_gpu_agent/binding/holders.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <optional>
#include <string_view>
#include <set>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "vfio_gpu_agent/common/fs.h"

namespace vfio_agent::binding {
namespace {

namespace stdfs = std::filesystem;

constexpr std::array<const char*, 3> kGpuDaemons = {"nvidia-persistenced", "nv-fabricmanager", "nv-hostengine"};
// The kernel truncates comm to 15 characters ("nvidia-persiste").
constexpr size_t kCommLength = 15;

bool IsPid(const std::string& name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](unsigned char c) { return std::isdigit(c); });
}

std::vector<int> Pids(const stdfs::path& proc_root) {
  std::vector<int> pids;
  absl::StatusOr<std::vector<std::string>> entries = fs::ListDir(proc_root);
  if (!entries.ok()) return pids;
  for (const std::string& name : *entries) {
    int pid = 0;
    // from_chars, not stoi: a digit name beyond int (a fake or odd proc root) is skipped, never thrown.
    auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), pid);
    if (IsPid(name) && ec == std::errc() && end == name.data() + name.size()) pids.push_back(pid);
  }
  return pids;
}

std::string Comm(const stdfs::path& proc_root, int pid) {
  absl::StatusOr<std::string> comm = fs::ReadTrimmed(proc_root / std::to_string(pid) / "comm");
  return comm.ok() ? *comm : std::string("?");
}

// fd links name the opened file by its real path, so compare against both the root as given and its
// canonical form (the root may sit below a symlink, e.g. /tmp on some systems).
std::vector<std::string> PathForms(const stdfs::path& path) {
  std::error_code ec;
  std::vector<std::string> forms = {stdfs::absolute(path, ec).lexically_normal().string()};
  stdfs::path canonical = stdfs::weakly_canonical(path, ec);
  if (!ec && canonical.string() != forms[0]) forms.push_back(canonical.string());
  return forms;
}

std::vector<Holder> ModuleHolders(const stdfs::path& sysfs_root) {
  std::vector<Holder> holders;
  absl::StatusOr<std::vector<std::string>> modules = fs::ListDir(sysfs_root / "module");
  if (!modules.ok()) return holders;
  for (const std::string& module : *modules) {
    if (!absl::StartsWith(module, "nvidia")) continue;
    absl::StatusOr<int64_t> refcnt = fs::ReadInt(sysfs_root / "module" / module / "refcnt");
    if (!refcnt.ok() || *refcnt <= 0) continue;
    std::string what = absl::StrCat("module refcnt ", *refcnt);
    absl::StatusOr<std::vector<std::string>> users = fs::ListDir(sysfs_root / "module" / module / "holders");
    if (users.ok() && !users->empty()) absl::StrAppend(&what, " (used by ", absl::StrJoin(*users, ", "), ")");
    holders.push_back({0, module, what});
  }
  return holders;
}

}  // namespace

std::string Holder::ToString() const {
  if (pid == 0) return absl::StrCat("module ", comm, ": ", what);
  return absl::StrCat("pid ", pid, " (", comm, "): ", what);
}

std::vector<Holder> FindOpeners(const stdfs::path& proc_root, const std::function<bool(const std::string&)>& match) {
  std::vector<Holder> holders;
  for (int pid : Pids(proc_root)) {
    const stdfs::path fd_dir = proc_root / std::to_string(pid) / "fd";
    absl::StatusOr<std::vector<std::string>> fds = fs::ListDir(fd_dir);
    if (!fds.ok()) continue;
    std::set<std::string> seen;  // one line per opened file, however many fds point at it
    for (const std::string& fd : *fds) {
      std::error_code ec;
      const std::string target = stdfs::read_symlink(fd_dir / fd, ec).string();
      if (ec || !match(target) || !seen.insert(target).second) continue;
      holders.push_back({pid, Comm(proc_root, pid), absl::StrCat(target, " open")});
    }
  }
  return holders;
}

std::vector<Holder> NvidiaHolders(const HostPaths& paths) {
  std::vector<std::string> prefixes;
  for (const std::string& form : PathForms(paths.dev_root)) prefixes.push_back(form + "/nvidia");
  std::vector<Holder> holders = FindOpeners(paths.proc_root, [&](const std::string& target) {
    return std::any_of(prefixes.begin(), prefixes.end(),
                       [&](const std::string& prefix) { return absl::StartsWith(target, prefix); });
  });
  std::vector<Holder> modules = ModuleHolders(paths.sysfs_root);
  holders.insert(holders.end(), modules.begin(), modules.end());
  for (int pid : Pids(paths.proc_root)) {
    const std::string comm = Comm(paths.proc_root, pid);
    const bool known = absl::StartsWith(comm, "dcgm") ||
                       std::any_of(kGpuDaemons.begin(), kGpuDaemons.end(),
                                   [&](const char* daemon) { return comm == std::string(daemon).substr(0, kCommLength); });
    if (known) holders.push_back({pid, comm, "known GPU daemon"});
  }
  return holders;
}

std::vector<Holder> VfioGroupOpeners(const HostPaths& paths, int group) {
  const std::vector<std::string> forms = PathForms(paths.VfioDir() / std::to_string(group));
  return FindOpeners(paths.proc_root, [&](const std::string& target) {
    return std::find(forms.begin(), forms.end(), target) != forms.end();
  });
}

std::map<int, std::vector<Holder>> VfioGroupOpenersByGroup(const HostPaths& paths) {
  std::vector<std::string> prefixes;
  for (const std::string& form : PathForms(paths.VfioDir())) prefixes.push_back(form + "/");
  auto group_of = [&](std::string_view target) -> std::optional<int> {
    for (const std::string& prefix : prefixes) {
      if (!target.starts_with(prefix)) continue;
      const std::string_view name = target.substr(prefix.size());
      int group = 0;
      auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), group);
      if (!name.empty() && ec == std::errc() && end == name.data() + name.size()) return group;
    }
    return std::nullopt;
  };
  std::map<int, std::vector<Holder>> by_group;
  for (Holder& holder : FindOpeners(paths.proc_root, [&](const std::string& target) {
         return group_of(target).has_value();
       })) {
    // FindOpeners describes each holder as "<target> open".
    const std::string_view what = holder.what;
    if (std::optional<int> group = group_of(what.substr(0, what.rfind(" open")))) {
      by_group[*group].push_back(std::move(holder));
    }
  }
  return by_group;
}

}  // namespace vfio_agent::binding
