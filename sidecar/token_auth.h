// Bearer-token auth for the sidecar's gRPC services (docs/sidecar.md, "Auth"): with
// --auth-token-file, every call must carry `authorization: Bearer <token>` with the file's token,
// else it is refused with UNAUTHENTICATED. The file is a mounted Secret; it is reread when it
// changes, so a rotated token takes effect without a restart, and the token before it is still
// accepted for a grace period (--token-grace-seconds). Off by default: TF/JAX clients and XProf's
// capture button send no token.
//
// Thread-safe.
#ifndef CLUSTERPROF_SIDECAR_TOKEN_AUTH_H_
#define CLUSTERPROF_SIDECAR_TOKEN_AUTH_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/base/clock.h"
#include "common/base/file_stamp.h"
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
  struct Options {
    std::string path;
    // Calls whose peer is a loopback address need no token.
    bool allow_loopback = false;
    // After the file's token changes, the one before is still accepted this long.
    int64_t grace_ns = 300 * kNanosPerSecond;
    Clock* clock = nullptr;  // null: SystemClock()
    // Each refused call, with why: "missing" (no authorization metadata), "malformed" (not
    // "Bearer <token>"), "wrong" (no token this sidecar knows), "rotated_out" (the token before
    // the last change, after its grace). Any thread.
    std::function<void(std::string_view reason)> on_refused;
    // Each time the file changed and was read: "ok", or why it was not taken ("unreadable",
    // "empty"; the token before stays in force).
    std::function<void(std::string_view result)> on_reload;
  };

  // Reads the token (surrounding whitespace trimmed). Fails when the file cannot be read or
  // holds no token.
  static absl::StatusOr<std::unique_ptr<TokenAuth>> Create(Options options);
  static absl::StatusOr<std::unique_ptr<TokenAuth>> Create(std::string path,
                                                           bool allow_loopback = false);

  // OK, or UNAUTHENTICATED saying what was wrong (never the token).
  grpc::Status Check(const grpc::ServerContextBase& context);

 private:
  explicit TokenAuth(Options options);
  // Rereads the file when it changed; a read that fails, finds it empty, or sees it change
  // meanwhile (being rewritten) keeps the token in force.
  absl::Status ReloadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  Clock& clock_;
  Mutex mu_;
  std::string token_ ABSL_GUARDED_BY(mu_);
  // The token before the last change, accepted until previous_until_ns_ (monotonic).
  std::string previous_ ABSL_GUARDED_BY(mu_);
  int64_t previous_until_ns_ ABSL_GUARDED_BY(mu_) = 0;
  // The file as last read; FileStamp() when it was last found missing. nullopt: not looked at yet.
  std::optional<FileStamp> stamp_ ABSL_GUARDED_BY(mu_);
};

}  // namespace clusterprof::sidecar

#endif  // CLUSTERPROF_SIDECAR_TOKEN_AUTH_H_
