#include "common/storage/gcs_credentials.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/escaping.h"
#include "common/base/check.h"
#include "common/base/env.h"
#include "common/base/json_escape.h"
#include "common/base/mutex.h"
#include "common/base/status.h"
#include "common/base/strings.h"
#include "common/http/status.h"
#include "common/http/transport.h"
#include "common/retry/backoff.h"
#include "cpprest/base_uri.h"
#include "cpprest/json.h"

namespace clusterprof::storage::gcs {
namespace {

constexpr char kJwtBearerGrant[] = "urn:ietf:params:oauth:grant-type:jwt-bearer";
constexpr char kAdcFileName[] = "application_default_credentials.json";
constexpr char kGcloudLogin[] = "gcloud auth application-default login";
constexpr char kDefaultTokenUri[] = "https://oauth2.googleapis.com/token";
// Google accepts assertions valid for at most an hour.
constexpr int64_t kJwtLifetimeSeconds = 3600;
constexpr char kMetadataTokenPath[] = "/computeMetadata/v1/instance/service-accounts/default/token";
constexpr char kMetadataEmailPath[] = "/computeMetadata/v1/instance/service-accounts/default/email";
// A token is refreshed when less than min(kMaxRefreshMarginNs, lifetime / 2) remains, and used
// (while refreshes fail) until min(kMaxExpiryMarginNs, lifetime / 4) before it expires: a request
// sent just before expiry must still reach GCS in time.
constexpr int64_t kMaxRefreshMarginNs = 5 * 60 * kNanosPerSecond;
constexpr int64_t kMaxExpiryMarginNs = 10 * kNanosPerSecond;
// After a failed refresh, how long the current token serves before the next refresh attempt.
constexpr int64_t kRefreshRetryNs = 10 * kNanosPerSecond;
// Service-account key files are about 2 KiB.
constexpr std::streamsize kMaxKeyFileBytes = 1 << 20;

constexpr char kNoCredentialsHelp[] =
    "Provide credentials in one of four ways: on a workstation, run `gcloud auth "
    "application-default login`; set GOOGLE_APPLICATION_CREDENTIALS to the path of a "
    "service-account JSON key file; run on GCE or GKE with a service account (on GKE, Workload "
    "Identity: the pod's Kubernetes service account bound to a Google service account), with "
    "GCE_METADATA_HOST naming the metadata server when it is not at 169.254.169.254; or set "
    "STORAGE_EMULATOR_HOST to use a GCS emulator without credentials";

std::string SecondsText(int64_t ns) {
  if (ns % kNanosPerSecond == 0) return StrCat(ns / kNanosPerSecond, " s");
  return StrCat(ns / kNanosPerMilli, " ms");
}

// --- HTTP -------------------------------------------------------------------------------------

struct HttpReply {
  int code = 0;
  std::string body;
  http::Response raw;
};

// What the credentials' requests go over: the options' transport, or cpprestsdk.
struct TransportRef {
  explicit TransportRef(const CredentialsOptions& options)
      : owned(options.transport != nullptr ? nullptr : http::NewCppRestTransport()),
        transport(options.transport != nullptr ? options.transport : owned.get()) {}
  std::unique_ptr<http::Transport> owned;
  http::Transport* transport;
};

// Sends `request` with `timeout_ns` and reads the whole reply. Transport failures (no HTTP
// answer) are DeadlineExceeded (timed out) or Unavailable.
absl::StatusOr<HttpReply> Exchange(http::Transport& transport, http::Request request,
                                   std::string_view server, int64_t timeout_ns) {
  request.timeout_ns = std::max<int64_t>(timeout_ns, 1);
  absl::StatusOr<http::Response> response = transport.Send(request);
  if (!response.ok()) {
    if (response.status().code() == absl::StatusCode::kDeadlineExceeded) {
      return absl::DeadlineExceededError(
          StrCat("no answer from ", server, " within ", SecondsText(timeout_ns)));
    }
    return absl::UnavailableError(
        StrCat("cannot reach ", server, ": ", response.status().message()));
  }
  HttpReply reply;
  reply.code = response->status;
  reply.body = response->body;
  reply.raw = std::move(*response);
  return reply;
}

// application/x-www-form-urlencoded value encoding.
std::string FormEncode(std::string_view value) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (const char c : value) {
    const auto byte = static_cast<unsigned char>(c);
    if (std::isalnum(byte) != 0 || c == '-' || c == '.' || c == '_' || c == '~') {
      out.push_back(c);
    } else {
      out.push_back('%');
      out.push_back(kHex[byte >> 4]);
      out.push_back(kHex[byte & 0xf]);
    }
  }
  return out;
}

bool IsRetryable(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status) ||
         absl::IsResourceExhausted(status);
}

// --- JSON -------------------------------------------------------------------------------------

absl::StatusOr<web::json::value> ParseJson(std::string_view text) {
  try {
    std::error_code error;
    web::json::value value = web::json::value::parse(std::string(text), error);
    if (error) return absl::InvalidArgumentError(error.message());
    return value;
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(e.what());
  }
}

// The string field `name` of `object`: nullopt when absent; an error when not a string.
absl::StatusOr<std::optional<std::string>> StringField(const web::json::value& object,
                                                       const std::string& name) {
  if (!object.is_object() || !object.has_field(name)) return std::optional<std::string>();
  const web::json::value& value = object.at(name);
  if (!value.is_string())
    return absl::InvalidArgumentError(StrCat("\"", name, "\" is not a string"));
  return std::optional<std::string>(value.as_string());
}

std::string Excerpt(std::string_view body) {
  std::string out(body.substr(0, 200));
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

// "400 invalid_grant: Invalid JWT Signature." from an OAuth error answer; the status and the
// start of the body for anything else. `error` receives the OAuth error code, if any.
std::string DescribeOAuthError(const HttpReply& reply, std::string* error) {
  absl::StatusOr<web::json::value> json = ParseJson(reply.body);
  if (json.ok() && json->is_object()) {
    absl::StatusOr<std::optional<std::string>> code = StringField(*json, "error");
    absl::StatusOr<std::optional<std::string>> description =
        StringField(*json, "error_description");
    if (code.ok() && code->has_value()) {
      *error = **code;
      std::string out = StrCat(reply.code, " ", **code);
      if (description.ok() && description->has_value()) StrAppend(&out, ": ", **description);
      return out;
    }
  }
  if (reply.body.empty()) return StrCat(reply.code);
  return StrCat(reply.code, ": ", Excerpt(reply.body));
}

struct FetchedToken {
  std::string access_token;
  int64_t lifetime_ns = 0;
  int64_t requested_ns = 0;  // monotonic, when the request that got it was sent
};

// {"access_token": ..., "expires_in": ..., "token_type": "Bearer"}.
absl::StatusOr<FetchedToken> ParseTokenResponse(std::string_view body) {
  absl::StatusOr<web::json::value> json = ParseJson(body);
  if (!json.ok()) {
    return absl::InternalError(
        StrCat("the token response is not JSON (", json.status().message(), "): ", Excerpt(body)));
  }
  FetchedToken token;
  absl::StatusOr<std::optional<std::string>> access_token = StringField(*json, "access_token");
  if (!access_token.ok() || !access_token->has_value() || (*access_token)->empty()) {
    return absl::InternalError(
        StrCat("the token response has no \"access_token\": ", Excerpt(body)));
  }
  token.access_token = **access_token;
  absl::StatusOr<std::optional<std::string>> type = StringField(*json, "token_type");
  if (type.ok() && type->has_value() && !(*type)->empty()) {
    std::string lower = **type;
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (lower != "bearer") {
      return absl::InternalError(
          StrCat("the token response has token_type \"", **type, "\", not \"Bearer\""));
    }
  }
  if (!json->has_field("expires_in") || !json->at("expires_in").is_number()) {
    return absl::InternalError(StrCat("the token response has no \"expires_in\": ", Excerpt(body)));
  }
  const double expires_in = json->at("expires_in").as_number().to_double();
  if (!(expires_in > 0) || expires_in > 366.0 * 24 * 3600) {
    return absl::InternalError(
        StrCat("the token response has \"expires_in\": ", expires_in, ", not a lifetime"));
  }
  token.lifetime_ns = static_cast<int64_t>(expires_in * kNanosPerSecond);
  return token;
}

// --- Retries ----------------------------------------------------------------------------------

// Retries with jittered exponential backoff, sleeping on the injected clock. Thread-safe.
class RetryLoop {
 public:
  explicit RetryLoop(const CredentialsOptions& options) : options_(options) {}

  // Runs `attempt` until it succeeds, fails in a way not worth retrying, or the attempts are
  // used up; `what` names it in logs and in the final error.
  template <typename Attempt>
  auto Run(std::string_view what, Attempt attempt) -> decltype(attempt()) {
    const int attempts = std::max(options_.max_attempts, 1);
    Backoff backoff({.initial_ns = std::max<int64_t>(options_.initial_backoff_ns, 0),
                     .max_ns = std::max<int64_t>(options_.max_backoff_ns, 0)});
    for (int i = 1;; ++i) {
      auto result = attempt();
      if (result.ok() || !IsRetryable(result.status())) return result;
      if (i >= attempts) {
        if (attempts == 1) return result;
        return absl::Status(result.status().code(),
                            StrCat(result.status().message(), " (", i, " attempts)"));
      }
      const int64_t sleep_ns = backoff.NextDelayNs();
      spdlog::warn("{} failed (attempt {} of {}), retrying in {} ms: {}", what, i, attempts,
                   sleep_ns / kNanosPerMilli, std::string(result.status().message()));
      options_.clock->SleepForNs(sleep_ns);
    }
  }

 private:
  const CredentialsOptions& options_;
};

// --- The token cache --------------------------------------------------------------------------

// Caches a token fetched by FetchOnce(), refreshes it before it expires, and lets one fetch run
// at a time: concurrent callers wait for it and share its result. Thread-safe.
class CachingCredentials : public Credentials {
 public:
  explicit CachingCredentials(const CredentialsOptions& options)
      : options_(options), retry_(options_) {
    CLUSTERPROF_CHECK(options_.clock != nullptr) << "CredentialsOptions.clock is required";
  }

  absl::StatusOr<std::string> AuthorizationHeader() final {
    Clock* const clock = options_.clock;
    mu_.Lock();
    uint64_t seen = completed_fetches_;
    while (true) {
      const int64_t now = clock->MonotonicNs();
      if (!token_.empty() && now < refresh_at_ns_) return HeaderAndUnlock();
      if (completed_fetches_ != seen) {
        // The fetch this caller waited for is over: its token, an older one that still serves,
        // or its error.
        if (!token_.empty() && now < usable_until_ns_) return HeaderAndUnlock();
        if (!last_fetch_error_.ok()) {
          absl::Status error = last_fetch_error_;
          mu_.Unlock();
          return error;
        }
        seen = completed_fetches_;  // it succeeded, and Invalidate() came since
      }
      if (!fetching_) break;
      // A refresh is under way; the current token still serves meanwhile.
      if (!token_.empty() && now < usable_until_ns_) return HeaderAndUnlock();
      mu_.Await([this, seen]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return completed_fetches_ != seen; });
    }
    fetching_ = true;
    mu_.Unlock();

    absl::StatusOr<FetchedToken> fetched =
        retry_.Run(StrCat("getting an access token for ", Identity()),
                   [this]() -> absl::StatusOr<FetchedToken> {
                     const int64_t requested_ns = options_.clock->MonotonicNs();
                     absl::StatusOr<FetchedToken> token = FetchOnce();
                     if (token.ok()) token->requested_ns = requested_ns;
                     return token;
                   });
    if (!fetched.ok()) fetched = ExplainFinalError(fetched.status());

    mu_.Lock();
    fetching_ = false;
    ++completed_fetches_;
    if (fetched.ok()) {
      const int64_t lifetime = fetched->lifetime_ns;
      const int64_t expires_at = fetched->requested_ns + lifetime;
      token_ = std::move(fetched->access_token);
      refresh_at_ns_ = expires_at - std::min(kMaxRefreshMarginNs, lifetime / 2);
      usable_until_ns_ = expires_at - std::min(kMaxExpiryMarginNs, lifetime / 4);
      last_fetch_error_ = absl::OkStatus();
      return HeaderAndUnlock();
    }
    last_fetch_error_ = fetched.status();
    if (const int64_t now = clock->MonotonicNs(); !token_.empty() && now < usable_until_ns_) {
      spdlog::warn(
          "refreshing the access token failed, the current one serves until it expires: {}",
          std::string(fetched.status().message()));
      // Callers meanwhile take the current token instead of each waiting on another refresh.
      refresh_at_ns_ = std::min(now + kRefreshRetryNs, usable_until_ns_);
      return HeaderAndUnlock();
    }
    mu_.Unlock();
    return fetched.status();
  }

  void Invalidate() final {
    MutexLock lock(&mu_);
    token_.clear();
  }

  int64_t token_fetches() const final { return token_fetches_.load(std::memory_order_relaxed); }

 protected:
  // One token request (or the requests leading to one). Unavailable, DeadlineExceeded and
  // ResourceExhausted errors are retried. Runs on one thread at a time.
  virtual absl::StatusOr<FetchedToken> FetchOnce() = 0;
  // Rewrites the error of a fetch that failed for good; the default keeps it.
  virtual absl::Status ExplainFinalError(const absl::Status& status) { return status; }

  void CountTokenRequest() { token_fetches_.fetch_add(1, std::memory_order_relaxed); }
  const CredentialsOptions& options() const { return options_; }

  // POSTs the form `body` (an OAuth grant) to `token_uri` and reads the token from the answer.
  // Errors start with `failed`; an OAuth error answer is followed by `advice(error)` (the OAuth
  // error code, "" when the answer has none), except for 5xx and 429, which are retried.
  absl::StatusOr<FetchedToken> PostGrant(
      http::Transport& transport, const std::string& token_uri, const std::string& body,
      const std::string& failed, const std::function<std::string(const std::string&)>& advice) {
    http::Request request;
    request.method = "POST";
    request.url = token_uri;
    request.headers.emplace_back("Accept", "application/json");
    request.body = body;  // refers to `body`, which outlives the request
    request.content_type = "application/x-www-form-urlencoded";
    CountTokenRequest();
    absl::StatusOr<HttpReply> reply =
        Exchange(transport, std::move(request), token_uri, options().request_timeout_ns);
    if (!reply.ok()) return Annotate(reply.status(), failed);
    if (reply->code != 200) {
      std::string error;
      const std::string described = DescribeOAuthError(*reply, &error);
      const std::string explained =
          reply->code >= 500 || reply->code == 429
              ? ". The token endpoint is overloaded or failing; this is retried"
              : advice(error);
      return absl::Status(
          clusterprof::http::StatusCodeFor(reply->code, clusterprof::http::Api::kOAuth),
          StrCat(failed, ": ", described, explained));
    }
    absl::StatusOr<FetchedToken> token = ParseTokenResponse(reply->body);
    if (!token.ok()) return Annotate(token.status(), failed);
    return token;
  }
  RetryLoop& retry() { return retry_; }

 private:
  absl::StatusOr<std::string> HeaderAndUnlock() ABSL_UNLOCK_FUNCTION(mu_) {
    std::string header = StrCat("Bearer ", token_);
    mu_.Unlock();
    return header;
  }

  const CredentialsOptions options_;
  RetryLoop retry_;
  std::atomic<int64_t> token_fetches_{0};

  Mutex mu_;
  std::string token_ ABSL_GUARDED_BY(mu_);  // empty: none, or invalidated
  // Monotonic instants: when to fetch a new token, and until when the current one may be sent.
  int64_t refresh_at_ns_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t usable_until_ns_ ABSL_GUARDED_BY(mu_) = 0;
  bool fetching_ ABSL_GUARDED_BY(mu_) = false;
  // Fetches finished so far, and the error of the last one (OK when it succeeded): callers that
  // waited for a fetch share its outcome instead of each trying again.
  uint64_t completed_fetches_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status last_fetch_error_ ABSL_GUARDED_BY(mu_);
};

// --- Anonymous --------------------------------------------------------------------------------

class AnonymousCredentialsImpl final : public Credentials {
 public:
  explicit AnonymousCredentialsImpl(std::string identity) : identity_(std::move(identity)) {}
  absl::StatusOr<std::string> AuthorizationHeader() override { return std::string(); }
  void Invalidate() override {}
  std::string Identity() override { return identity_; }
  int64_t token_fetches() const override { return 0; }

 private:
  const std::string identity_;
};

// --- Service-account keys ---------------------------------------------------------------------

struct PkeyFree {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;

// The OpenSSL error queue as text (and emptied).
std::string OpenSslErrors() {
  std::string out;
  while (const unsigned long error = ERR_get_error()) {
    char buffer[256];
    ERR_error_string_n(error, buffer, sizeof(buffer));
    StrAppend(&out, out.empty() ? "" : "; ", buffer);
  }
  return out.empty() ? "unknown OpenSSL error" : out;
}

absl::StatusOr<PkeyPtr> LoadRsaPrivateKey(std::string_view pem) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  if (bio == nullptr) return absl::ResourceExhaustedError("out of memory");
  PkeyPtr key(PEM_read_bio_PrivateKey(bio, nullptr, nullptr, nullptr));
  BIO_free(bio);
  if (key == nullptr) {
    return absl::InvalidArgumentError(StrCat("not a PEM private key (", OpenSslErrors(), ")"));
  }
  if (EVP_PKEY_base_id(key.get()) != EVP_PKEY_RSA) {
    return absl::InvalidArgumentError("not an RSA key (RS256 needs one)");
  }
  return key;
}

// RSASSA-PKCS1-v1_5 with SHA-256 over `data`.
absl::StatusOr<std::string> SignRs256(EVP_PKEY* key, std::string_view data) {
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> context(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (context == nullptr) return absl::ResourceExhaustedError("out of memory");
  size_t length = 0;
  const auto* bytes = reinterpret_cast<const unsigned char*>(data.data());
  if (EVP_DigestSignInit(context.get(), nullptr, EVP_sha256(), nullptr, key) != 1 ||
      EVP_DigestSign(context.get(), nullptr, &length, bytes, data.size()) != 1) {
    return absl::InternalError(StrCat("RS256 signing failed: ", OpenSslErrors()));
  }
  std::string signature(length, '\0');
  if (EVP_DigestSign(context.get(), reinterpret_cast<unsigned char*>(signature.data()), &length,
                     bytes, data.size()) != 1) {
    return absl::InternalError(StrCat("RS256 signing failed: ", OpenSslErrors()));
  }
  signature.resize(length);
  return signature;
}

std::string Base64Url(std::string_view data) { return absl::WebSafeBase64Escape(AbslView(data)); }

void AppendJsonStringMember(std::string* out, std::string_view name, std::string_view value) {
  StrAppend(out, out->size() > 1 ? "," : "", "\"", name, "\":\"");
  AppendJsonEscaped(value, out);
  out->push_back('"');
}

struct ServiceAccountKey {
  std::string source;  // the key file's path, or what stands for it
  std::string client_email;
  std::string private_key_id;
  std::string token_uri;
  std::string quota_project_id;
  PkeyPtr private_key;
};

// A token_uri that cpprestsdk can send to; `source` and `field` name it in the error.
absl::Status CheckTokenUri(std::string_view uri, std::string_view what) {
  try {
    const web::uri parsed{std::string(uri)};
    if ((parsed.scheme() != "https" && parsed.scheme() != "http") || parsed.host().empty()) {
      throw std::invalid_argument("not an http(s) URL");
    }
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        StrCat(what, ": field \"token_uri\" (\"", uri, "\") is not a URL: ", e.what()));
  }
  return absl::OkStatus();
}

absl::StatusOr<ServiceAccountKey> ParseServiceAccountKey(std::string_view json,
                                                         std::string_view source) {
  absl::StatusOr<web::json::value> parsed = ParseJson(json);
  if (!parsed.ok() || !parsed->is_object()) {
    return absl::InvalidArgumentError(
        StrCat("the key file ", source, " is not a JSON object",
               parsed.ok() ? std::string() : StrCat(" (", parsed.status().message(), ")"),
               ": expected a service-account key as created by `gcloud iam service-accounts keys "
               "create`"));
  }
  const auto field = [&](const std::string& name,
                         bool required) -> absl::StatusOr<std::optional<std::string>> {
    absl::StatusOr<std::optional<std::string>> value = StringField(*parsed, name);
    if (!value.ok()) {
      return absl::InvalidArgumentError(
          StrCat("the key file ", source, ": field \"", name, "\" is not a string"));
    }
    if (required && (!value->has_value() || (*value)->empty())) {
      return absl::InvalidArgumentError(
          StrCat("the key file ", source, " has no field \"", name,
                 "\": it is not a complete service-account key (create a new one with `gcloud iam "
                 "service-accounts keys create`)"));
    }
    return value;
  };
  CLUSTERPROF_ASSIGN_OR_RETURN(std::optional<std::string> type, field("type", true));
  if (*type != "service_account") {
    std::string hint;
    if (*type == "authorized_user") {
      hint = " (user credentials, as `gcloud auth application-default login` writes)";
    } else if (*type == "external_account") {
      hint = " (workload identity federation)";
    }
    return absl::InvalidArgumentError(StrCat(
        "the key file ", source, " has field \"type\": \"", *type, "\"", hint,
        "; only \"service_account\" keys are supported: create one with `gcloud iam "
        "service-accounts keys create`, or use the metadata server (Workload Identity on GKE) "
        "by leaving GOOGLE_APPLICATION_CREDENTIALS unset"));
  }
  ServiceAccountKey key;
  key.source = std::string(source);
  CLUSTERPROF_ASSIGN_OR_RETURN(std::optional<std::string> email, field("client_email", true));
  key.client_email = std::move(*email);
  CLUSTERPROF_ASSIGN_OR_RETURN(std::optional<std::string> pem, field("private_key", true));
  CLUSTERPROF_ASSIGN_OR_RETURN(std::optional<std::string> key_id, field("private_key_id", false));
  key.private_key_id = key_id.value_or("");
  CLUSTERPROF_ASSIGN_OR_RETURN(std::optional<std::string> token_uri, field("token_uri", false));
  key.token_uri = token_uri.has_value() && !token_uri->empty() ? *token_uri : kDefaultTokenUri;
  CLUSTERPROF_ASSIGN_OR_RETURN(std::optional<std::string> quota, field("quota_project_id", false));
  key.quota_project_id = quota.value_or("");
  absl::StatusOr<PkeyPtr> private_key = LoadRsaPrivateKey(*pem);
  if (!private_key.ok()) {
    return absl::InvalidArgumentError(StrCat("the key file ", source, ": field \"private_key\" is ",
                                             private_key.status().message()));
  }
  key.private_key = std::move(*private_key);
  CLUSTERPROF_RETURN_IF_ERROR(CheckTokenUri(key.token_uri, StrCat("the key file ", source)));
  return key;
}

// Exchanges JWTs signed by a service-account key for access tokens at the key's token_uri.
class ServiceAccountKeyCredentialsImpl final : public CachingCredentials {
 public:
  ServiceAccountKeyCredentialsImpl(ServiceAccountKey key, const CredentialsOptions& options)
      : CachingCredentials(options),
        key_(std::move(key)),
        identity_(StrCat("service account ", key_.client_email, " (key file ", key_.source, ")")),
        transport_(options) {}

  std::string Identity() override { return identity_; }
  std::string QuotaProject() override { return key_.quota_project_id; }

 protected:
  absl::StatusOr<FetchedToken> FetchOnce() override {
    const std::string failed =
        StrCat("cannot get an access token for ", identity_, " from ", key_.token_uri);
    absl::StatusOr<std::string> jwt = MakeJwt(options().clock->WallNs() / kNanosPerSecond);
    if (!jwt.ok()) return Annotate(jwt.status(), failed);
    const std::string body =
        StrCat("grant_type=", FormEncode(kJwtBearerGrant), "&assertion=", FormEncode(*jwt));
    return PostGrant(*transport_.transport, key_.token_uri, body, failed,
                     [this](const std::string& error) -> std::string {
                       if (error == "invalid_grant") {
                         return StrCat(". Check that the key file ", key_.source,
                                       " is current (keys can be revoked or deleted) and that "
                                       "this machine's clock is right (the JWT's iat and exp must "
                                       "bracket the server's time)");
                       }
                       if (error == "invalid_scope" || error == "unauthorized_client") {
                         return StrCat(". Check the scope \"", options().scope, "\"");
                       }
                       return StrCat(". Check the key file ", key_.source);
                     });
  }

 private:
  // header.claims.signature, base64url without padding, signed with RS256.
  absl::StatusOr<std::string> MakeJwt(int64_t now_s) const {
    std::string header = "{";
    AppendJsonStringMember(&header, "alg", "RS256");
    AppendJsonStringMember(&header, "typ", "JWT");
    if (!key_.private_key_id.empty()) AppendJsonStringMember(&header, "kid", key_.private_key_id);
    header.push_back('}');
    std::string claims = "{";
    AppendJsonStringMember(&claims, "iss", key_.client_email);
    AppendJsonStringMember(&claims, "scope", options().scope);
    AppendJsonStringMember(&claims, "aud", key_.token_uri);
    StrAppend(&claims, ",\"iat\":", now_s, ",\"exp\":", now_s + kJwtLifetimeSeconds, "}");
    std::string jwt = StrCat(Base64Url(header), ".", Base64Url(claims));
    CLUSTERPROF_ASSIGN_OR_RETURN(std::string signature, SignRs256(key_.private_key.get(), jwt));
    StrAppend(&jwt, ".", Base64Url(signature));
    return jwt;
  }

  const ServiceAccountKey key_;
  const std::string identity_;
  const TransportRef transport_;
};

// --- User credentials (gcloud auth application-default login) --------------------------------

struct AuthorizedUser {
  std::string source;  // the file's path, or what stands for it
  std::string client_id;
  std::string client_secret;
  std::string refresh_token;
  std::string quota_project_id;
  std::string token_uri;
};

absl::StatusOr<AuthorizedUser> ParseAuthorizedUser(const web::json::value& json,
                                                   std::string_view source) {
  const auto field = [&](const std::string& name, bool required) -> absl::StatusOr<std::string> {
    absl::StatusOr<std::optional<std::string>> value = StringField(json, name);
    if (!value.ok()) {
      return absl::InvalidArgumentError(
          StrCat("the credentials file ", source, ": field \"", name, "\" is not a string"));
    }
    if (required && (!value->has_value() || (*value)->empty())) {
      return absl::InvalidArgumentError(StrCat(
          "the credentials file ", source, " (type \"authorized_user\") has no field \"", name,
          "\": it is not complete user credentials; run `", kGcloudLogin, "` to write them again"));
    }
    return value->value_or("");
  };
  AuthorizedUser user;
  user.source = std::string(source);
  CLUSTERPROF_ASSIGN_OR_RETURN(user.client_id, field("client_id", true));
  CLUSTERPROF_ASSIGN_OR_RETURN(user.client_secret, field("client_secret", true));
  CLUSTERPROF_ASSIGN_OR_RETURN(user.refresh_token, field("refresh_token", true));
  CLUSTERPROF_ASSIGN_OR_RETURN(user.quota_project_id, field("quota_project_id", false));
  CLUSTERPROF_ASSIGN_OR_RETURN(user.token_uri, field("token_uri", false));
  if (user.token_uri.empty()) user.token_uri = kDefaultTokenUri;
  CLUSTERPROF_RETURN_IF_ERROR(
      CheckTokenUri(user.token_uri, StrCat("the credentials file ", source)));
  return user;
}

// Exchanges a user's refresh token for access tokens (RFC 6749 section 6). The token carries
// the scopes the user granted at login (cloud-platform, for gcloud's), so none is asked for.
class AuthorizedUserCredentialsImpl final : public CachingCredentials {
 public:
  AuthorizedUserCredentialsImpl(AuthorizedUser user, const CredentialsOptions& options)
      : CachingCredentials(options),
        user_(std::move(user)),
        identity_(StrCat("the user credentials in ", user_.source, " (", kGcloudLogin, ")")),
        transport_(options) {}

  std::string Identity() override { return identity_; }
  std::string QuotaProject() override { return user_.quota_project_id; }

 protected:
  absl::StatusOr<FetchedToken> FetchOnce() override {
    const std::string failed =
        StrCat("cannot get an access token for ", identity_, " from ", user_.token_uri);
    const std::string body =
        StrCat("grant_type=refresh_token&client_id=", FormEncode(user_.client_id),
               "&client_secret=", FormEncode(user_.client_secret),
               "&refresh_token=", FormEncode(user_.refresh_token));
    return PostGrant(
        *transport_.transport, user_.token_uri, body, failed,
        [this](const std::string& error) -> std::string {
          if (error == "invalid_grant") {
            return StrCat(". The refresh token in ", user_.source,
                          " has expired or was revoked (a password change, `gcloud auth "
                          "application-default revoke`, or the organization's session length "
                          "ends it): run `",
                          kGcloudLogin, "` to sign in again");
          }
          if (error == "invalid_client" || error == "unauthorized_client") {
            return StrCat(". The OAuth client ", user_.client_id, " in ", user_.source,
                          " is not accepted: run `", kGcloudLogin, "` to write the file again");
          }
          return StrCat(". Check ", user_.source, ", or run `", kGcloudLogin, "` again");
        });
  }

 private:
  const AuthorizedUser user_;
  const std::string identity_;
  const TransportRef transport_;
};

// --- The metadata server ----------------------------------------------------------------------

// Tokens of the instance's default service account from the GCE/GKE metadata server. Before the
// server first answers, requests go to its email endpoint with the short
// metadata_connect_timeout_ns: off GCE nothing answers at all, and that must not take long.
class MetadataServerCredentialsImpl final : public CachingCredentials {
 public:
  MetadataServerCredentialsImpl(std::string host, const CredentialsOptions& options)
      : CachingCredentials(options), host_(std::move(host)), transport_(options) {
    std::string_view address = host_;
    ConsumePrefix(&address, "http://");
    while (ConsumeSuffix(&address, "/")) {
    }
    base_uri_ = StrCat("http://", address);
    display_host_ = std::string(address);
    if (!web::uri::validate(base_uri_)) {
      setup_error_ = absl::InvalidArgumentError(
          StrCat("the metadata server address \"", host_, "\" is not usable: not a host[:port]"));
    }
  }

  std::string Identity() override {
    MutexLock lock(&mu_);
    return IdentityLocked();
  }

  // Asks for the account's email until the server answers (retrying as fetches do). A
  // NotFound "no Google Cloud credentials found" error when nothing answers.
  absl::Status Probe() {
    absl::StatusOr<std::string> email = retry().Run(
        StrCat("reaching the metadata server at ", display_host_), [this] { return ProbeOnce(); });
    if (email.ok()) return absl::OkStatus();
    if (Reached()) return email.status();
    return NoCredentials(absl::StatusCode::kNotFound, email.status());
  }

 protected:
  absl::StatusOr<FetchedToken> FetchOnce() override {
    if (!setup_error_.ok()) return setup_error_;
    if (!Reached()) {
      CLUSTERPROF_RETURN_IF_ERROR(ProbeOnce().status());
    }
    const std::string failed = StrCat("cannot get an access token for ", Identity());
    CountTokenRequest();
    absl::StatusOr<HttpReply> reply =
        Exchange(*transport_.transport, MetadataRequest(kMetadataTokenPath),
                 MetadataUri(kMetadataTokenPath), options().request_timeout_ns);
    if (!reply.ok()) return Annotate(reply.status(), failed);
    if (reply->code != 200) return MetadataError(*reply, failed);
    absl::StatusOr<FetchedToken> token = ParseTokenResponse(reply->body);
    if (!token.ok()) return Annotate(token.status(), failed);
    return token;
  }

  absl::Status ExplainFinalError(const absl::Status& status) override {
    // Nothing answered: most likely not on GCE at all.
    if (!Reached()) return NoCredentials(absl::StatusCode::kUnavailable, status);
    return status;
  }

 private:
  bool Reached() {
    MutexLock lock(&mu_);
    return reached_;
  }

  std::string IdentityLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (email_.empty()) {
      return StrCat("the default service account of the metadata server at ", display_host_,
                    " (Workload Identity)");
    }
    return StrCat(email_, " from the metadata server at ", display_host_, " (Workload Identity)");
  }

  std::string MetadataUri(std::string_view path) const { return StrCat(base_uri_, path); }

  http::Request MetadataRequest(std::string_view path) const {
    http::Request request;
    request.url = MetadataUri(path);
    request.headers.emplace_back("Metadata-Flavor", "Google");
    return request;
  }

  absl::Status NoCredentials(absl::StatusCode code, const absl::Status& cause) const {
    return absl::Status(
        code, StrCat("no Google Cloud credentials found: STORAGE_EMULATOR_HOST and "
                     "GOOGLE_APPLICATION_CREDENTIALS are not set, and no metadata server answered "
                     "at ",
                     display_host_, " (", cause.message(), "). ", kNoCredentialsHelp));
  }

  // An error answer of the metadata server, with what to do about it.
  absl::Status MetadataError(const HttpReply& reply, std::string_view failed) {
    std::string advice;
    if (reply.code == 404) {
      advice =
          ". The instance has no service account: on GKE, enable Workload Identity on the node "
          "pool and annotate the pod's Kubernetes service account with "
          "iam.gke.io/gcp-service-account=<Google service account email>; on GCE, attach a "
          "service account to the VM";
    } else if (reply.code == 403) {
      advice =
          ". The metadata server refused: on GKE, check that the Google service account allows "
          "the Kubernetes service account to impersonate it (roles/iam.workloadIdentityUser)";
    } else if (reply.code >= 500 || reply.code == 429) {
      advice = ". The metadata server is failing; this is retried";
    }
    const std::string body = reply.body.empty() ? std::string() : StrCat(": ", Excerpt(reply.body));
    return absl::Status(
        clusterprof::http::StatusCodeFor(reply.code, clusterprof::http::Api::kOAuth),
        StrCat(failed, ": ", reply.code, body, advice));
  }

  // GET .../email with the short timeout. Success marks the server reached and learns the email.
  absl::StatusOr<std::string> ProbeOnce() {
    if (!setup_error_.ok()) return setup_error_;
    absl::StatusOr<HttpReply> reply =
        Exchange(*transport_.transport, MetadataRequest(kMetadataEmailPath),
                 MetadataUri(kMetadataEmailPath), options().metadata_connect_timeout_ns);
    if (!reply.ok()) return reply.status();
    if (reply->raw.Header("Metadata-Flavor") != "Google") {
      return absl::FailedPreconditionError(
          StrCat(MetadataUri(kMetadataEmailPath), " answered ", reply->code,
                 " without the header Metadata-Flavor: Google: it is not a metadata server"));
    }
    MutexLock lock(&mu_);
    reached_ = true;
    if (reply->code != 200) {
      return MetadataError(*reply, StrCat("cannot get the email of ", IdentityLocked()));
    }
    email_ = std::string(StripAsciiWhitespace(reply->body));
    return email_;
  }

  const std::string host_;
  std::string base_uri_;      // http://host:port
  std::string display_host_;  // host:port
  absl::Status setup_error_;
  const TransportRef transport_;

  Mutex mu_;
  bool reached_ ABSL_GUARDED_BY(mu_) = false;
  std::string email_ ABSL_GUARDED_BY(mu_);
};

// `what` names the file in errors: "service-account key file", "credentials file".
absl::StatusOr<std::string> ReadKeyFile(std::string_view path,
                                        std::string_view what = "service-account key file") {
  std::ifstream in{std::string(path), std::ios::binary};
  if (!in) return ErrnoToStatus(errno, StrCat("cannot open the ", what), path);
  std::string data(static_cast<size_t>(kMaxKeyFileBytes) + 1, '\0');
  in.read(data.data(), static_cast<std::streamsize>(data.size()));
  if (in.bad()) return ErrnoToStatus(errno, StrCat("cannot read the ", what), path);
  if (in.gcount() > kMaxKeyFileBytes) {
    return absl::InvalidArgumentError(
        StrCat("the ", what, " ", path, " is over ", kMaxKeyFileBytes, " bytes: it is not one"));
  }
  data.resize(static_cast<size_t>(in.gcount()));
  return data;
}

// `getenv` with set-but-empty variables read as unset.
std::optional<std::string> NonEmptyEnv(const GetEnvFn& getenv, std::string_view name) {
  std::optional<std::string> value = getenv ? getenv(name) : GetEnv(name);
  if (value.has_value() && value->empty()) return std::nullopt;
  return value;
}

}  // namespace

std::string GcloudAdcFilePath(const GetEnvFn& getenv) {
  if (std::optional<std::string> config = NonEmptyEnv(getenv, "CLOUDSDK_CONFIG")) {
    return StrCat(*config, "/", kAdcFileName);
  }
  if (std::optional<std::string> home = NonEmptyEnv(getenv, "HOME")) {
    return StrCat(*home, "/.config/gcloud/", kAdcFileName);
  }
  return "";
}

absl::StatusOr<std::unique_ptr<Credentials>> DefaultCredentials(const CredentialsOptions& options) {
  CLUSTERPROF_CHECK(options.clock != nullptr) << "CredentialsOptions.clock is required";
  const auto env = [&](std::string_view name) { return NonEmptyEnv(options.getenv, name); };
  if (std::optional<std::string> emulator = env("STORAGE_EMULATOR_HOST")) {
    return AnonymousCredentials(StrCat("anonymous (STORAGE_EMULATOR_HOST=", *emulator, ")"));
  }
  if (std::optional<std::string> file = env("GOOGLE_APPLICATION_CREDENTIALS")) {
    absl::StatusOr<std::unique_ptr<Credentials>> credentials = CredentialsFromFile(*file, options);
    if (!credentials.ok()) {
      return Annotate(credentials.status(), StrCat("GOOGLE_APPLICATION_CREDENTIALS=", *file));
    }
    return credentials;
  }
  // gcloud's file, when it is there. A missing one is the usual case on a server, and so is a
  // HOME the process may not enter (a container running as another user than its image's):
  // neither is an error.
  const std::string adc_file = GcloudAdcFilePath(options.getenv);
  struct stat st;
  if (!adc_file.empty() && (stat(adc_file.c_str(), &st) == 0 ||
                            (errno != ENOENT && errno != ENOTDIR && errno != EACCES))) {
    absl::StatusOr<std::unique_ptr<Credentials>> credentials =
        CredentialsFromFile(adc_file, options);
    if (!credentials.ok()) {
      return Annotate(credentials.status(),
                      StrCat("the application-default credentials of `", kGcloudLogin, "`"));
    }
    return credentials;
  }
  auto metadata = std::make_unique<MetadataServerCredentialsImpl>(
      env("GCE_METADATA_HOST").value_or(kDefaultMetadataHost), options);
  if (absl::Status status = metadata->Probe(); !status.ok()) {
    if (absl::IsNotFound(status) && !adc_file.empty()) {
      return absl::NotFoundError(StrCat(status.message(), " (and there is no ", adc_file, ")"));
    }
    return status;
  }
  return metadata;
}

absl::StatusOr<std::unique_ptr<Credentials>> CredentialsFromFile(
    std::string_view path, const CredentialsOptions& options) {
  CLUSTERPROF_ASSIGN_OR_RETURN(std::string json, ReadKeyFile(path, "credentials file"));
  return CredentialsFromJson(json, path, options);
}

absl::StatusOr<std::unique_ptr<Credentials>> CredentialsFromJson(
    std::string_view json, std::string_view source_name, const CredentialsOptions& options) {
  absl::StatusOr<web::json::value> parsed = ParseJson(json);
  if (!parsed.ok() || !parsed->is_object()) {
    return absl::InvalidArgumentError(
        StrCat("the credentials file ", source_name, " is not a JSON object",
               parsed.ok() ? std::string() : StrCat(" (", parsed.status().message(), ")"),
               ": expected a service-account key (`gcloud iam service-accounts keys create`) or "
               "user credentials (`",
               kGcloudLogin, "`)"));
  }
  absl::StatusOr<std::optional<std::string>> type = StringField(*parsed, "type");
  const std::string type_name = type.ok() ? type->value_or("") : "";
  if (type_name == "service_account") {
    return ServiceAccountKeyCredentialsFromJson(json, source_name, options);
  }
  if (type_name == "authorized_user") {
    return AuthorizedUserCredentialsFromJson(json, source_name, options);
  }
  if (type_name == "external_account" || type_name == "impersonated_service_account" ||
      type_name == "external_account_authorized_user" || type_name == "gdch_service_account") {
    return absl::UnimplementedError(StrCat(
        "the credentials file ", source_name, " has \"type\": \"", type_name,
        "\", which clusterprof does not support; use a service-account key (\"service_account\"), "
        "user credentials from `",
        kGcloudLogin,
        "` (\"authorized_user\"), or the metadata "
        "server (Workload Identity on GKE) by leaving GOOGLE_APPLICATION_CREDENTIALS unset"));
  }
  return absl::InvalidArgumentError(
      StrCat("the credentials file ", source_name,
             type_name.empty() ? std::string(" has no \"type\"")
                               : StrCat(" has \"type\": \"", type_name, "\""),
             "; expected \"service_account\" (a key from `gcloud iam service-accounts keys "
             "create`) or \"authorized_user\" (from `",
             kGcloudLogin, "`)"));
}

absl::StatusOr<std::unique_ptr<Credentials>> AuthorizedUserCredentialsFromJson(
    std::string_view json, std::string_view source_name, const CredentialsOptions& options) {
  CLUSTERPROF_CHECK(options.clock != nullptr) << "CredentialsOptions.clock is required";
  absl::StatusOr<web::json::value> parsed = ParseJson(json);
  if (!parsed.ok() || !parsed->is_object()) {
    return absl::InvalidArgumentError(
        StrCat("the credentials file ", source_name, " is not a JSON object",
               parsed.ok() ? std::string() : StrCat(" (", parsed.status().message(), ")"),
               ": expected user credentials as `", kGcloudLogin, "` writes them"));
  }
  if (absl::StatusOr<std::optional<std::string>> type = StringField(*parsed, "type");
      !type.ok() || type->value_or("") != "authorized_user") {
    return absl::InvalidArgumentError(StrCat("the credentials file ", source_name,
                                             " does not have \"type\": \"authorized_user\""));
  }
  CLUSTERPROF_ASSIGN_OR_RETURN(AuthorizedUser user, ParseAuthorizedUser(*parsed, source_name));
  return std::make_unique<AuthorizedUserCredentialsImpl>(std::move(user), options);
}

std::unique_ptr<Credentials> AnonymousCredentials(std::string identity) {
  return std::make_unique<AnonymousCredentialsImpl>(std::move(identity));
}

absl::StatusOr<std::unique_ptr<Credentials>> ServiceAccountKeyCredentials(
    std::string_view key_file_path, const CredentialsOptions& options) {
  CLUSTERPROF_ASSIGN_OR_RETURN(std::string json, ReadKeyFile(key_file_path));
  return ServiceAccountKeyCredentialsFromJson(json, key_file_path, options);
}

absl::StatusOr<std::unique_ptr<Credentials>> ServiceAccountKeyCredentialsFromJson(
    std::string_view json, std::string_view source_name, const CredentialsOptions& options) {
  CLUSTERPROF_CHECK(options.clock != nullptr) << "CredentialsOptions.clock is required";
  CLUSTERPROF_ASSIGN_OR_RETURN(ServiceAccountKey key, ParseServiceAccountKey(json, source_name));
  return std::make_unique<ServiceAccountKeyCredentialsImpl>(std::move(key), options);
}

std::unique_ptr<Credentials> MetadataServerCredentials(std::string host,
                                                       const CredentialsOptions& options) {
  return std::make_unique<MetadataServerCredentialsImpl>(std::move(host), options);
}

}  // namespace clusterprof::storage::gcs
