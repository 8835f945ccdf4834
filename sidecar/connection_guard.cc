#include "sidecar/connection_guard.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <optional>
#include <utility>
#include <vector>

#include "common/base/status.h"
#include "common/base/strings.h"
#include "spdlog/spdlog.h"

namespace clusterprof::sidecar {
namespace {

// A peer or the total is warned about at most this often.
constexpr int64_t kWarningIntervalNs = 60 * kNanosPerSecond;

std::optional<int> ParseFd(std::string_view name) {
  int fd = -1;
  const auto [end, error] = std::from_chars(name.data(), name.data() + name.size(), fd);
  if (error != std::errc() || end != name.data() + name.size() || fd < 0) return std::nullopt;
  return fd;
}

// The inode of "socket:[12345]"; nullopt for any other link target (files, pipes, anon inodes).
std::optional<ino_t> ParseSocketInode(std::string_view target) {
  constexpr std::string_view kPrefix = "socket:[";
  if (!StartsWith(target, kPrefix) || !EndsWith(target, "]")) return std::nullopt;
  const std::string_view digits = target.substr(kPrefix.size(), target.size() - kPrefix.size() - 1);
  ino_t inode = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), inode);
  if (error != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  return inode;
}

// The address of an AF_INET or AF_INET6 socket address, IPv4-mapped IPv6 in IPv4 form.
std::string AddressText(const sockaddr_storage& address) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(address);
    inet_ntop(AF_INET, &v4.sin_addr, text, sizeof(text));
  } else {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(address);
    if (IN6_IS_ADDR_V4MAPPED(&v6.sin6_addr)) {
      inet_ntop(AF_INET, &v6.sin6_addr.s6_addr[12], text, sizeof(text));
    } else {
      inet_ntop(AF_INET6, &v6.sin6_addr, text, sizeof(text));
    }
  }
  return text;
}

int PortOf(const sockaddr_storage& address) {
  return address.ss_family == AF_INET
             ? ntohs(reinterpret_cast<const sockaddr_in&>(address).sin_port)
             : ntohs(reinterpret_cast<const sockaddr_in6&>(address).sin6_port);
}

// The peer address of `fd` when it is an established TCP connection whose local port is `port`.
std::optional<std::string> EstablishedPeerOnPort(int fd, int port) {
  sockaddr_storage local = {};
  socklen_t length = sizeof(local);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) != 0) return std::nullopt;
  if (local.ss_family != AF_INET && local.ss_family != AF_INET6) return std::nullopt;
  if (PortOf(local) != port) return std::nullopt;
  int type = 0;
  length = sizeof(type);
  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &length) != 0 || type != SOCK_STREAM) {
    return std::nullopt;
  }
  // Listeners, and connections that either side has begun to close (among them those an earlier
  // sweep shut down, until gRPC closes them), are not counted.
  tcp_info info = {};
  length = sizeof(info);
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &length) != 0 ||
      info.tcpi_state != TCP_ESTABLISHED) {
    return std::nullopt;
  }
  sockaddr_storage peer = {};
  length = sizeof(peer);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &length) != 0) return std::nullopt;
  return AddressText(peer);
}

}  // namespace

struct ConnectionGuard::Connection {
  int fd;
  ino_t inode;
  std::string peer;
  int64_t first_seen;  // the sweep that first saw it
};

ConnectionGuard::ConnectionGuard(Options options)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? *options_.clock : SystemClock()) {}

ConnectionGuard::~ConnectionGuard() { Stop(); }

absl::Status ConnectionGuard::Start() {
  if (options_.port < 1 || options_.port > 65535) {
    return absl::InvalidArgumentError(
        StrCat("connection guard: port ", options_.port, " is not a TCP port (1-65535)"));
  }
  if (options_.max_per_peer < 1 || options_.max_total < 1) {
    return absl::InvalidArgumentError(StrCat("connection guard: caps must be at least 1 (",
                                             "max_per_peer ", options_.max_per_peer, ", max_total ",
                                             options_.max_total, ")"));
  }
  if (options_.interval_ns < kNanosPerMilli) {
    return absl::InvalidArgumentError(
        StrCat("connection guard: interval ", options_.interval_ns, " ns is below 1 ms"));
  }
  MutexLock lock(&thread_mu_);
  if (thread_.joinable()) {
    return absl::FailedPreconditionError("connection guard: started already");
  }
  stop_ = false;
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

void ConnectionGuard::Stop() {
  MutexLock lock(&thread_mu_);
  if (!thread_.joinable()) return;
  stop_ = true;
  clock_.Wake();
  thread_.join();
}

void ConnectionGuard::Run() {
  bool failing = false;
  while (!stop_) {
    absl::StatusOr<ConnectionSweep> sweep = Sweep();
    if (!sweep.ok() && !failing) {
      spdlog::warn(
          "connection guard: {}; connections to port {} are not capped until a sweep "
          "succeeds",
          std::string(sweep.status().message()), options_.port);
    }
    failing = !sweep.ok();
    if (!clock_.SleepUntilMonotonicNsUnless(clock_.MonotonicNs() + options_.interval_ns, stop_)) {
      break;
    }
  }
}

absl::StatusOr<ConnectionSweep> ConnectionGuard::Sweep() {
  absl::StatusOr<ConnectionSweep> result;
  {
    MutexLock sweep_lock(&sweep_mu_);
    result = SweepLocked();
  }
  if (result.ok() && options_.on_refused) {
    if (result->shut_down_per_peer > 0) {
      options_.on_refused(kRefusedPerPeer, result->shut_down_per_peer);
    }
    if (result->shut_down_total > 0) options_.on_refused(kRefusedTotal, result->shut_down_total);
  }
  return result;
}

absl::StatusOr<ConnectionSweep> ConnectionGuard::SweepLocked() {
  const std::string fd_dir = StrCat(options_.proc_dir, "/self/fd");
  DIR* dir = opendir(fd_dir.c_str());
  if (dir == nullptr) return ErrnoToStatus(errno, "opendir", fd_dir);
  std::vector<Connection> connections;
  const int dir_fd = dirfd(dir);
  while (const dirent* entry = readdir(dir)) {
    const std::optional<int> fd = ParseFd(entry->d_name);
    if (!fd || *fd == dir_fd) continue;
    char target[64];
    const ssize_t length = readlinkat(dir_fd, entry->d_name, target, sizeof(target));
    if (length <= 0 || length == sizeof(target)) continue;  // closed meanwhile, or not a socket
    const std::optional<ino_t> inode = ParseSocketInode(std::string_view(target, length));
    if (!inode) continue;
    std::optional<std::string> peer = EstablishedPeerOnPort(*fd, options_.port);
    if (!peer) continue;
    connections.push_back(Connection{*fd, *inode, std::move(*peer), 0});
  }
  closedir(dir);

  // Carry the first sightings over for the connections still there; forget the others.
  const int64_t this_sweep = ++sweep_number_;
  absl::flat_hash_map<uint64_t, int64_t> first_seen;
  for (Connection& connection : connections) {
    const auto it = first_seen_.find(connection.inode);
    connection.first_seen = it != first_seen_.end() ? it->second : this_sweep;
    first_seen.emplace(connection.inode, connection.first_seen);
  }
  first_seen_ = std::move(first_seen);

  ConnectionSweep result;
  result.connections = static_cast<int>(connections.size());
  // Newest first, so each peer's excess and the overall excess are the front of what is left.
  std::sort(connections.begin(), connections.end(), [](const Connection& a, const Connection& b) {
    return a.first_seen != b.first_seen ? a.first_seen > b.first_seen : a.inode > b.inode;
  });
  for (const Connection& connection : connections) ++result.per_peer[connection.peer];

  // Verifies that the fd still holds the socket listed, then shuts it down.
  const auto shut_down = [](const Connection& connection) {
    struct stat status = {};
    if (fstat(connection.fd, &status) != 0 || !S_ISSOCK(status.st_mode) ||
        status.st_ino != connection.inode) {
      return false;
    }
    return shutdown(connection.fd, SHUT_RDWR) == 0;
  };
  // Per peer, the connections picked to go and those of them actually shut down (a pick whose fd
  // no longer holds its socket is gone already).
  std::map<std::string, int> picked_per_peer;
  std::map<std::string, int> shut_per_peer;
  std::vector<const Connection*> kept;
  for (const Connection& connection : connections) {
    const int excess = result.per_peer[connection.peer] - options_.max_per_peer;
    if (excess > 0 && picked_per_peer[connection.peer] < excess) {
      ++picked_per_peer[connection.peer];
      if (shut_down(connection)) {
        ++result.shut_down_per_peer;
        ++shut_per_peer[connection.peer];
      }
      continue;
    }
    kept.push_back(&connection);
  }
  const int over_total = static_cast<int>(kept.size()) - options_.max_total;
  for (int i = 0; i < over_total; ++i) {
    if (shut_down(*kept[i])) ++result.shut_down_total;
  }

  const int64_t now_ns = clock_.MonotonicNs();
  absl::erase_if(last_warning_ns_, [now_ns](const auto& entry) {
    return now_ns - entry.second >= kWarningIntervalNs;
  });
  for (const auto& [peer, shut] : shut_per_peer) {
    MaybeWarn(peer, "max_per_peer", options_.max_per_peer, result.per_peer[peer], shut);
  }
  if (result.shut_down_total > 0) {
    MaybeWarn("", "max_total", options_.max_total, static_cast<int>(kept.size()),
              result.shut_down_total);
  }
  {
    MutexLock lock(&mu_);
    refused_per_peer_ += result.shut_down_per_peer;
    refused_total_ += result.shut_down_total;
    ++sweeps_;
  }
  return result;
}

void ConnectionGuard::MaybeWarn(const std::string& peer, std::string_view cap, int limit, int seen,
                                int shut) {
  const int64_t now_ns = clock_.MonotonicNs();
  const auto [it, inserted] = last_warning_ns_.try_emplace(peer, now_ns);
  if (!inserted) return;  // warned within the last minute
  if (peer.empty()) {
    spdlog::warn(
        "connection guard: {} connections to port {}, more than {} {}; shut down the "
        "newest {} (warned at most once a minute)",
        seen, options_.port, cap, limit, shut);
  } else {
    spdlog::warn(
        "connection guard: {} connections from {} to port {}, more than {} {}; shut "
        "down the newest {} (warned at most once a minute per peer)",
        seen, peer, options_.port, cap, limit, shut);
  }
}

int64_t ConnectionGuard::refused(std::string_view reason) const {
  MutexLock lock(&mu_);
  if (reason == kRefusedPerPeer) return refused_per_peer_;
  if (reason == kRefusedTotal) return refused_total_;
  return 0;
}

int64_t ConnectionGuard::sweeps() const {
  MutexLock lock(&mu_);
  return sweeps_;
}

}  // namespace clusterprof::sidecar
