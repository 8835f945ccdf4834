#include "common/grpc/log_bridge.h"

#include <grpc/support/log.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <mutex>
#include <optional>
#include <shared_mutex>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "common/base/env.h"
#include "common/base/strings.h"
#include "spdlog/spdlog.h"

namespace clusterprof::grpclog {
namespace {

// What gRPC 1.51's chttp2_server.cc logs, at DEBUG, for every failed server handshake.
constexpr std::string_view kHandshakeFailedPrefix = "Handshaking failed: ";

// Rate-limit windows are kept per gRPC call site, a bounded set; past this many (file names that
// are not gRPC's own, say) the ended windows are dropped.
constexpr size_t kMaxWindows = 1024;

static_assert(static_cast<int>(GrpcSeverity::kDebug) == GPR_LOG_SEVERITY_DEBUG);
static_assert(static_cast<int>(GrpcSeverity::kInfo) == GPR_LOG_SEVERITY_INFO);
static_assert(static_cast<int>(GrpcSeverity::kError) == GPR_LOG_SEVERITY_ERROR);

// The installed bridge. Readers (gRPC's threads, in LogFunction) hold the lock shared for the
// whole call, so Uninstall, which takes it exclusively, returns only once no call is using the
// bridge. Never destroyed: gRPC's threads may log during exit.
std::shared_mutex& InstalledMutex() {
  static auto* mutex = new std::shared_mutex;
  return *mutex;
}
LogBridge* g_installed = nullptr;  // guarded by InstalledMutex()

void LogFunction(gpr_log_func_args* args) {
  std::shared_lock<std::shared_mutex> lock(InstalledMutex());
  const char* message = args->message != nullptr ? args->message : "";
  if (g_installed == nullptr) {
    // A call that read the log function just before Uninstall replaced it.
    if (args->severity == GPR_LOG_SEVERITY_ERROR) std::fprintf(stderr, "grpc: %s\n", message);
    return;
  }
  g_installed->Handle(args->file != nullptr ? args->file : "", args->line,
                      static_cast<GrpcSeverity>(args->severity), message);
}

std::string_view BaseName(std::string_view file) {
  const size_t slash = file.rfind('/');
  return slash == std::string_view::npos ? file : file.substr(slash + 1);
}

// `lower_text` is in lower case, and so are the needles.
bool ContainsAny(std::string_view lower_text, std::initializer_list<std::string_view> needles) {
  return std::any_of(needles.begin(), needles.end(), [lower_text](std::string_view needle) {
    return lower_text.find(needle) != std::string_view::npos;
  });
}

gpr_log_severity VerbosityFromEnvironment() {
  const std::optional<std::string> verbosity = GetEnv("GRPC_VERBOSITY");
  if (verbosity && absl::EqualsIgnoreCase(*verbosity, "debug")) return GPR_LOG_SEVERITY_DEBUG;
  if (verbosity && absl::EqualsIgnoreCase(*verbosity, "info")) return GPR_LOG_SEVERITY_INFO;
  return GPR_LOG_SEVERITY_ERROR;
}

}  // namespace

std::string_view HandshakeFailureReasonName(HandshakeFailureReason reason) {
  switch (reason) {
    case HandshakeFailureReason::kTimeout:
      return "timeout";
    case HandshakeFailureReason::kPlaintextClient:
      return "plaintext_client";
    case HandshakeFailureReason::kClosed:
      return "closed";
    case HandshakeFailureReason::kTlsError:
      return "tls_error";
    case HandshakeFailureReason::kServerShutdown:
      return "server_shutdown";
    case HandshakeFailureReason::kOther:
      break;
  }
  return "other";
}

HandshakeFailureReason ClassifyHandshakeFailure(std::string_view error_text) {
  // The texts gRPC 1.51 with OpenSSL 3 logs (tests/common/grpc/log_bridge_test.cc has them):
  //   server shutdown  "OK" (after the handshake), "... Listener stopped serving. ..."
  //   timeout          "Handshake read failed {... FD Shutdown ... Handshake timed out ...}"
  //   plaintext        "Ssl handshake failed: SSL_ERROR_SSL: error:0A00010B:SSL routines::wrong
  //                    version number" (HTTP/2 preface), "...::http request" (HTTP/1 GET);
  //                    BoringSSL and OpenSSL 1.1 spell these WRONG_VERSION_NUMBER, HTTP_REQUEST
  //   closed           "Handshake read failed {... Socket closed ...}", "... recvmsg:Connection
  //                    reset by peer ..."
  //   TLS              "Ssl handshake failed: SSL_ERROR_SSL: ...::certificate verify failed",
  //                    "...::peer did not return a certificate"
  // "Handshake" alone says nothing: every one of these texts has it.
  const std::string lower = absl::AsciiStrToLower(AbslView(error_text));
  if (error_text == "OK" || ContainsAny(lower, {"listener stopped serving"})) {
    return HandshakeFailureReason::kServerShutdown;
  }
  if (ContainsAny(lower, {"timed out", "timeout", "deadline"})) {
    return HandshakeFailureReason::kTimeout;
  }
  if (ContainsAny(lower, {"wrong version number", "wrong_version_number", "http request",
                          "http_request", "https proxy request", "https_proxy_request"})) {
    return HandshakeFailureReason::kPlaintextClient;
  }
  if (ContainsAny(lower,
                  {"socket closed", "connection reset", "end of tcp stream", "broken pipe"})) {
    return HandshakeFailureReason::kClosed;
  }
  if (ContainsAny(lower, {"ssl", "tsi_", "tls", "certificate", "alert"})) {
    return HandshakeFailureReason::kTlsError;
  }
  return HandshakeFailureReason::kOther;
}

LogBridge::LogBridge(Options options)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? *options_.clock : SystemClock()),
      next_summary_ns_(std::numeric_limits<int64_t>::max()) {}

LogBridge::~LogBridge() { Uninstall(); }

absl::Status LogBridge::Install() {
  std::unique_lock<std::shared_mutex> lock(InstalledMutex());
  if (g_installed == this) return absl::OkStatus();
  if (g_installed != nullptr) {
    return absl::FailedPreconditionError(
        "another gRPC log bridge is installed; gRPC has one log function per process");
  }
  g_installed = this;
  gpr_set_log_verbosity(GPR_LOG_SEVERITY_DEBUG);
  gpr_set_log_function(&LogFunction);
  return absl::OkStatus();
}

void LogBridge::Uninstall() {
  {
    std::unique_lock<std::shared_mutex> lock(InstalledMutex());
    if (g_installed != this) return;
    gpr_set_log_function(nullptr);  // gRPC's own
    gpr_set_log_verbosity(VerbosityFromEnvironment());
    g_installed = nullptr;
  }
  std::vector<Line> out;
  {
    MutexLock lock(&mu_);
    CollectEndedWindows(clock_.MonotonicNs(), /*all=*/true, &out);
  }
  Emit(out);
}

void LogBridge::Handle(std::string_view file, int line, GrpcSeverity severity,
                       std::string_view message) {
  std::optional<HandshakeFailure> failure;
  if (StartsWith(message, kHandshakeFailedPrefix)) {
    failure.emplace();
    failure->error = std::string(message.substr(kHandshakeFailedPrefix.size()));
    failure->reason = ClassifyHandshakeFailure(failure->error);
  } else if (severity == GrpcSeverity::kDebug) {
    return;
  }
  const spdlog::level::level_enum level =
      !failure && severity == GrpcSeverity::kError ? spdlog::level::err : spdlog::level::debug;
  const bool wanted = spdlog::default_logger_raw()->should_log(level);
  if (!failure && !wanted) return;

  const std::string_view base = BaseName(file);
  const int64_t now_ns = clock_.MonotonicNs();
  std::vector<Line> out;
  {
    MutexLock lock(&mu_);
    if (failure) ++handshake_failures_[static_cast<int>(failure->reason)];
    if (wanted && Admit(base, line, level, now_ns, &out)) {
      std::string text = StrCat("grpc: ", base, ":", line, ": ", message);
      if (failure) StrAppend(&text, " (cause: ", HandshakeFailureReasonName(failure->reason), ")");
      out.push_back(Line{level, std::move(text)});
    }
  }
  Emit(out);
  if (failure && options_.on_handshake_failure) options_.on_handshake_failure(*failure);
}

void LogBridge::FlushSuppressed() {
  std::vector<Line> out;
  {
    MutexLock lock(&mu_);
    CollectEndedWindows(clock_.MonotonicNs(), /*all=*/false, &out);
  }
  Emit(out);
}

int64_t LogBridge::handshake_failures(HandshakeFailureReason reason) const {
  MutexLock lock(&mu_);
  return handshake_failures_[static_cast<int>(reason)];
}

int64_t LogBridge::handshake_failures_total() const {
  MutexLock lock(&mu_);
  int64_t total = 0;
  for (int64_t count : handshake_failures_) total += count;
  return total;
}

int64_t LogBridge::suppressed_lines() const {
  MutexLock lock(&mu_);
  return suppressed_lines_;
}

bool LogBridge::Admit(std::string_view file, int line, int level, int64_t now_ns,
                      std::vector<Line>* out) {
  if (now_ns >= next_summary_ns_) CollectEndedWindows(now_ns, /*all=*/false, out);
  if (windows_.size() >= kMaxWindows) {
    absl::erase_if(windows_, [&](const auto& entry) {
      return entry.second.suppressed == 0 && now_ns - entry.second.start_ns >= options_.window_ns;
    });
  }
  auto [it, inserted] = windows_.try_emplace(std::make_pair(std::string(file), line));
  Window& window = it->second;
  if (inserted || now_ns - window.start_ns >= options_.window_ns) {
    // A window with suppressed lines that has ended was summarised above.
    window = Window{.start_ns = now_ns, .level = level};
  }
  if (++window.lines <= options_.max_lines_per_window) return true;
  ++window.suppressed;
  ++suppressed_lines_;
  next_summary_ns_ = std::min(next_summary_ns_, window.start_ns + options_.window_ns);
  return false;
}

void LogBridge::CollectEndedWindows(int64_t now_ns, bool all, std::vector<Line>* out) {
  int64_t next_ns = std::numeric_limits<int64_t>::max();
  for (auto& [key, window] : windows_) {
    if (window.suppressed == 0) continue;
    const int64_t end_ns = window.start_ns + options_.window_ns;
    if (all || end_ns <= now_ns) {
      out->push_back(Line{window.level, StrCat("grpc: ", key.first, ":", key.second, ": ",
                                               window.suppressed, " more like this suppressed")});
      window.suppressed = 0;
    } else {
      next_ns = std::min(next_ns, end_ns);
    }
  }
  next_summary_ns_ = next_ns;
}

void LogBridge::Emit(const std::vector<Line>& lines) {
  for (const Line& line : lines) {
    spdlog::default_logger_raw()->log(static_cast<spdlog::level::level_enum>(line.level),
                                      line.text);
  }
}

}  // namespace clusterprof::grpclog
