// Bearer-token auth for the sidecar's gRPC services (docs/sidecar.md, "Auth"): with
// --auth-token-file, every call must carry `authorization: Bearer <token>` with the file's token,
// else it is refused with UNAUTHENTICATED. The file is a mounted Secret; it is re-read when it
// changes, so a rotated token takes effect without a restart. Off by default: TF/JAX clients and
// XProf's capture button send no token.
//
// Thread-safe.
#ifndef CLUSTERPROF_SIDECAR_TOKEN_AUTH_H_
#define CLUSTERPROF_SIDECAR_TOKEN_AUTH_H_

#include <ctime>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/base/mutex.h"
#include "grpcpp/grpcpp.h"

namespace clusterprof::sidecar {

// The metadata key and scheme the operator and the CLI send.
inline constexpr char kAuthorizationKey[] = "authorization";
inline constexpr char kBearerPrefix[] = "Bearer ";

// Whether a gRPC peer string ("ipv4:127.0.0.1:5000", "ipv6:[::1]:5000",
// "ipv6:[::ffff:127.0.0.1]:5000") is a loopback address. Unix sockets and anything else: false.
bool IsLoopbackPeer(std::string_view peer);

class TokenAuth {
 public:
  // Reads the token (surrounding whitespace trimmed). Fails when the file cannot be read or
  // holds no token.
  // With `allow_loopback`, calls whose peer is a loopback address need no token.
  static absl::StatusOr<std::unique_ptr<TokenAuth>> Create(std::string path,
                                                           bool allow_loopback = false);

  // OK, or UNAUTHENTICATED saying what was missing.
  grpc::Status Check(const grpc::ServerContextBase& context);

 private:
  TokenAuth(std::string path, bool allow_loopback)
      : path_(std::move(path)), allow_loopback_(allow_loopback) {}
  absl::Status ReloadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const bool allow_loopback_;
  Mutex mu_;
  std::string token_ ABSL_GUARDED_BY(mu_);
  timespec mtime_ ABSL_GUARDED_BY(mu_) = {};
};

}  // namespace clusterprof::sidecar

#endif  // CLUSTERPROF_SIDECAR_TOKEN_AUTH_H_
