#include "driver_loader.h"

#include <libkmod.h>

#include <cstring>
#include <memory>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/binding/plan.h"
#include "vfio_gpu_agent/common/fs.h"
#include "vfio_gpu_agent/common/runtime_library.h"

namespace vfio_agent::binding {
namespace {

// A freshly inserted module registers its driver during init, but give sysfs a moment.
constexpr absl::Duration kRegisterWait = absl::Seconds(2);

std::string ImmutableHostHint(const std::string& module) {
  return absl::StrCat("; on hosts that cannot load modules at runtime (immutable OS such as Talos, or no ",
                      "/lib/modules mounted) the OS must load ", module, " at boot (machine config / modules-load.d)");
}

bool IsRunningKernelSysfs(const std::filesystem::path& sysfs_root) {
  std::error_code ec;
  return std::filesystem::equivalent(sysfs_root, "/sys", ec) && !ec;
}

// libkmod is opened only when a module must be inserted, which happens at most once per boot: linked, it
// would map libkmod and through it libcrypto, libzstd and liblzma into every start of the agent.
struct Kmod {
  decltype(&kmod_new) new_context;
  decltype(&kmod_unref) unref;
  decltype(&kmod_module_new_from_lookup) lookup;
  decltype(&kmod_list_next) list_next;
  decltype(&kmod_module_get_module) get_module;
  decltype(&kmod_module_probe_insert_module) probe_insert;
  decltype(&kmod_module_unref) module_unref;
  decltype(&kmod_module_unref_list) unref_list;
};

absl::StatusOr<Kmod> OpenKmod() {
  absl::StatusOr<RuntimeLibrary> library = RuntimeLibrary::Open("libkmod.so.2");
  if (!library.ok()) return absl::FailedPreconditionError(absl::StrCat("cannot load modules: ", library.status().message()));
  Kmod kmod{};
  library->Resolve(kmod.new_context, "kmod_new");
  library->Resolve(kmod.unref, "kmod_unref");
  library->Resolve(kmod.lookup, "kmod_module_new_from_lookup");
  library->Resolve(kmod.list_next, "kmod_list_next");
  library->Resolve(kmod.get_module, "kmod_module_get_module");
  library->Resolve(kmod.probe_insert, "kmod_module_probe_insert_module");
  library->Resolve(kmod.module_unref, "kmod_module_unref");
  library->Resolve(kmod.unref_list, "kmod_module_unref_list");
  if (absl::Status complete = library->Complete(); !complete.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("cannot load modules: ", complete.message()));
  }
  return kmod;
}

}  // namespace

absl::Status LoadModule(const std::filesystem::path& modules_dir, const std::string& module) {
  static const absl::StatusOr<Kmod> opened = OpenKmod();
  if (!opened.ok()) return opened.status();
  const Kmod& kmod = *opened;
  const std::string dir = modules_dir.string();
  std::unique_ptr<kmod_ctx, decltype(kmod.unref)> ctx(kmod.new_context(dir.c_str(), nullptr), kmod.unref);
  if (!ctx) return absl::InternalError(absl::StrCat("kmod_new(", dir, ") failed"));
  kmod_list* list = nullptr;
  int err = kmod.lookup(ctx.get(), module.c_str(), &list);
  if (err < 0 || list == nullptr) {
    return absl::NotFoundError(absl::StrCat("module ", module, " not found under ", dir));
  }
  absl::Status status;
  for (kmod_list* item = list; item != nullptr; item = kmod.list_next(list, item)) {
    kmod_module* mod = kmod.get_module(item);
    err = kmod.probe_insert(mod, KMOD_PROBE_APPLY_BLACKLIST, nullptr, nullptr, nullptr, nullptr);
    kmod.module_unref(mod);
    if (err < 0) {
      status = absl::FailedPreconditionError(
          absl::StrCat("loading module ", module, " from ", dir, " failed: ", std::strerror(-err)));
      break;
    }
    if (err > 0) {  // KMOD_PROBE_APPLY_BLACKLIST: the host's modprobe configuration blacklists it
      status = absl::FailedPreconditionError(absl::StrCat("module ", module, " is blacklisted on this host"));
      break;
    }
  }
  kmod.unref_list(list);
  return status;
}

absl::StatusOr<std::string> FindRegisteredDriver(const HostPaths& paths, const std::string& module) {
  absl::StatusOr<std::vector<std::string>> drivers = fs::ListDir(paths.PciDrivers());
  if (drivers.ok()) {
    for (const std::string& dir : *drivers) {
      if (SameDriver(dir, module)) return dir;
    }
  }
  return absl::NotFoundError(absl::StrCat("no PCI driver for module ", module, " under ", paths.PciDrivers().string()));
}

absl::StatusOr<std::string> EnsureDriverRegistered(const HostPaths& paths, const std::string& kernel_release,
                                                   const std::string& module) {
  absl::StatusOr<std::string> found = FindRegisteredDriver(paths, module);
  if (found.ok()) return found;
  if (!IsRunningKernelSysfs(paths.sysfs_root)) {
    return absl::FailedPreconditionError(absl::StrCat(
        found.status().message(), "; not loading modules into the running kernel for sysfs root ",
        paths.sysfs_root.string()));
  }
  const std::string release = kernel_release.empty() ? RunningKernelRelease() : kernel_release;
  spdlog::info("driver for {} not registered; loading the module from {}", module,
               (paths.modules_root / release).string());
  if (absl::Status loaded = LoadModule(paths.modules_root / release, module); !loaded.ok()) {
    return absl::Status(loaded.code(), absl::StrCat(loaded.message(), ImmutableHostHint(module)));
  }
  const absl::Time deadline = absl::Now() + kRegisterWait;
  while (true) {
    found = FindRegisteredDriver(paths, module);
    if (found.ok() || absl::Now() > deadline) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (!found.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("module ", module, " loaded but ", found.status().message()));
  }
  return found;
}

}  // namespace vfio_agent::binding
