// The seam under every HTTP client of clusterprof (the Kubernetes API, GCS, Google's token
// endpoints): a Request goes out, a whole Response comes back. What a status code means is each
// API's business (common/http/status.h); a Transport only says whether an answer came.
//
// NewCppRestTransport is the real one (cpprestsdk, pooled connections); tests put an in-process
// fake under a client (tests/support/fake_http_transport.h). Watches, which stream, have
// connections of their own (stream.h).
#ifndef CLUSTERPROF_COMMON_HTTP_TRANSPORT_H_
#define CLUSTERPROF_COMMON_HTTP_TRANSPORT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace boost::asio::ssl {
class context;
}  // namespace boost::asio::ssl

namespace clusterprof::http {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct Request {
  std::string method = "GET";
  // Absolute: http[s]://host[:port]/path?query.
  std::string url;
  Headers headers;
  // The body, sent from the caller's buffer (it must stay valid until Send returns). Without
  // one, PUT and POST send Content-Length: 0.
  std::optional<std::string_view> body;
  std::string content_type;
  // Limit on the whole exchange (connection included); 0: the transport's own.
  int64_t timeout_ns = 0;
};

struct Response {
  int status = 0;
  Headers headers;
  std::string body;

  // The value of the first header named `name` (case-insensitive), or "".
  std::string Header(std::string_view name) const;
};

// Thread-safe.
class Transport {
 public:
  virtual ~Transport() = default;
  // Sends `request` and reads the whole response; any HTTP status is a Response. An error means
  // no whole answer came: DEADLINE_EXCEEDED when the time ran out, UNAVAILABLE otherwise (no
  // connection, TLS, a connection that broke); its message is the cause alone, for the client
  // to put in its own words.
  virtual absl::StatusOr<Response> Send(const Request& request) = 0;
};

struct CppRestTransportOptions {
  int64_t timeout_ns = 30'000'000'000;
  // Bytes per piece a request body is sent in; 0: cpprestsdk's default.
  size_t chunk_size = 0;
  bool validate_certificates = true;
  // Sets up each TLS context (trusted CAs, client certificates); nullptr: the system's CAs.
  std::function<void(boost::asio::ssl::context&)> configure_tls;
};

// cpprestsdk underneath: one pooled client per scheme://host:port and timeout. Redirects are
// not followed (cpprestsdk's follower races with its I/O threads over the request's headers,
// and none of our servers redirect).
std::unique_ptr<Transport> NewCppRestTransport(CppRestTransportOptions options = {});

}  // namespace clusterprof::http

#endif  // CLUSTERPROF_COMMON_HTTP_TRANSPORT_H_
