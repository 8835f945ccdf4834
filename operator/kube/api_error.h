// Kubernetes API errors as absl::Status. The API server answers a failed request with a
// meta/v1 Status body ({"kind":"Status","reason":"Conflict","code":409,"message":...}); the client
// turns it into an absl::Status whose code follows the HTTP status and whose payload keeps the
// reason, the HTTP code and Retry-After, so callers can ask IsConflict(status) and the like.
#ifndef CLUSTERPROF_OPERATOR_KUBE_API_ERROR_H_
#define CLUSTERPROF_OPERATOR_KUBE_API_ERROR_H_

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace clusterprof::kube {

// What the API server said about a failed request.
struct ApiErrorInfo {
  int http_code = 0;
  // metav1.StatusReason: "NotFound", "AlreadyExists", "Conflict", "Forbidden", "Expired",
  // "Gone", "Invalid", "TooManyRequests", "InternalError", ... Empty when the body was not a
  // Status.
  std::string reason;
  // Seconds from the Retry-After header, or Status.details.retryAfterSeconds; -1 when absent.
  int retry_after_s = -1;
};

// The status for an HTTP error response: `http_code`, the response `body` (a Status object, or
// anything else the server or a proxy sent), the Retry-After header ("" when absent), and what
// was asked (`request`, e.g. "GET /api/v1/namespaces/x/pods/y") for the message. The code maps
// as client-go's errors do: 400 InvalidArgument, 401 Unauthenticated, 403 PermissionDenied,
// 404 NotFound, 409 AlreadyExists (reason AlreadyExists) or Aborted (Conflict), 410 OutOfRange
// (Expired/Gone: the resourceVersion is too old), 422 InvalidArgument, 429 ResourceExhausted,
// 500 Internal, 503/504 Unavailable, other 5xx Unavailable, others Unknown.
absl::Status ApiErrorFromResponse(int http_code, std::string_view body,
                                  std::string_view retry_after, std::string_view request);

// The metav1.StatusReason the API server gives with `http_code` ("NotFound", "Conflict",
// "Expired" for 410, ...): for answers that carry no Status (a proxy's), and for test servers.
std::string_view StatusReasonFor(int http_code);
// A meta/v1 Status body, as the API server sends with an error; `reason` empty: the one for
// the code; `retry_after_s` < 0: no details.retryAfterSeconds.
std::string StatusBody(int http_code, std::string_view reason, std::string_view message,
                       int retry_after_s = -1);

// The API error details of `status`, when it came from an API response.
std::optional<ApiErrorInfo> GetApiErrorInfo(const absl::Status& status);

// 404 and 409 AlreadyExists need no helpers of their own: absl::IsNotFound and
// absl::IsAlreadyExists say it, since the codes map one to one.
// 409 with reason Conflict: an update against a stale resourceVersion.
bool IsConflict(const absl::Status& status);
// 410: the resourceVersion asked for is older than the server keeps (relist).
bool IsGone(const absl::Status& status);
bool IsForbidden(const absl::Status& status);
bool IsUnauthorized(const absl::Status& status);
bool IsTooManyRequests(const absl::Status& status);
bool IsInvalid(const absl::Status& status);
// Worth retrying the same request later: 429, 5xx, and errors with no HTTP response at all
// (connection refused or reset, timeouts).
bool IsRetryable(const absl::Status& status);

}  // namespace clusterprof::kube

#endif  // CLUSTERPROF_OPERATOR_KUBE_API_ERROR_H_
