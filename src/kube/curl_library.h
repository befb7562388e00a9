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
};

// libcurl.so.4, loaded and globally initialised once per process (thread-safe); never unloaded.
const absl::StatusOr<CurlLibrary>& Curl();

}  // namespace vfio_agent::kube
