// gRPC core's own log lines (gpr_log, which Debian's libgrpc 1.51 writes to stderr in its own
// format) sent into spdlog instead, with repeats rate-limited, and the server's failed connection
// handshakes counted by cause.
#ifndef CLUSTERPROF_COMMON_GRPC_LOG_BRIDGE_H_
#define CLUSTERPROF_COMMON_GRPC_LOG_BRIDGE_H_

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "common/base/clock.h"
#include "common/base/mutex.h"

namespace clusterprof::grpclog {

// Why a server-side connection handshake failed, read from the text gRPC logs for it.
enum class HandshakeFailureReason {
  // The handshake deadline passed (GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, 120 s by default): a
  // client that connected and sent nothing, or too little.
  kTimeout,
  // A client that speaks plaintext (HTTP/2 without TLS, HTTP/1) to a TLS port.
  kPlaintextClient,
  // The client closed or reset the connection during the handshake. A client that rejects the
  // server's certificate (a wrong CA) closes without a TLS alert, so it lands here too.
  kClosed,
  // Any other TLS failure: the client's certificate did not verify or was missing (mutual TLS),
  // no common protocol version or cipher.
  kTlsError,
  // The server stopped listening while the handshake was under way: the server's own shutdown,
  // not a client's failure.
  kServerShutdown,
  kOther,
};
inline constexpr int kNumHandshakeFailureReasons = 6;

// "timeout", "plaintext_client", "closed", "tls_error", "server_shutdown", "other": the label
// value for metrics.
std::string_view HandshakeFailureReasonName(HandshakeFailureReason reason);

// Classifies gRPC's error text for a failed handshake (what follows "Handshaking failed: "). The
// text is an error tree; the cause can be a child ("Handshake read failed {... children:[...
// Handshake timed out ...]}"), so the whole text is searched, in the order of the enum above:
// server shutdown, then timeout, plaintext client, closed, TLS error.
HandshakeFailureReason ClassifyHandshakeFailure(std::string_view error_text);

struct HandshakeFailure {
  HandshakeFailureReason reason = HandshakeFailureReason::kOther;
  // gRPC's error text (no secrets: gRPC puts addresses, fds and OpenSSL's reason in it).
  std::string error;
};

// gpr_log_severity, without gRPC's headers.
enum class GrpcSeverity { kDebug = 0, kInfo = 1, kError = 2 };

// Receives gRPC core's log lines once installed:
//  - ERROR lines go to spdlog at error, INFO lines at debug, as "grpc: <file>:<line>: <message>"
//    with the file's base name; DEBUG lines are dropped, except the server's "Handshaking failed:
//    ..." line (chttp2_server.cc), which is counted by cause (ClassifyHandshakeFailure), reported
//    to `on_handshake_failure` and logged at debug.
//  - Each (file, line) is rate-limited: past `max_lines_per_window` lines in a window of
//    `window_ns` (monotonic, from the injected Clock), its lines are suppressed and counted, and
//    one line "grpc: <file>:<line>: N more like this suppressed" is logged once the window has
//    ended (when the bridge next logs a line, on FlushSuppressed, or on Uninstall).
//  - Nothing is added to gRPC's text: no call metadata ever passes through here.
//
// gRPC has one log function per process and takes it as a plain function pointer, so the bridge
// it calls is held in one static pointer: the one exception to "no singletons". main() builds a
// LogBridge, calls Install() before it starts anything that uses gRPC, and keeps the bridge alive
// until gRPC is shut down (or calls Uninstall()). Install() sets gRPC's verbosity to DEBUG, which
// the handshake line needs; the DEBUG lines that gRPC formats and this bridge drops are few
// outside gRPC's tracers (GRPC_TRACE), which this does not turn on.
//
// Thread-safe: gRPC calls in from any of its threads. `on_handshake_failure` runs on the gRPC
// thread that logged, with no lock of the bridge held; it must be quick and must not call
// Uninstall().
class LogBridge {
 public:
  struct Options {
    Clock* clock = nullptr;  // null: SystemClock()
    int max_lines_per_window = 5;
    int64_t window_ns = 60 * kNanosPerSecond;
    // Each failed server handshake. Any gRPC thread.
    std::function<void(const HandshakeFailure&)> on_handshake_failure;
  };

  explicit LogBridge(Options options);
  // Uninstalls the bridge if it is the installed one.
  ~LogBridge();
  LogBridge(const LogBridge&) = delete;
  LogBridge& operator=(const LogBridge&) = delete;

  // Makes this bridge gRPC's log function and sets gRPC's verbosity to DEBUG. FailedPrecondition
  // when another bridge is installed; OK when this one already is.
  absl::Status Install();
  // Logs the pending summaries and gives gRPC back its own log function, at the verbosity gRPC
  // itself would choose (GRPC_VERBOSITY, else ERROR). Waits for calls into this bridge that are
  // under way. Does nothing when this bridge is not the installed one.
  void Uninstall();

  // One gRPC log line, as the installed log function passes it on. Public for callers that
  // already hold a line; gRPC's lines arrive here through Install().
  void Handle(std::string_view file, int line, GrpcSeverity severity, std::string_view message);

  // Logs the summary of every rate-limit window that has ended with lines suppressed.
  void FlushSuppressed();

  // Failed server handshakes seen so far, for one cause and for all.
  int64_t handshake_failures(HandshakeFailureReason reason) const;
  int64_t handshake_failures_total() const;
  // Lines suppressed by the rate limit so far.
  int64_t suppressed_lines() const;

 private:
  struct Window {
    int64_t start_ns = 0;
    int lines = 0;
    int64_t suppressed = 0;
    int level = 0;  // of its lines and of their summary
  };
  struct Line {
    int level;  // spdlog::level::level_enum
    std::string text;
  };
  // Whether the line from (file, line) is within its window's allowance; queues in `out` the
  // summaries of windows that have ended.
  bool Admit(std::string_view file, int line, int level, int64_t now_ns, std::vector<Line>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CollectEndedWindows(int64_t now_ns, bool all, std::vector<Line>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void Emit(const std::vector<Line>& lines);

  const Options options_;
  Clock& clock_;

  mutable Mutex mu_;
  // Keyed by (base name of the file, line): gRPC's call sites, a bounded set.
  absl::flat_hash_map<std::pair<std::string, int>, Window> windows_ ABSL_GUARDED_BY(mu_);
  // The earliest end of a window with suppressed lines; INT64_MAX when there is none.
  int64_t next_summary_ns_ ABSL_GUARDED_BY(mu_);
  std::array<int64_t, kNumHandshakeFailureReasons> handshake_failures_ ABSL_GUARDED_BY(mu_) = {};
  int64_t suppressed_lines_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace clusterprof::grpclog

#endif  // CLUSTERPROF_COMMON_GRPC_LOG_BRIDGE_H_
