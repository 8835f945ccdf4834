// Local stand-ins for Google's token endpoints, for tests of common/storage/gcs_credentials:
// an OAuth 2.0 token endpoint that verifies jwt-bearer grants for real (RS256 signature and
// claims) and refresh_token grants (user credentials), a GCE/GKE metadata server, and
// service-account keys made at run time.
//
// Both servers listen on 127.0.0.1, port 0 (read it back with port()), on threads of their own, and
// judge time by the Clock they are given, so a test on a SimulatedClock moves the servers' time
// and the client's together.
#ifndef CLUSTERPROF_TESTS_SUPPORT_GCS_TOKEN_SERVERS_H_
#define CLUSTERPROF_TESTS_SUPPORT_GCS_TOKEN_SERVERS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/base/clock.h"
#include "common/base/mutex.h"

namespace clusterprof::testing {

inline constexpr char kTestServiceAccountEmail[] =
    "clusterprof-test@test-project.iam.gserviceaccount.com";

// A service-account key made for a test.
struct TestServiceAccountKey {
  std::string json_key;         // the key file's text: type service_account, project_id, ...
  std::string public_key_pem;   // SubjectPublicKeyInfo PEM, for OAuthTokenServerOptions
  std::string private_key_pem;  // PKCS#8 PEM, as in the key file's "private_key"
  std::string private_key_id;   // the key file's "private_key_id" (the JWT's kid)
  std::string client_email;
};

// Generates an RSA 2048 key and the JSON key file of a service account holding it, with
// `token_uri` as its token endpoint. Crashes (CHECK) on an OpenSSL failure.
TestServiceAccountKey MakeTestServiceAccountKey(
    std::string_view token_uri, std::string_view client_email = kTestServiceAccountEmail);

namespace internal {
class LocalHttpServer;
struct HttpRequest;
struct HttpReply;
}  // namespace internal

// The access tokens a stand-in issued, and until when (wall ns) each is valid. Thread-safe.
class IssuedTokens {
 public:
  // A new random token, "ya29.test-<n>-<random hex>", valid until `expires_wall_ns`.
  std::string Issue(int64_t expires_wall_ns);
  // Whether `token` was issued here and is unexpired at `now_wall_ns`.
  bool IsValid(std::string_view token, int64_t now_wall_ns) const;
  int count() const;

 private:
  mutable Mutex mu_;
  std::map<std::string, int64_t, std::less<>> expiry_ ABSL_GUARDED_BY(mu_);
};

struct OAuthTokenServerOptions {
  Clock* clock = nullptr;  // required: the iat/exp checks and token expiry go by it
  int64_t expires_in_s = 3600;
};

// POST /token: the OAuth 2.0 jwt-bearer grant (RFC 7523) as Google's token endpoint answers it.
// Checks the form, alg, the RS256 signature against the public key trusted for the JWT's kid and
// iss (TrustKey), aud (== token_uri()), scope, iat (within a minute of the clock's time) and exp
// (after iat, at most an hour after it, not past); a mismatch is a 400 {"error":"invalid_grant",
// "error_description":...} with Google's wording where known ("Invalid JWT Signature."). Grants
// are answered with a new token, {"access_token", "expires_in", "token_type":"Bearer"}.
//
// Also the refresh_token grant (RFC 6749 section 6) that user credentials (`gcloud auth
// application-default login`) use: client_id, client_secret and refresh_token must be a triple
// given to TrustRefreshToken. An unknown client or a wrong secret is a 401 {"error":
// "invalid_client"}; an unknown or revoked refresh token a 400 {"error":"invalid_grant",
// "error_description":"Token has been expired or revoked."}, as Google answers them.
// Thread-safe.
class OAuthTokenServer {
 public:
  static absl::StatusOr<std::unique_ptr<OAuthTokenServer>> Start(OAuthTokenServerOptions options);
  ~OAuthTokenServer();

  // Accepts grants for `client_email` signed by the private half of `public_key_pem` (PEM
  // SubjectPublicKeyInfo) under key id `private_key_id` (as Google knows the public keys of a
  // service account's keys). InvalidArgument when the PEM does not parse.
  absl::Status TrustKey(std::string_view public_key_pem, std::string_view private_key_id,
                        std::string_view client_email);
  absl::Status TrustKey(const TestServiceAccountKey& key);
  // Accepts refresh_token grants of `refresh_token` by the OAuth client `client_id` with
  // `client_secret`.
  void TrustRefreshToken(std::string_view client_id, std::string_view client_secret,
                         std::string_view refresh_token);
  // Refuses `refresh_token` from now on (invalid_grant), as after `gcloud auth
  // application-default revoke`.
  void RevokeRefreshToken(std::string_view refresh_token);

  int port() const;
  // http://127.0.0.1:<port>/token
  std::string token_uri() const;

  // Tokens issued, and POST /token requests received (rejected and failed ones included).
  int grants() const;
  int requests() const;
  // The error_description of the last rejected grant ("" if none).
  std::string last_error() const;
  // The scope claim of the last accepted jwt-bearer grant.
  std::string last_scope() const;
  // The grant_type of the last POST /token ("" before any).
  std::string last_grant_type() const;
  bool IsValidToken(std::string_view token, int64_t now_wall_ns) const;

  // The next `count` requests get `http_code` (a 5xx by default) and no token.
  void FailNextRequests(int count, int http_code = 503);
  void set_expires_in_s(int64_t seconds);
  // While held, requests wait in the server before being answered (a fetch stays in flight).
  void HoldRequests();
  void ReleaseRequests();
  // Blocks until at least `count` requests are being held.
  void WaitForHeldRequests(int count);

 private:
  struct PublicKey;  // OpenSSL's EVP_PKEY, kept out of this header
  struct TrustedKey {
    std::string key_id;
    std::string client_email;
    std::shared_ptr<const PublicKey> public_key;
  };
  struct TrustedRefreshToken {
    std::string client_id;
    std::string client_secret;
    bool revoked = false;
  };

  explicit OAuthTokenServer(OAuthTokenServerOptions options);
  internal::HttpReply Handle(const internal::HttpRequest& request);
  // The error_description for an invalid assertion, or "" when it is a valid grant.
  std::string CheckAssertion(std::string_view assertion, int64_t now_wall_ns);
  // A refresh_token grant's answer.
  internal::HttpReply HandleRefresh(const std::map<std::string, std::string>& form,
                                    int64_t expires_in_s);

  const OAuthTokenServerOptions options_;
  IssuedTokens tokens_;
  std::unique_ptr<internal::LocalHttpServer> http_;

  mutable Mutex mu_;
  std::vector<TrustedKey> trusted_ ABSL_GUARDED_BY(mu_);
  // By refresh token.
  std::map<std::string, TrustedRefreshToken, std::less<>> refresh_tokens_ ABSL_GUARDED_BY(mu_);
  std::string last_grant_type_ ABSL_GUARDED_BY(mu_);
  int requests_ ABSL_GUARDED_BY(mu_) = 0;
  int fail_next_ ABSL_GUARDED_BY(mu_) = 0;
  int fail_code_ ABSL_GUARDED_BY(mu_) = 503;
  int64_t expires_in_s_ ABSL_GUARDED_BY(mu_);
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  std::string last_scope_ ABSL_GUARDED_BY(mu_);
  bool holding_ ABSL_GUARDED_BY(mu_) = false;
  int held_ ABSL_GUARDED_BY(mu_) = 0;
};

struct MetadataServerOptions {
  Clock* clock = nullptr;  // required: token expiry goes by it
  std::string email = kTestServiceAccountEmail;
  int64_t expires_in_s = 3600;
};

// The GCE/GKE metadata server's service-account endpoints:
// GET /computeMetadata/v1/instance/service-accounts/default/token ({"access_token",
// "expires_in", "token_type":"Bearer"}) and .../default/email (text); 404 for other paths, 403
// without the request header Metadata-Flavor: Google. Answers carry Metadata-Flavor: Google.
// Thread-safe.
class MetadataServer {
 public:
  static absl::StatusOr<std::unique_ptr<MetadataServer>> Start(MetadataServerOptions options);
  ~MetadataServer();

  int port() const;
  // "127.0.0.1:<port>", as GCE_METADATA_HOST takes it.
  std::string host() const;

  // Requests of any kind, token requests among them, and requests refused (403) for want of the
  // Metadata-Flavor header.
  int requests() const;
  int token_requests() const;
  int rejected_requests() const;
  bool IsValidToken(std::string_view token, int64_t now_wall_ns) const;

  // The next `count` requests get `http_code` (a 5xx by default).
  void FailNextRequests(int count, int http_code = 503);
  void set_expires_in_s(int64_t seconds);

 private:
  explicit MetadataServer(MetadataServerOptions options);
  internal::HttpReply Handle(const internal::HttpRequest& request);

  const MetadataServerOptions options_;
  IssuedTokens tokens_;
  std::unique_ptr<internal::LocalHttpServer> http_;

  mutable Mutex mu_;
  int requests_ ABSL_GUARDED_BY(mu_) = 0;
  int token_requests_ ABSL_GUARDED_BY(mu_) = 0;
  int rejected_ ABSL_GUARDED_BY(mu_) = 0;
  int fail_next_ ABSL_GUARDED_BY(mu_) = 0;
  int fail_code_ ABSL_GUARDED_BY(mu_) = 503;
  int64_t expires_in_s_ ABSL_GUARDED_BY(mu_);
};

}  // namespace clusterprof::testing

#endif  // CLUSTERPROF_TESTS_SUPPORT_GCS_TOKEN_SERVERS_H_
