// HTTP status codes in one place: their reason phrases, and the absl::StatusCode an HTTP error
// answer becomes. Every client (Kubernetes API, GCS JSON API, OAuth token endpoints) and every
// test server uses these, so a 410 means the same thing wherever it is read, and where an API
// gives a code its own meaning the exception is written down once, in status.cc's table.
#ifndef CLUSTERPROF_COMMON_HTTP_STATUS_H_
#define CLUSTERPROF_COMMON_HTTP_STATUS_H_

#include <string_view>

#include "absl/status/status.h"

namespace clusterprof::http {

// "Not Found" for 404. A code the table does not know gets its class: "Client Error",
// "Server Error", "Success", "Redirection" or "Informational".
std::string_view ReasonPhrase(int code);

// Whose answer it is: the few codes that differ between APIs are overridden per API.
enum class Api {
  kGeneric,
  // The Kubernetes API server: 410 Gone is an expired resourceVersion (OutOfRange: relist), 409
  // is a Conflict (Aborted: read again and retry; kube::ApiError turns reason AlreadyExists into
  // AlreadyExists), 500 is Internal.
  kKubernetes,
  // The GCS JSON API: 410 is an upload session that is gone (NotFound: start again), 409 an
  // object that exists, and every 5xx is retried (Unavailable), as Google's retry strategy asks.
  kGcs,
  // OAuth 2.0 token endpoints: 400 (invalid_grant, invalid_client) and 401 are credentials
  // that do not work (Unauthenticated); a code the table does not list is FailedPrecondition.
  kOAuth,
};

// The code for an HTTP error answer (4xx, 5xx). Unavailable, DeadlineExceeded and
// ResourceExhausted are the retryable ones.
absl::StatusCode StatusCodeFor(int http_code, Api api = Api::kGeneric);

}  // namespace clusterprof::http

#endif  // CLUSTERPROF_COMMON_HTTP_STATUS_H_
