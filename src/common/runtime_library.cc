#include "vfio_gpu_agent/common/runtime_library.h"

#include <dlfcn.h>

#include "absl/strings/str_cat.h"

namespace vfio_agent {

absl::StatusOr<RuntimeLibrary> RuntimeLibrary::Open(const char* soname) {
  void* handle = ::dlopen(soname, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) return absl::FailedPreconditionError(::dlerror());
  return RuntimeLibrary(handle, soname);
}

void* RuntimeLibrary::Symbol(const char* name) {
  void* symbol = ::dlsym(handle_, name);
  if (symbol == nullptr) absl::StrAppend(&missing_, missing_.empty() ? "" : ", ", name);
  return symbol;
}

absl::Status RuntimeLibrary::Complete() const {
  if (missing_.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(soname_, " lacks ", missing_));
}

}  // namespace vfio_agent
