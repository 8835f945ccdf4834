// An in-process http::Transport for tests of HTTP clients (kube::RestClient, gcs::Client, the
// GCS credentials): each request goes to the handler routed for its server and is recorded; no
// socket is opened. What only a real connection shows (TLS, a reset mid-body, a slow stream)
// stays with the loopback servers (gcs_test_server.h, kube_fault_proxy.h).
#ifndef CLUSTERPROF_TESTS_SUPPORT_FAKE_HTTP_TRANSPORT_H_
#define CLUSTERPROF_TESTS_SUPPORT_FAKE_HTTP_TRANSPORT_H_

#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "common/base/mutex.h"
#include "common/http/transport.h"

namespace clusterprof::testing {

// A request as it was sent, body copied.
struct RecordedRequest {
  std::string method;
  std::string url;
  http::Headers headers;
  std::string body;
  std::string content_type;
  int64_t timeout_ns = 0;

  // The value of the first header named `name` (case-insensitive), or "".
  std::string Header(std::string_view name) const;
};

// A response with `status`, `body` and `headers`.
http::Response Reply(int status, std::string body = "", http::Headers headers = {});

// Thread-safe.
class FakeHttpTransport final : public http::Transport {
 public:
  // What a server answers; an error is "no answer" (UNAVAILABLE, DEADLINE_EXCEEDED).
  using Handler = std::function<absl::StatusOr<http::Response>(const http::Request&)>;

  // Sends requests whose URL starts with `base` ("http://127.0.0.1:9") to `handler`; the longest
  // matching base wins. A request no route matches is UNAVAILABLE ("connection refused").
  void Route(std::string base, Handler handler);
  // The next requests get these answers, in order, whatever their URL (before any route).
  void Enqueue(absl::StatusOr<http::Response> answer);

  absl::StatusOr<http::Response> Send(const http::Request& request) override;

  std::vector<RecordedRequest> Requests() const;
  int count() const;

 private:
  mutable Mutex mu_;
  std::vector<std::pair<std::string, Handler>> routes_ ABSL_GUARDED_BY(mu_);
  std::deque<absl::StatusOr<http::Response>> queued_ ABSL_GUARDED_BY(mu_);
  std::vector<RecordedRequest> requests_ ABSL_GUARDED_BY(mu_);
};

}  // namespace clusterprof::testing

#endif  // CLUSTERPROF_TESTS_SUPPORT_FAKE_HTTP_TRANSPORT_H_
