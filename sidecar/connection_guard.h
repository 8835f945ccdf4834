// A cap on the TCP connections to the sidecar's gRPC port, per peer address and in total.
// gRPC 1.51 has neither a limit on incoming connections nor a hook at accept, so the guard looks
// at the process's own sockets (/proc/self/fd) and shuts down the excess.
#ifndef CLUSTERPROF_SIDECAR_CONNECTION_GUARD_H_
#define CLUSTERPROF_SIDECAR_CONNECTION_GUARD_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/base/clock.h"
#include "common/base/mutex.h"

namespace clusterprof::sidecar {

// The reasons a connection is shut down, as `on_refused` and the counters name them.
inline constexpr std::string_view kRefusedPerPeer = "per_peer";
inline constexpr std::string_view kRefusedTotal = "total";

// What one Sweep saw and did.
struct ConnectionSweep {
  // Established TCP connections to the port, before the sweep shut any down.
  int connections = 0;
  // The same, by peer address ("127.0.0.2", "fd00::1"; IPv4-mapped IPv6 addresses in IPv4 form).
  std::map<std::string, int> per_peer;
  // Connections shut down because their peer had more than max_per_peer.
  int shut_down_per_peer = 0;
  // Connections shut down because there were more than max_total after the per-peer cap.
  int shut_down_total = 0;
};

// Every `interval_ns` (and whenever Sweep() is called), lists the process's sockets whose local
// port is `port` and that are established (listeners and connections already closing are left
// alone), groups them by peer address, and shuts down (shutdown(2), SHUT_RDWR) the newest of a
// peer's connections beyond `max_per_peer`, then the newest of all beyond `max_total`. gRPC owns
// these file descriptors: it sees the shutdown as the end of the connection and closes the fd
// itself; the guard never closes one. Loopback peers count like any other (kubectl
// port-forward's connections all come from 127.0.0.1).
//
// "Newest" is the connection a later sweep first saw; among those one sweep first saw, the socket
// with the higher inode number (Linux numbers sockets from a counter as it creates them, handed
// to each CPU in batches, so across CPUs this is nearly but not exactly the order of accept). A
// peer that opens connection after connection therefore loses its new ones, not the long-lived
// ones already there. Before a shutdown the fd is checked to still hold the socket of that inode
// (the connection may have been closed and its fd number reused since the listing); the check and
// the shutdown are two system calls, so an fd closed and reused between the two, within
// microseconds, could still be hit, which no interface short of pidfd_getfd closes.
//
// Thread-safe: Sweep() may run on the guard's thread and on callers' at once (sweeps take turns).
// A sweep that cannot list /proc/<self>/fd returns the error, and the thread logs it (once until a
// sweep succeeds again) and tries again at the next interval. Sockets that vanish while a sweep
// looks at them are skipped.
class ConnectionGuard {
 public:
  struct Options {
    // The local port to watch: the gRPC server's, once it is bound.
    int port = 0;
    int max_per_peer = 64;
    int max_total = 512;
    // Where procfs is mounted; the guard reads <proc_dir>/self/fd.
    std::string proc_dir = "/proc";
    int64_t interval_ns = 5 * kNanosPerSecond;
    Clock* clock = nullptr;  // null: SystemClock()
    // After each sweep that shut connections down, once per reason with their number
    // (kRefusedPerPeer, kRefusedTotal). On the sweeping thread, no lock of the guard held.
    std::function<void(std::string_view reason, int n)> on_refused;
  };

  explicit ConnectionGuard(Options options);
  // Stops the thread.
  ~ConnectionGuard();
  ConnectionGuard(const ConnectionGuard&) = delete;
  ConnectionGuard& operator=(const ConnectionGuard&) = delete;

  // Starts the thread that sweeps every interval, the first time at once. InvalidArgument for a
  // port outside 1-65535, a cap below 1 or an interval below 1 ms; FailedPrecondition when
  // started already.
  absl::Status Start();
  // Stops the thread and waits for it. Does nothing when it is not running.
  void Stop();

  // One pass, as described above.
  absl::StatusOr<ConnectionSweep> Sweep();

  // Connections shut down so far, for one reason (kRefusedPerPeer, kRefusedTotal).
  int64_t refused(std::string_view reason) const;
  // Sweeps completed so far, by the thread and by callers.
  int64_t sweeps() const;

 private:
  struct Connection;
  void Run();
  absl::StatusOr<ConnectionSweep> SweepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(sweep_mu_);
  // Logs a warning about `peer` (or the total, for an empty peer) unless one was logged for it in
  // the last minute.
  void MaybeWarn(const std::string& peer, std::string_view cap, int limit, int seen, int shut)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(sweep_mu_);

  const Options options_;
  Clock& clock_;

  // Held for a whole sweep: one at a time.
  Mutex sweep_mu_;
  // For each connection the last sweep saw (by socket inode), the number of the sweep that first
  // saw it.
  absl::flat_hash_map<uint64_t, int64_t> first_seen_ ABSL_GUARDED_BY(sweep_mu_);
  int64_t sweep_number_ ABSL_GUARDED_BY(sweep_mu_) = 0;
  // When the last warning for a peer ("" for the total) was logged, monotonic.
  absl::flat_hash_map<std::string, int64_t> last_warning_ns_ ABSL_GUARDED_BY(sweep_mu_);

  mutable Mutex mu_;
  int64_t refused_per_peer_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t refused_total_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t sweeps_ ABSL_GUARDED_BY(mu_) = 0;

  // The sweeping thread; thread_mu_ makes Start and Stop take turns.
  Mutex thread_mu_;
  std::atomic<bool> stop_{false};
  std::thread thread_ ABSL_GUARDED_BY(thread_mu_);
};

}  // namespace clusterprof::sidecar

#endif  // CLUSTERPROF_SIDECAR_CONNECTION_GUARD_H_
