// One HTTP/1.1 GET whose response body is read as it arrives (a Kubernetes watch), on the
// caller's thread, over a connection of its own (TLS or plain). Reads are synchronous with an
// idle limit; Cancel() from any thread shuts the socket down (shutdown(2)), which ends a blocked
// read at once. No I/O runs on any other thread, so nothing can be left holding a socket that
// is being torn down (the hazard of cancelling a streaming cpprestsdk response).
#ifndef CLUSTERPROF_COMMON_HTTP_STREAM_H_
#define CLUSTERPROF_COMMON_HTTP_STREAM_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/clock.h"

namespace clusterprof::http {

struct StreamTls {
  // PEM CA bundle; empty: the system's trust store.
  std::string ca_pem;
  // PEM client certificate chain and key; empty: none.
  std::string client_cert_pem;
  std::string client_key_pem;
  bool insecure_skip_verify = false;
};

struct StreamRequest {
  // "https://host:port" or "http://host:port" (no path).
  std::string server;
  // The path and query: "/api/v1/pods?watch=true".
  std::string target;
  std::vector<std::pair<std::string, std::string>> headers;
  StreamTls tls;
  // Connecting, the TLS handshake and the response header must take less than this.
  int64_t connect_timeout_ns = 30 * kNanosPerSecond;
  // The body may stay silent this long before Read() gives up (DeadlineExceeded).
  int64_t idle_timeout_ns = 600 * kNanosPerSecond;
};

class ResponseStream {
 public:
  // Connects, sends the request and reads the response header. Unavailable when the server
  // cannot be reached or the connection breaks; DeadlineExceeded after connect_timeout_ns;
  // InvalidArgument for a bad server URL or TLS material.
  static absl::StatusOr<std::unique_ptr<ResponseStream>> Open(const StreamRequest& request);
  ~ResponseStream();
  ResponseStream(const ResponseStream&) = delete;
  ResponseStream& operator=(const ResponseStream&) = delete;

  int status_code() const;
  // A response header's value ("" when absent).
  std::string Header(std::string_view name) const;

  // The next piece of the body (chunked encoding removed), at most `max` bytes; empty at the
  // body's end. Unavailable when the connection broke or was cancelled; DeadlineExceeded after
  // idle_timeout_ns without a byte. One thread at a time.
  absl::StatusOr<std::string> Read(size_t max = 64 << 10);
  // The rest of the body, up to `limit` bytes (for error answers).
  absl::StatusOr<std::string> ReadAll(size_t limit = 1 << 20);

  // Ends the stream from any thread: a blocked Read returns Unavailable, and so does every Read
  // after. Idempotent.
  void Cancel();

  class Connection;

 private:
  explicit ResponseStream(std::unique_ptr<Connection> connection);
  std::unique_ptr<Connection> connection_;
};

}  // namespace clusterprof::http

#endif  // CLUSTERPROF_COMMON_HTTP_STREAM_H_
