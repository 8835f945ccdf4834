// Google Cloud credentials for the gs:// storage backend: the Authorization header of GCS
// requests, from an emulator setting, a credentials file (a service-account key, or the user
// credentials `gcloud auth application-default login` writes), or the GCE/GKE metadata server.
//
// DefaultCredentials() picks the first source that applies, in the order of Google's
// Application Default Credentials (https://cloud.google.com/docs/authentication/
// application-default-credentials), after an emulator:
//   1. STORAGE_EMULATOR_HOST set: anonymous access (no Authorization header), for emulators.
//   2. GOOGLE_APPLICATION_CREDENTIALS set: the credentials file it names (CredentialsFromFile).
//   3. The file gcloud writes for `gcloud auth application-default login`, when it exists:
//      $CLOUDSDK_CONFIG/application_default_credentials.json, or
//      $HOME/.config/gcloud/application_default_credentials.json (GcloudAdcFilePath).
//   4. Otherwise the metadata server (GCE, or Workload Identity on GKE) at GCE_METADATA_HOST, or
//      169.254.169.254 (metadata.google.internal) when unset.
// A file that is there but cannot be used is an error, not a reason to try the next source.
//
// A credentials file is one of:
//   - "service_account": a key that signs a JWT (RS256) the key's token_uri exchanges for an
//     access token (the jwt-bearer grant);
//   - "authorized_user": a user's OAuth client and refresh token, exchanged at its token_uri
//     (https://oauth2.googleapis.com/token by default) for an access token (the refresh_token
//     grant). Its quota_project_id, when set, is sent with every GCS request as
//     x-goog-user-project (the project billed for the requests).
// Other types ("external_account" for workload identity federation, "impersonated_service_account")
// are Unimplemented errors naming the file and the type.
//
// Tokens are cached and refreshed shortly before they expire; one fetch runs at a time and
// concurrent callers wait for it. Fetches that fail on a 5xx, a 429 or a connection error are
// retried with jittered exponential backoff (on the injected Clock); other 4xx answers (such as
// invalid_grant) are reported at once with the server's explanation.
//
// A GCS client calls AuthorizationHeader() for each request; on an HTTP 401 it calls Invalidate()
// and retries once with a fresh token.
#ifndef CLUSTERPROF_COMMON_STORAGE_GCS_CREDENTIALS_H_
#define CLUSTERPROF_COMMON_STORAGE_GCS_CREDENTIALS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/base/clock.h"
#include "common/base/env.h"

namespace clusterprof::http {
class Transport;
}  // namespace clusterprof::http

namespace clusterprof::storage::gcs {

inline constexpr char kDefaultScope[] = "https://www.googleapis.com/auth/devstorage.read_write";
// Where the metadata server answers on GCE and GKE (metadata.google.internal).
inline constexpr char kDefaultMetadataHost[] = "169.254.169.254";

struct CredentialsOptions {
  Clock* clock = nullptr;  // common/base/clock.h; required
  // Environment lookup, injectable for tests (default: std::getenv).
  GetEnvFn getenv;
  // The OAuth scope asked for with a service-account key. Tokens from the metadata server carry
  // the scopes of the VM (GCE) or of the Google service account (GKE Workload Identity).
  std::string scope = kDefaultScope;
  // Limit on one token request (connection, request and response).
  int64_t request_timeout_ns = 30 * kNanosPerSecond;
  // Limit on the requests that find out whether a metadata server is there at all (its email
  // endpoint, until it first answers): off GCE nothing answers at 169.254.169.254, and this is
  // how long the search for credentials waits before saying so.
  int64_t metadata_connect_timeout_ns = 2 * kNanosPerSecond;
  // Retries of failed fetches (5xx, 429, no connection): attempts in all, and the backoff before
  // the second attempt, doubling up to max_backoff_ns; each sleep is drawn from [b/2, b].
  int max_attempts = 4;
  int64_t initial_backoff_ns = 250 * kNanosPerMilli;
  int64_t max_backoff_ns = 4 * kNanosPerSecond;
  // What token requests go over; nullptr: cpprestsdk. Must outlive the credentials.
  http::Transport* transport = nullptr;
};

// Thread-safe. Supplies the Authorization header for GCS requests.
class Credentials {
 public:
  virtual ~Credentials() = default;
  // "Bearer <token>", or "" for anonymous access. Fetches or refreshes the token when needed
  // (blocking). A token is refreshed when less than min(5 min, half its lifetime) remains; while a
  // refresh fails, the old token serves until shortly before it expires. Errors name the identity,
  // what failed and what to do.
  virtual absl::StatusOr<std::string> AuthorizationHeader() = 0;
  // The server rejected the current token (HTTP 401): the next AuthorizationHeader() fetches a
  // new one.
  virtual void Invalidate() = 0;
  // Who we are, for error messages: "anonymous (STORAGE_EMULATOR_HOST=...)", "service account
  // sa@p.iam.gserviceaccount.com (key file /path/key.json)", "sa@... from the metadata server at
  // 169.254.169.254 (Workload Identity)", "the user credentials in /home/u/.config/gcloud/
  // application_default_credentials.json (gcloud auth application-default login)".
  virtual std::string Identity() = 0;
  // The project to bill requests to (sent as the x-goog-user-project header); empty: none, the
  // bucket's project pays. The credentials file's quota_project_id.
  virtual std::string QuotaProject() { return ""; }
  // Token requests sent so far, retries included (metrics and tests).
  virtual int64_t token_fetches() const = 0;
};

// The chain above. When it comes to the metadata server, it asks it for the account's email
// before returning (max_attempts tries of metadata_connect_timeout_ns each, with backoff: GKE's
// metadata server can take a few seconds to come up beside a new pod). Errors: a credentials
// file that cannot be used (named, with the variable or gcloud file that chose it and the field
// at fault), or no metadata server answering (a NotFound "no Google Cloud credentials found"
// that lists the ways to provide them).
absl::StatusOr<std::unique_ptr<Credentials>> DefaultCredentials(const CredentialsOptions& options);

// Where gcloud keeps the application-default credentials: $CLOUDSDK_CONFIG/
// application_default_credentials.json when CLOUDSDK_CONFIG is set, else $HOME/.config/gcloud/
// application_default_credentials.json; empty when neither variable is set. `getenv` null: the
// process environment.
std::string GcloudAdcFilePath(const GetEnvFn& getenv);

// A credentials JSON file of any type above, by its "type". Errors name the file: unreadable,
// not JSON, a type that is not supported (Unimplemented for "external_account" and the other
// known types; InvalidArgument for anything else), a missing or unusable field.
absl::StatusOr<std::unique_ptr<Credentials>> CredentialsFromFile(std::string_view path,
                                                                 const CredentialsOptions& options);
// As above, for text from elsewhere; `source_name` names it in messages.
absl::StatusOr<std::unique_ptr<Credentials>> CredentialsFromJson(std::string_view json,
                                                                 std::string_view source_name,
                                                                 const CredentialsOptions& options);

// User credentials (type "authorized_user": client_id, client_secret, refresh_token, and
// optionally quota_project_id and token_uri). Checked here; a refresh token the token endpoint
// refuses (invalid_grant: expired or revoked) is an error at the first AuthorizationHeader()
// that says to run `gcloud auth application-default login`.
absl::StatusOr<std::unique_ptr<Credentials>> AuthorizedUserCredentialsFromJson(
    std::string_view json, std::string_view source_name, const CredentialsOptions& options);

// No Authorization header; `identity` is what Identity() says.
std::unique_ptr<Credentials> AnonymousCredentials(std::string identity);

// A service-account JSON key file (type "service_account"). The key is parsed and checked here:
// an unreadable file, a file that is not JSON, another type of key (such as "authorized_user") or
// a missing or unusable field is an error naming the file and the field.
absl::StatusOr<std::unique_ptr<Credentials>> ServiceAccountKeyCredentials(
    std::string_view key_file_path, const CredentialsOptions& options);
// As above, for key text from elsewhere; `source_name` names it in messages.
absl::StatusOr<std::unique_ptr<Credentials>> ServiceAccountKeyCredentialsFromJson(
    std::string_view json, std::string_view source_name, const CredentialsOptions& options);

// The metadata server at `host` ("host:port" or "http://host:port"). Nothing is fetched until the
// first AuthorizationHeader(), which also learns the account's email for Identity() (Identity()
// itself never waits on the network).
std::unique_ptr<Credentials> MetadataServerCredentials(std::string host,
                                                       const CredentialsOptions& options);

}  // namespace clusterprof::storage::gcs

#endif  // CLUSTERPROF_COMMON_STORAGE_GCS_CREDENTIALS_H_
