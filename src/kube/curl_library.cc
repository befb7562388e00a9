#include "curl_library.h"

#include "absl/strings/str_cat.h"
#include "vfio_gpu_agent/common/runtime_library.h"

namespace vfio_agent::kube {
namespace {

absl::StatusOr<CurlLibrary> OpenCurl() {
  constexpr char kWhy[] = "cannot talk to the Kubernetes API: ";
  absl::StatusOr<RuntimeLibrary> library = RuntimeLibrary::Open("libcurl.so.4");
  if (!library.ok()) return absl::FailedPreconditionError(absl::StrCat(kWhy, library.status().message()));
  CurlLibrary curl{};
  library->Resolve(curl.easy_init, "curl_easy_init");
  library->Resolve(curl.easy_cleanup, "curl_easy_cleanup");
  library->Resolve(curl.easy_setopt, "curl_easy_setopt");
  library->Resolve(curl.easy_perform, "curl_easy_perform");
  library->Resolve(curl.easy_getinfo, "curl_easy_getinfo");
  library->Resolve(curl.easy_strerror, "curl_easy_strerror");
  library->Resolve(curl.slist_append, "curl_slist_append");
  library->Resolve(curl.slist_free_all, "curl_slist_free_all");
  library->Resolve(curl.multi_init, "curl_multi_init");
  library->Resolve(curl.multi_cleanup, "curl_multi_cleanup");
  library->Resolve(curl.multi_add_handle, "curl_multi_add_handle");
  library->Resolve(curl.multi_remove_handle, "curl_multi_remove_handle");
  library->Resolve(curl.multi_perform, "curl_multi_perform");
  library->Resolve(curl.multi_poll, "curl_multi_poll");
  library->Resolve(curl.multi_wakeup, "curl_multi_wakeup");
  library->Resolve(curl.multi_info_read, "curl_multi_info_read");
  decltype(&curl_global_init) global_init = nullptr;
  library->Resolve(global_init, "curl_global_init");
  if (absl::Status complete = library->Complete(); !complete.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(kWhy, complete.message()));
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
