#include "curl_library.h"

#include <dlfcn.h>

#include <string>
#include <type_traits>

#include "absl/strings/str_cat.h"

namespace vfio_agent::kube {
namespace {

absl::StatusOr<CurlLibrary> OpenCurl() {
  constexpr const char* kLibrary = "libcurl.so.4";
  void* library = ::dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("cannot talk to the Kubernetes API: ", ::dlerror()));
  }
  CurlLibrary curl{};
  std::string missing;
  auto resolve = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(library, name));
    if (fn == nullptr) absl::StrAppend(&missing, missing.empty() ? "" : ", ", name);
  };
  resolve(curl.easy_init, "curl_easy_init");
  resolve(curl.easy_cleanup, "curl_easy_cleanup");
  resolve(curl.easy_setopt, "curl_easy_setopt");
  resolve(curl.easy_perform, "curl_easy_perform");
  resolve(curl.easy_getinfo, "curl_easy_getinfo");
  resolve(curl.easy_strerror, "curl_easy_strerror");
  resolve(curl.slist_append, "curl_slist_append");
  resolve(curl.slist_free_all, "curl_slist_free_all");
  decltype(&curl_global_init) global_init = nullptr;
  resolve(global_init, "curl_global_init");
  if (!missing.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("cannot talk to the Kubernetes API: ", kLibrary, " lacks ", missing));
  }
  // Not thread-safe itself; the static initialisation in Curl() runs it exactly once.
  if (CURLcode code = global_init(CURL_GLOBAL_DEFAULT); code != CURLE_OK) {
    return absl::FailedPreconditionError(absl::StrCat("curl_global_init failed: ", curl.easy_strerror(code)));
  }
  return curl;
}

}  // namespace

const absl::StatusOr<CurlLibrary>& Curl() {
  static const absl::StatusOr<CurlLibrary> opened = OpenCurl();
  return opened;
}

}  // namespace vfio_agent::kube
