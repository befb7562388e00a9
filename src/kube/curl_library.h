// libcurl, opened on first use: linked, it would map about thirty shared libraries (nghttp2, idn2, gssapi,
// ldap, ssl, ...) into every start of the agent, which mostly runs without ever talking to the API.
#pragma once

#define CURL_DISABLE_TYPECHECK
#include <curl/curl.h>

#include "absl/status/statusor.h"

namespace vfio_agent::kube {

struct CurlLibrary {
  decltype(&curl_easy_init) easy_init;
  decltype(&curl_easy_cleanup) easy_cleanup;
  decltype(&curl_easy_setopt) easy_setopt;
  decltype(&curl_easy_perform) easy_perform;
  decltype(&curl_easy_getinfo) easy_getinfo;
  decltype(&curl_easy_strerror) easy_strerror;
  decltype(&curl_slist_append) slist_append;
  decltype(&curl_slist_free_all) slist_free_all;
  // The multi interface, for a watch: curl_easy_perform wakes every second while it waits (easy.c polls with a
  // 1000 ms timeout), multi_poll sleeps until data, a curl timer or multi_wakeup.
  decltype(&curl_multi_init) multi_init;
  decltype(&curl_multi_cleanup) multi_cleanup;
  decltype(&curl_multi_add_handle) multi_add_handle;
  decltype(&curl_multi_remove_handle) multi_remove_handle;
  decltype(&curl_multi_perform) multi_perform;
  decltype(&curl_multi_poll) multi_poll;
  decltype(&curl_multi_wakeup) multi_wakeup;
  decltype(&curl_multi_info_read) multi_info_read;
};

// libcurl.so.4, loaded and globally initialised once per process (thread-safe); never unloaded.
const absl::StatusOr<CurlLibrary>& Curl();

}  // namespace vfio_agent::kube
