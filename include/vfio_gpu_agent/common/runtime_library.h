// A system library opened when first needed rather than linked: the agent's start maps only what every run
// needs, and libraries used rarely (libkmod at most once per boot, libcurl only with a cluster API) are
// mapped by the code path that needs them. Opened once, never closed: as if it had been linked.
#pragma once

#include <string>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace vfio_agent {

class RuntimeLibrary {
 public:
  // dlopen(soname); the error names the library and dlerror()'s reason.
  static absl::StatusOr<RuntimeLibrary> Open(const char* soname);

  // Sets `fn` to the library's `name` (nullptr when absent; Complete() then names it).
  template <typename Fn>
    requires std::is_pointer_v<Fn>
  void Resolve(Fn& fn, const char* name) {
    fn = reinterpret_cast<Fn>(Symbol(name));
  }

  // OK when every Resolve found its symbol; otherwise FailedPrecondition naming the library and each missing one.
  absl::Status Complete() const;

 private:
  RuntimeLibrary(void* handle, std::string soname) : handle_(handle), soname_(std::move(soname)) {}
  void* Symbol(const char* name);

  void* handle_;
  std::string soname_;
  std::string missing_;
};

}  // namespace vfio_agent
