// An HTTP proxy for tests that sits in front of a real kube-apiserver (tests/support/
// kube_control_plane.h) and injects the faults that the real server does not produce on demand:
// 429 with Retry-After, 5xx, latency, and watch connections that break mid-stream.
#ifndef CLUSTERPROF_TESTS_SUPPORT_KUBE_FAULT_PROXY_H_
#define CLUSTERPROF_TESTS_SUPPORT_KUBE_FAULT_PROXY_H_

#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/base/mutex.h"

// OpenSSL's SSL_CTX.
struct ssl_ctx_st;

namespace clusterprof::testing {

// Serves plain HTTP/1.1 on 127.0.0.1 (a free port) and forwards each request to the upstream
// API server over HTTPS (verified against a CA file) or HTTP: method, path and query, end-to-end
// headers (Authorization, Content-Type, Accept, ...) and body. Response bodies are streamed
// piece by piece as they arrive, so watches (endless chunked streams of JSON lines) work
// through it. Downstream connections are kept alive between requests; each request opens its own
// upstream connection, which closes when the client hangs up (or shuts down its sending side).
// Protocol upgrades (exec, port-forward) are not supported.
//
// Faults, each changeable while requests flow: answers with a Kubernetes Status instead of
// forwarding (FailNext), latency before each request (SetLatencyMs), and abrupt closes of watch
// connections, now (DropWatches) or after a number of events (SetDropWatchesAfterEvents). A
// dropped watch's client sees its connection end without the terminating chunk: a broken
// stream, never a clean end.
//
// Thread-safety: every method may be called from any thread. Failure: Start() fails when it
// cannot listen or load the CA; a request that cannot reach the upstream server gets a 502 with
// a Status body; an upstream response that breaks off breaks the downstream connection off too.
// Destruction closes every connection (clients see them break) and joins every thread.
class KubeFaultProxy {
 public:
  // `upstream_url`: "https://HOST:PORT" (verified against `ca_file`, PEM) or "http://HOST:PORT".
  static absl::StatusOr<std::unique_ptr<KubeFaultProxy>> Start(const std::string& upstream_url,
                                                               const std::string& ca_file);

  ~KubeFaultProxy();
  KubeFaultProxy(const KubeFaultProxy&) = delete;
  KubeFaultProxy& operator=(const KubeFaultProxy&) = delete;

  // "http://127.0.0.1:PORT".
  std::string url() const;
  int port() const { return port_; }

  // The next `count` requests whose method is `method` (any when empty) and whose path and query
  // contain `path_substring` get `status` with a Kubernetes Status JSON body (reason
  // TooManyRequests, InternalError, ServiceUnavailable, ... after the status) and, when
  // `retry_after_s` >= 0, a Retry-After header (and details.retryAfterSeconds); they are not
  // forwarded. Rules apply in the order they were added; a request uses up at most one.
  void FailNext(int count, int status, std::string path_substring = "", std::string method = "",
                int retry_after_s = -1);
  // Forgets the rules that FailNext added and that are not used up.
  void ClearFailures();

  // Waits `ms` (0: none) before answering or forwarding each request that arrives afterwards.
  void SetLatencyMs(int ms);

  // Abruptly closes every open watch connection (?watch=true, ?watch=1, or a /watch/ path) now,
  // mid-stream, without the terminating chunk. Returns how many it closed.
  int DropWatches();

  // Closes each watch abruptly once it has forwarded `events` events (lines of its body, as the
  // server sent it) in total, right after the last of them; watches open now count what they
  // have already forwarded. 0 turns it off. Counted in watches_dropped().
  void SetDropWatchesAfterEvents(int events);

  // Requests received (faulted ones included), in total and those whose path and query contain
  // `path_substring` and whose method is `method` (any when empty).
  int64_t requests_seen() const;
  int64_t RequestsSeen(std::string_view path_substring, std::string_view method = "") const;
  // Requests answered by a FailNext rule.
  int64_t faults_injected() const;
  // Watch requests forwarded, and those still streaming.
  int64_t watches_opened() const;
  int watches_active() const;
  // Watches closed by DropWatches or SetDropWatchesAfterEvents.
  int64_t watches_dropped() const;

  // Blocks until at least `count` watches are streaming; false when `timeout` passed first.
  bool WaitForActiveWatches(int count, std::chrono::milliseconds timeout) const;

 private:
  struct FailureRule {
    int remaining;
    int status;
    std::string path_substring;
    std::string method;
    int retry_after_s;
  };

  // One downstream connection and the thread that serves it. The thread owns the sockets and
  // closes them; others only shut them down (DropLocked), under mu_. Every field but `thread`
  // is guarded by mu_, except that the serving thread reads `fd`, which only it changes, freely.
  struct Connection {
    int fd = -1;
    // The upstream socket of the request in flight, -1 between requests.
    int upstream_fd = -1;
    bool is_watch = false;
    int64_t events_forwarded = 0;
    // Set (with the sockets shut down) to end the connection abruptly.
    bool dropped = false;
    bool done = false;
    std::thread thread;
  };

  struct Request;
  struct Upstream;

  KubeFaultProxy() = default;

  void AcceptLoop();
  void Serve(Connection* connection);
  // Serves one request; false when the connection must close.
  bool Forward(Connection* connection, const Request& request);
  // Sends `request` upstream and its response downstream; false when the connection must close.
  bool StreamResponse(Connection* connection, const Request& request, bool is_watch,
                      Upstream* upstream);
  // The rule that `request` uses up, if any, as its status and Retry-After.
  bool TakeFailure(const Request& request, int* status, int* retry_after_s);
  // Shuts the connection's sockets down so that its thread and its client see it end.
  void DropLocked(Connection* connection) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Joins and forgets the connections whose threads have finished.
  void ReapConnections();
  absl::StatusOr<std::unique_ptr<Upstream>> ConnectUpstream(Connection* connection);

  std::string upstream_host_;
  int upstream_port_ = 0;
  bool upstream_tls_ = false;
  ssl_ctx_st* ssl_context_ = nullptr;
  int listen_fd_ = -1;
  int port_ = 0;
  std::thread accept_thread_;

  mutable Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::list<std::unique_ptr<Connection>> connections_ ABSL_GUARDED_BY(mu_);
  std::vector<FailureRule> rules_ ABSL_GUARDED_BY(mu_);
  int latency_ms_ ABSL_GUARDED_BY(mu_) = 0;
  int drop_after_events_ ABSL_GUARDED_BY(mu_) = 0;
  // "METHOD path?query" of every request received.
  std::vector<std::string> request_log_ ABSL_GUARDED_BY(mu_);
  int64_t faults_injected_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t watches_opened_ ABSL_GUARDED_BY(mu_) = 0;
  int watches_active_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t watches_dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace clusterprof::testing

#endif  // CLUSTERPROF_TESTS_SUPPORT_KUBE_FAULT_PROXY_H_
