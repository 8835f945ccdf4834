#include "operator/kube/api_error.h"

#include <charconv>

#include "absl/strings/cord.h"
#include "common/base/json_escape.h"
#include "common/base/strings.h"
#include "common/http/status.h"
#include "cpprest/json.h"

namespace clusterprof::kube {
namespace {

// The payload key under which an API error keeps its details: "<http code> <retry after>
// <reason>".
constexpr char kPayloadUrl[] = "type.clusterprof.io/kube.ApiError";

absl::StatusCode CodeFor(int http_code, std::string_view reason) {
  if (http_code == 409 && reason == "AlreadyExists") return absl::StatusCode::kAlreadyExists;
  return http::StatusCodeFor(http_code, http::Api::kKubernetes);
}

int ParseInt(std::string_view text, int fallback) {
  text = StripAsciiWhitespace(text);
  int value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value < 0) return fallback;
  return value;
}

bool HasCode(const absl::Status& status, int http_code) {
  const std::optional<ApiErrorInfo> info = GetApiErrorInfo(status);
  return info.has_value() && info->http_code == http_code;
}

}  // namespace

std::string_view StatusReasonFor(int http_code) {
  switch (http_code) {
    case 400:
      return "BadRequest";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "NotFound";
    case 405:
      return "MethodNotAllowed";
    case 409:
      return "Conflict";
    case 410:
      return "Expired";
    case 422:
      return "Invalid";
    case 429:
      return "TooManyRequests";
    case 500:
      return "InternalError";
    case 503:
      return "ServiceUnavailable";
    case 504:
      return "Timeout";
    default:
      return http_code >= 500 ? "InternalError" : http_code >= 400 ? "BadRequest" : "";
  }
}

std::string StatusBody(int http_code, std::string_view reason, std::string_view message,
                       int retry_after_s) {
  std::string body = R"({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",)"
                     R"("message":")";
  AppendJsonEscaped(message, &body);
  StrAppend(&body, R"(","reason":")", reason.empty() ? StatusReasonFor(http_code) : reason, "\"");
  if (retry_after_s >= 0) {
    StrAppend(&body, R"(,"details":{"retryAfterSeconds":)", retry_after_s, "}");
  }
  StrAppend(&body, R"(,"code":)", http_code, "}");
  return body;
}

absl::Status ApiErrorFromResponse(int http_code, std::string_view body,
                                  std::string_view retry_after, std::string_view request) {
  ApiErrorInfo info;
  info.http_code = http_code;
  info.retry_after_s = ParseInt(retry_after, -1);
  std::string message;
  try {
    std::error_code error;
    const web::json::value json = web::json::value::parse(std::string(body), error);
    if (!error && json.is_object() && json.has_string_field("kind") &&
        json.at("kind").as_string() == "Status") {
      if (json.has_string_field("reason")) info.reason = json.at("reason").as_string();
      if (json.has_string_field("message")) message = json.at("message").as_string();
      if (info.retry_after_s < 0 && json.has_object_field("details")) {
        const web::json::value& details = json.at("details");
        if (details.has_integer_field("retryAfterSeconds")) {
          info.retry_after_s = details.at("retryAfterSeconds").as_integer();
        }
      }
    }
  } catch (const std::exception&) {
    // Not a Status: keep the raw body as the message.
  }
  if (info.reason.empty()) info.reason = std::string(StatusReasonFor(http_code));
  if (message.empty()) {
    message = std::string(StripAsciiWhitespace(body.substr(0, 512)));
    if (message.empty()) message = "(empty response body)";
  }
  std::string text = StrCat(request, ": ", http_code);
  if (!info.reason.empty()) StrAppend(&text, " ", info.reason);
  StrAppend(&text, ": ", message);
  if (info.retry_after_s >= 0) StrAppend(&text, " (retry after ", info.retry_after_s, " s)");

  absl::Status status(CodeFor(http_code, info.reason), text);
  status.SetPayload(kPayloadUrl,
                    absl::Cord(StrCat(info.http_code, " ", info.retry_after_s, " ", info.reason)));
  return status;
}

std::optional<ApiErrorInfo> GetApiErrorInfo(const absl::Status& status) {
  const auto payload = status.GetPayload(kPayloadUrl);
  if (!payload.has_value()) return std::nullopt;
  const std::string text(*payload);
  const size_t first = text.find(' ');
  const size_t second = first == std::string::npos ? first : text.find(' ', first + 1);
  if (second == std::string::npos) return std::nullopt;
  ApiErrorInfo info;
  info.http_code = ParseInt(std::string_view(text).substr(0, first), 0);
  const std::string_view retry = std::string_view(text).substr(first + 1, second - first - 1);
  info.retry_after_s = retry == "-1" ? -1 : ParseInt(retry, -1);
  info.reason = text.substr(second + 1);
  return info;
}

bool IsConflict(const absl::Status& status) {
  return HasCode(status, 409) && GetApiErrorInfo(status)->reason != "AlreadyExists";
}
bool IsGone(const absl::Status& status) { return HasCode(status, 410); }
bool IsForbidden(const absl::Status& status) { return HasCode(status, 403); }
bool IsUnauthorized(const absl::Status& status) { return HasCode(status, 401); }
bool IsTooManyRequests(const absl::Status& status) { return HasCode(status, 429); }
bool IsInvalid(const absl::Status& status) { return HasCode(status, 422); }

bool IsRetryable(const absl::Status& status) {
  if (status.ok()) return false;
  const std::optional<ApiErrorInfo> info = GetApiErrorInfo(status);
  if (!info.has_value()) {
    // No HTTP response: the connection failed or timed out.
    return status.code() == absl::StatusCode::kUnavailable ||
           status.code() == absl::StatusCode::kDeadlineExceeded;
  }
  return info->http_code == 429 || (info->http_code >= 500 && info->http_code < 600);
}

}  // namespace clusterprof::kube
