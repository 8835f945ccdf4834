#include "sidecar/token_auth.h"

#include <cerrno>

#include "common/base/status.h"
#include "common/base/strings.h"
#include "common/base/token_file.h"
#include "spdlog/spdlog.h"

namespace clusterprof::sidecar {
namespace {

// Compares without stopping at the first difference, so the time taken says nothing about how
// much of a guess was right.
bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  }
  return diff == 0;
}

}  // namespace

bool IsLoopbackPeer(std::string_view peer) {
  if (!ConsumePrefix(&peer, "ipv4:") && !ConsumePrefix(&peer, "ipv6:")) return false;
  return IsLoopbackIp(AddressHost(peer));
}

TokenAuth::TokenAuth(Options options)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? *options_.clock : SystemClock()) {}

absl::StatusOr<std::unique_ptr<TokenAuth>> TokenAuth::Create(std::string path,
                                                             bool allow_loopback) {
  Options options;
  options.path = std::move(path);
  options.allow_loopback = allow_loopback;
  return Create(std::move(options));
}

absl::StatusOr<std::unique_ptr<TokenAuth>> TokenAuth::Create(Options options) {
  std::unique_ptr<TokenAuth> auth(new TokenAuth(std::move(options)));
  MutexLock lock(&auth->mu_);
  CLUSTERPROF_RETURN_IF_ERROR(auth->ReloadLocked());
  return auth;
}

absl::Status TokenAuth::ReloadLocked() {
  const auto report = [this](std::string_view result) {
    if (options_.on_reload) options_.on_reload(result);
  };
  const std::optional<FileStamp> before = StampFile(options_.path);
  if (!before.has_value()) {
    const absl::Status missing = ErrnoToStatus(errno, "cannot stat the token file", options_.path);
    // Missing (a Secret being replaced, or deleted): the token in force stays.
    if (stamp_ != FileStamp()) {
      stamp_ = FileStamp();
      if (!token_.empty()) {
        spdlog::warn("{}; keeping the bearer token read before", std::string(missing.message()));
        report("unreadable");
      }
    }
    return missing;
  }
  if (!token_.empty() && before == stamp_) return absl::OkStatus();
  absl::StatusOr<std::string> read = ReadTokenFile(options_.path);
  const std::optional<FileStamp> after = StampFile(options_.path);
  if (read.ok() && after.has_value() && after != before) {
    // Changed while read: read again at the next call, when it has settled.
    return absl::UnavailableError(StrCat("the token file ", options_.path, " is being rewritten"));
  }
  stamp_ = before;
  if (!read.ok()) {
    if (!token_.empty()) {
      const bool empty =
          before->size == 0 || read.status().message().find("is empty") != std::string_view::npos;
      spdlog::warn("{}; keeping the bearer token read before",
                   std::string(read.status().message()));
      report(empty ? "empty" : "unreadable");
    }
    return read.status();
  }
  if (*read == token_) return absl::OkStatus();
  if (!token_.empty()) {
    previous_ = std::move(token_);
    previous_until_ns_ = clock_.MonotonicNs() + options_.grace_ns;
    spdlog::info("the bearer token in {} changed; the one before is accepted for {} s more",
                 options_.path, options_.grace_ns / kNanosPerSecond);
  }
  token_ = *std::move(read);
  report("ok");
  return absl::OkStatus();
}

grpc::Status TokenAuth::Check(const grpc::ServerContextBase& context) {
  if (options_.allow_loopback && IsLoopbackPeer(context.peer())) return grpc::Status::OK;
  const auto refuse = [this](std::string_view reason, std::string message) {
    if (options_.on_refused) options_.on_refused(reason);
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::move(message));
  };
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kAuthorizationKey);
  if (it == metadata.end()) {
    return refuse("missing",
                  "this sidecar requires a bearer token (metadata \"authorization: Bearer "
                  "<token>\"); the clusterprof operator and CLI send it with "
                  "--sidecar-token-file / --token-file");
  }
  std::string_view given(it->second.data(), it->second.size());
  if (!ConsumePrefix(&given, kBearerPrefix)) {
    return refuse("malformed", "the authorization metadata is not \"Bearer <token>\"");
  }
  bool current = false;
  bool previous = false;
  bool previous_in_grace = false;
  {
    MutexLock lock(&mu_);
    // A rotated Secret takes effect here; a file missing, empty or being rewritten keeps the
    // token in force.
    (void)ReloadLocked();
    current = ConstantTimeEquals(given, token_);
    previous = !previous_.empty() && ConstantTimeEquals(given, previous_);
    previous_in_grace = clock_.MonotonicNs() < previous_until_ns_;
  }
  if (current || (previous && previous_in_grace)) return grpc::Status::OK;
  if (previous) {
    return refuse("rotated_out",
                  "the bearer token was replaced and its grace period (--token-grace-seconds) "
                  "is over: the client must read its token file again");
  }
  return refuse("wrong", "the bearer token does not match this sidecar's");
}

}  // namespace clusterprof::sidecar
