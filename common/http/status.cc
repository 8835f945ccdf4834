#include "common/http/status.h"

#include <array>

namespace clusterprof::http {
namespace {

struct Reason {
  int code;
  std::string_view phrase;
};

// RFC 9110 names, and the two that Google's APIs send beside them (308, 499).
constexpr std::array kReasons = {
    Reason{100, "Continue"},
    Reason{101, "Switching Protocols"},
    Reason{200, "OK"},
    Reason{201, "Created"},
    Reason{202, "Accepted"},
    Reason{204, "No Content"},
    Reason{206, "Partial Content"},
    Reason{301, "Moved Permanently"},
    Reason{302, "Found"},
    Reason{304, "Not Modified"},
    Reason{307, "Temporary Redirect"},
    Reason{308, "Resume Incomplete"},  // GCS resumable uploads (RFC 9110: Permanent Redirect)
    Reason{400, "Bad Request"},
    Reason{401, "Unauthorized"},
    Reason{403, "Forbidden"},
    Reason{404, "Not Found"},
    Reason{405, "Method Not Allowed"},
    Reason{406, "Not Acceptable"},
    Reason{408, "Request Timeout"},
    Reason{409, "Conflict"},
    Reason{410, "Gone"},
    Reason{411, "Length Required"},
    Reason{412, "Precondition Failed"},
    Reason{413, "Content Too Large"},
    Reason{415, "Unsupported Media Type"},
    Reason{416, "Range Not Satisfiable"},
    Reason{422, "Unprocessable Entity"},
    Reason{429, "Too Many Requests"},
    Reason{499, "Client Closed Request"},
    Reason{500, "Internal Server Error"},
    Reason{501, "Not Implemented"},
    Reason{502, "Bad Gateway"},
    Reason{503, "Service Unavailable"},
    Reason{504, "Gateway Timeout"},
};

struct Mapping {
  int http_code;
  absl::StatusCode code;
};

// The common mapping (as Google's APIs and gRPC's HTTP mapping read these codes). Every 5xx not
// overridden is Unavailable; any other code is Unknown (kOAuth: FailedPrecondition).
constexpr std::array kGenericCodes = {
    Mapping{400, absl::StatusCode::kInvalidArgument},
    Mapping{401, absl::StatusCode::kUnauthenticated},
    Mapping{403, absl::StatusCode::kPermissionDenied},
    Mapping{404, absl::StatusCode::kNotFound},
    Mapping{408, absl::StatusCode::kDeadlineExceeded},
    Mapping{409, absl::StatusCode::kAborted},
    Mapping{410, absl::StatusCode::kNotFound},
    Mapping{412, absl::StatusCode::kFailedPrecondition},
    Mapping{416, absl::StatusCode::kOutOfRange},
    Mapping{422, absl::StatusCode::kInvalidArgument},
    Mapping{429, absl::StatusCode::kResourceExhausted},
    Mapping{499, absl::StatusCode::kCancelled},
};

struct Override {
  Api api;
  int http_code;
  absl::StatusCode code;
};

// Where an API gives a code its own meaning (the reasons are in status.h, at Api).
constexpr std::array kOverrides = {
    Override{Api::kKubernetes, 410, absl::StatusCode::kOutOfRange},
    Override{Api::kKubernetes, 500, absl::StatusCode::kInternal},
    Override{Api::kGcs, 409, absl::StatusCode::kAlreadyExists},
    Override{Api::kOAuth, 400, absl::StatusCode::kUnauthenticated},
};

}  // namespace

std::string_view ReasonPhrase(int code) {
  for (const Reason& reason : kReasons) {
    if (reason.code == code) return reason.phrase;
  }
  if (code >= 500) return "Server Error";
  if (code >= 400) return "Client Error";
  if (code >= 300) return "Redirection";
  if (code >= 200) return "Success";
  return "Informational";
}

absl::StatusCode StatusCodeFor(int http_code, Api api) {
  for (const Override& entry : kOverrides) {
    if (entry.api == api && entry.http_code == http_code) return entry.code;
  }
  for (const Mapping& entry : kGenericCodes) {
    if (entry.http_code == http_code) return entry.code;
  }
  if (http_code >= 500) return absl::StatusCode::kUnavailable;
  return api == Api::kOAuth ? absl::StatusCode::kFailedPrecondition : absl::StatusCode::kUnknown;
}

}  // namespace clusterprof::http
