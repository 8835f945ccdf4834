#include "sidecar/token_auth.h"

#include <sys/stat.h>

#include "common/base/status.h"
#include "common/base/strings.h"
#include "common/base/token_file.h"

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
  std::string_view host;
  if (ConsumePrefix(&peer, "ipv4:")) {
    host = peer.substr(0, peer.rfind(':'));
  } else if (ConsumePrefix(&peer, "ipv6:[")) {
    host = peer.substr(0, peer.find(']'));
    if (host == "::1") return true;
    if (!ConsumePrefix(&host, "::ffff:")) return false;
  } else {
    return false;
  }
  // 127.0.0.0/8: "127." and three more numbers.
  if (!ConsumePrefix(&host, "127.")) return false;
  int dots = 0;
  for (char c : host) {
    if (c == '.') {
      ++dots;
    } else if (c < '0' || c > '9') {
      return false;
    }
  }
  return dots == 2;
}

absl::StatusOr<std::unique_ptr<TokenAuth>> TokenAuth::Create(std::string path,
                                                             bool allow_loopback) {
  std::unique_ptr<TokenAuth> auth(new TokenAuth(std::move(path), allow_loopback));
  MutexLock lock(&auth->mu_);
  CLUSTERPROF_RETURN_IF_ERROR(auth->ReloadLocked());
  return auth;
}

absl::Status TokenAuth::ReloadLocked() {
  struct stat st;
  if (stat(path_.c_str(), &st) != 0)
    return ErrnoToStatus(errno, "cannot stat the token file", path_);
  if (!token_.empty() && st.st_mtim.tv_sec == mtime_.tv_sec &&
      st.st_mtim.tv_nsec == mtime_.tv_nsec) {
    return absl::OkStatus();
  }
  CLUSTERPROF_ASSIGN_OR_RETURN(token_, ReadTokenFile(path_));
  mtime_ = st.st_mtim;
  return absl::OkStatus();
}

grpc::Status TokenAuth::Check(const grpc::ServerContextBase& context) {
  if (allow_loopback_ && IsLoopbackPeer(context.peer())) return grpc::Status::OK;
  std::string token;
  {
    MutexLock lock(&mu_);
    // A rotated Secret takes effect here; a file that went missing keeps the last token.
    (void)ReloadLocked();
    token = token_;
  }
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kAuthorizationKey);
  if (it == metadata.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "this sidecar requires a bearer token (metadata \"authorization: Bearer "
                        "<token>\"); the clusterprof operator and CLI send it with "
                        "--sidecar-token-file / --token-file");
  }
  const std::string_view value(it->second.data(), it->second.size());
  if (!value.starts_with(kBearerPrefix) ||
      !ConstantTimeEquals(value.substr(sizeof(kBearerPrefix) - 1), token)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "the bearer token does not match this sidecar's");
  }
  return grpc::Status::OK;
}

}  // namespace clusterprof::sidecar
