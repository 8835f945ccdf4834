#include "tests/support/kube_fault_proxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <optional>
#include <utility>

#include "common/base/json_escape.h"
#include "common/base/strings.h"
#include "common/http/status.h"
#include "operator/kube/api_error.h"

namespace clusterprof::testing {
namespace {

// Limits on what a client or the upstream server may send in a request or response head.
constexpr size_t kMaxHeadBytes = size_t{64} * 1024;
constexpr size_t kReadBufferBytes = size_t{16} * 1024;

using Headers = std::vector<std::pair<std::string, std::string>>;

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

bool ContainsIgnoreCase(std::string_view text, std::string_view word) {
  for (size_t i = 0; i + word.size() <= text.size(); ++i) {
    if (EqualsIgnoreCase(text.substr(i, word.size()), word)) return true;
  }
  return false;
}

const std::string* FindHeader(const Headers& headers, std::string_view name) {
  for (const auto& [key, value] : headers) {
    if (EqualsIgnoreCase(key, name)) return &value;
  }
  return nullptr;
}

// Headers that describe one hop (RFC 9110 section 7.6.1) or the framing, which the proxy sets
// itself on each side.
bool IsHopByHop(std::string_view name) {
  for (std::string_view hop :
       {"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "Proxy-Authorization",
        "TE", "Trailer", "Transfer-Encoding", "Upgrade", "Content-Length", "Host", "Expect"}) {
    if (EqualsIgnoreCase(name, hop)) return true;
  }
  return false;
}

std::optional<uint64_t> ParseNumber(std::string_view text, int base = 10) {
  text = StripAsciiWhitespace(text);
  uint64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value, base);
  if (error != std::errc() || text.empty()) return std::nullopt;
  // A chunk size may carry extensions after ';'.
  if (end != text.data() + text.size() && *end != ';') return std::nullopt;
  return value;
}

// Parses "Name: value" lines (the head without its first line) into `headers`.
bool ParseHeaders(std::string_view head, Headers* headers) {
  for (std::string_view line : SplitSkipEmpty(head, '\n')) {
    ConsumeSuffix(&line, "\r");
    if (line.empty()) continue;
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos || colon == 0) return false;
    headers->emplace_back(std::string(line.substr(0, colon)),
                          std::string(StripAsciiWhitespace(line.substr(colon + 1))));
  }
  return true;
}

// A Kubernetes Status response, complete with head.
std::string StatusResponse(int status, std::string_view message, int retry_after_s,
                           bool keep_alive) {
  const std::string body = StrCat(kube::StatusBody(status, "", message, retry_after_s), "\n");
  std::string response = StrCat("HTTP/1.1 ", status, " ", http::ReasonPhrase(status),
                                "\r\nContent-Type: application/json\r\n"
                                "Cache-Control: no-cache, private\r\nContent-Length: ",
                                body.size(), "\r\n");
  if (retry_after_s >= 0) StrAppend(&response, "Retry-After: ", retry_after_s, "\r\n");
  if (!keep_alive) StrAppend(&response, "Connection: close\r\n");
  StrAppend(&response, "\r\n", body);
  return response;
}

// Whether a request for `target` (path and query) is a watch: ?watch=true or ?watch=1, or a
// path under the deprecated /watch/ prefixes (/api/v1/watch/..., /apis/G/V/watch/...).
bool IsWatchTarget(std::string_view target) {
  const size_t question = target.find('?');
  const std::string_view path = target.substr(0, question);
  if (path.find("/watch/") != std::string_view::npos) return true;
  if (question == std::string_view::npos) return false;
  for (std::string_view parameter : SplitSkipEmpty(target.substr(question + 1), '&')) {
    if (parameter == "watch=true" || parameter == "watch=1") return true;
  }
  return false;
}

// Writes all of `data` to the socket; false when the peer is gone.
bool SendAll(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t sent = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) return false;
    data.remove_prefix(static_cast<size_t>(sent));
  }
  return true;
}

// Something to read bytes from: > 0 bytes read, 0 at a clean end, < 0 on an error.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual ssize_t ReadSome(char* data, size_t size) = 0;
};

class SocketSource : public ByteSource {
 public:
  explicit SocketSource(int fd) : fd_(fd) {}
  ssize_t ReadSome(char* data, size_t size) override {
    while (true) {
      const ssize_t received = recv(fd_, data, size, 0);
      if (received < 0 && errno == EINTR) continue;
      return received;
    }
  }

 private:
  const int fd_;
};

// Buffers a ByteSource for reading heads line-wise and bodies piece-wise.
class BufferedReader {
 public:
  explicit BufferedReader(ByteSource* source) : source_(source) {}

  // Reads through the first `delimiter` (returned, delimiter included, in `out`); false at the
  // end of the source, on an error, or after `max` bytes without one.
  bool ReadThrough(std::string_view delimiter, size_t max, std::string* out) {
    size_t searched = 0;
    while (true) {
      const size_t found = buffer_.find(delimiter, searched);
      if (found != std::string::npos) {
        const size_t end = found + delimiter.size();
        out->assign(buffer_, 0, end);
        buffer_.erase(0, end);
        return true;
      }
      if (buffer_.size() > max) return false;
      searched = buffer_.size() < delimiter.size() ? 0 : buffer_.size() - delimiter.size() + 1;
      if (!Fill()) return false;
    }
  }

  // Appends exactly `size` bytes to `out`; false when the source ends first.
  bool ReadExactly(size_t size, std::string* out) {
    while (size > 0) {
      std::string piece;
      if (ReadSome(size, &piece) <= 0) return false;
      size -= piece.size();
      out->append(piece);
    }
    return true;
  }

  // Sets `out` to what is buffered, or else to what one read of the source brings, at most
  // `max` bytes. Returns its size, 0 at a clean end, < 0 on an error.
  ssize_t ReadSome(size_t max, std::string* out) {
    if (buffer_.empty()) {
      char data[kReadBufferBytes];
      const ssize_t received = source_->ReadSome(data, sizeof(data));
      if (received <= 0) return received;
      buffer_.append(data, static_cast<size_t>(received));
    }
    const size_t size = std::min(max, buffer_.size());
    out->assign(buffer_, 0, size);
    buffer_.erase(0, size);
    return static_cast<ssize_t>(size);
  }

 private:
  bool Fill() {
    char data[kReadBufferBytes];
    const ssize_t received = source_->ReadSome(data, sizeof(data));
    if (received <= 0) return false;
    buffer_.append(data, static_cast<size_t>(received));
    return true;
  }

  ByteSource* const source_;
  std::string buffer_;
};

// `line` without its terminating "\r\n".
std::string_view WithoutCrlf(std::string_view line) {
  ConsumeSuffix(&line, "\r\n");
  return line;
}

// Reads a chunked body to its end (trailers dropped) into `body`; false when it is malformed or
// the source ends first.
bool ReadChunkedBody(BufferedReader* reader, std::string* body) {
  while (true) {
    std::string size_line;
    if (!reader->ReadThrough("\r\n", kMaxHeadBytes, &size_line)) return false;
    const std::optional<uint64_t> size = ParseNumber(WithoutCrlf(size_line), 16);
    if (!size.has_value()) return false;
    if (*size == 0) break;
    std::string crlf;
    if (!reader->ReadExactly(*size, body) || !reader->ReadExactly(2, &crlf) || crlf != "\r\n") {
      return false;
    }
  }
  for (std::string trailer; trailer != "\r\n";) {
    if (!reader->ReadThrough("\r\n", kMaxHeadBytes, &trailer)) return false;
  }
  return true;
}

std::string OpenSslErrors() {
  std::string errors;
  while (const unsigned long error = ERR_get_error()) {
    char text[256];
    ERR_error_string_n(error, text, sizeof(text));
    StrAppend(&errors, errors.empty() ? "" : "; ", text);
  }
  return errors.empty() ? "no details from OpenSSL" : errors;
}

}  // namespace

// A request as the client sent it, its body decoded.
struct KubeFaultProxy::Request {
  std::string method;
  // Path and query.
  std::string target;
  Headers headers;
  std::string body;
  bool keep_alive = true;
};

// One upstream connection over a non-blocking socket, TLS or plain. Reads also watch the
// downstream socket: they fail when the client hangs up or the connection is dropped.
struct KubeFaultProxy::Upstream : public ByteSource {
  ~Upstream() override {
    if (ssl != nullptr) SSL_free(ssl);
  }

  // Waits for `events` on the upstream socket; false when the downstream socket hung up first.
  bool Wait(short events) {
    pollfd fds[2] = {{fd, events, 0}, {downstream_fd, POLLRDHUP, 0}};
    while (true) {
      const int ready = poll(fds, 2, -1);
      if (ready < 0 && errno == EINTR) continue;
      if (ready < 0) return false;
      if (fds[1].revents != 0) return false;
      if (fds[0].revents != 0) return true;
    }
  }

  // Waits for what an SSL call returning `result` needs; false when it failed for good.
  bool WaitForSsl(int result) {
    switch (SSL_get_error(ssl, result)) {
      case SSL_ERROR_WANT_READ:
        return Wait(POLLIN);
      case SSL_ERROR_WANT_WRITE:
        return Wait(POLLOUT);
      default:
        return false;
    }
  }

  absl::Status Handshake(const std::string& host) {
    while (true) {
      ERR_clear_error();
      const int result = SSL_connect(ssl);
      if (result == 1) return absl::OkStatus();
      if (!WaitForSsl(result)) {
        const long verify = SSL_get_verify_result(ssl);
        return absl::UnavailableError(
            StrCat("TLS handshake with ", host, " failed: ", OpenSslErrors(),
                   verify != X509_V_OK ? StrCat(" (", X509_verify_cert_error_string(verify), ")")
                                       : std::string()));
      }
    }
  }

  bool WriteAll(std::string_view data) {
    while (!data.empty()) {
      ssize_t written;
      if (ssl != nullptr) {
        ERR_clear_error();
        const int result = SSL_write(ssl, data.data(), static_cast<int>(data.size()));
        if (result <= 0) {
          if (!WaitForSsl(result)) return false;
          continue;
        }
        written = result;
      } else {
        written = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
        if (written < 0 && (errno == EAGAIN || errno == EINTR)) {
          if (!Wait(POLLOUT)) return false;
          continue;
        }
        if (written <= 0) return false;
      }
      data.remove_prefix(static_cast<size_t>(written));
    }
    return true;
  }

  ssize_t ReadSome(char* data, size_t size) override {
    while (true) {
      if (ssl != nullptr) {
        ERR_clear_error();
        const int result = SSL_read(ssl, data, static_cast<int>(size));
        if (result > 0) return result;
        if (SSL_get_error(ssl, result) == SSL_ERROR_ZERO_RETURN) return 0;
        if (!WaitForSsl(result)) return -1;
      } else {
        const ssize_t received = recv(fd, data, size, 0);
        if (received >= 0) return received;
        if (errno != EAGAIN && errno != EINTR) return -1;
        if (!Wait(POLLIN)) return -1;
      }
    }
  }

  int fd = -1;
  int downstream_fd = -1;
  SSL* ssl = nullptr;
};

absl::StatusOr<std::unique_ptr<KubeFaultProxy>> KubeFaultProxy::Start(
    const std::string& upstream_url, const std::string& ca_file) {
  std::unique_ptr<KubeFaultProxy> proxy(new KubeFaultProxy());
  std::string_view rest = upstream_url;
  if (ConsumePrefix(&rest, "https://")) {
    proxy->upstream_tls_ = true;
  } else if (!ConsumePrefix(&rest, "http://")) {
    return absl::InvalidArgumentError(StrCat("upstream URL ", upstream_url,
                                             " is neither https://HOST:PORT nor http://HOST:PORT"));
  }
  ConsumeSuffix(&rest, "/");
  const size_t colon = rest.rfind(':');
  const std::optional<uint64_t> port =
      colon == std::string_view::npos ? std::nullopt : ParseNumber(rest.substr(colon + 1));
  if (!port.has_value() || *port == 0 || *port > 65535 || rest.find('/') != rest.npos) {
    return absl::InvalidArgumentError(
        StrCat("upstream URL ", upstream_url, " lacks a port (want SCHEME://HOST:PORT)"));
  }
  proxy->upstream_host_ = std::string(rest.substr(0, colon));
  proxy->upstream_port_ = static_cast<int>(*port);

  if (proxy->upstream_tls_) {
    proxy->ssl_context_ = SSL_CTX_new(TLS_client_method());
    if (proxy->ssl_context_ == nullptr) {
      return absl::InternalError(StrCat("SSL_CTX_new: ", OpenSslErrors()));
    }
    if (SSL_CTX_load_verify_locations(proxy->ssl_context_, ca_file.c_str(), nullptr) != 1) {
      return absl::InvalidArgumentError(
          StrCat("cannot load CA certificates from ", ca_file, ": ", OpenSslErrors()));
    }
    SSL_CTX_set_verify(proxy->ssl_context_, SSL_VERIFY_PEER, nullptr);
  }

  proxy->listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (proxy->listen_fd_ < 0) {
    return absl::InternalError(StrCat("socket: ", std::strerror(errno)));
  }
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  if (bind(proxy->listen_fd_, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0 ||
      listen(proxy->listen_fd_, 64) != 0 ||
      getsockname(proxy->listen_fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return absl::InternalError(StrCat("cannot listen on 127.0.0.1: ", std::strerror(errno)));
  }
  proxy->port_ = ntohs(address.sin_port);
  proxy->accept_thread_ = std::thread([p = proxy.get()] { p->AcceptLoop(); });
  return proxy;
}

KubeFaultProxy::~KubeFaultProxy() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    for (const std::unique_ptr<Connection>& connection : connections_) DropLocked(connection.get());
  }
  // Wakes accept().
  if (listen_fd_ >= 0) shutdown(listen_fd_, SHUT_RDWR);
  if (accept_thread_.joinable()) accept_thread_.join();
  std::list<std::unique_ptr<Connection>> connections;
  {
    MutexLock lock(&mu_);
    connections.swap(connections_);
  }
  for (const std::unique_ptr<Connection>& connection : connections) connection->thread.join();
  if (listen_fd_ >= 0) close(listen_fd_);
  if (ssl_context_ != nullptr) SSL_CTX_free(ssl_context_);
}

std::string KubeFaultProxy::url() const { return StrCat("http://127.0.0.1:", port_); }

void KubeFaultProxy::FailNext(int count, int status, std::string path_substring, std::string method,
                              int retry_after_s) {
  if (count <= 0) return;
  MutexLock lock(&mu_);
  rules_.push_back({count, status, std::move(path_substring), std::move(method), retry_after_s});
}

void KubeFaultProxy::ClearFailures() {
  MutexLock lock(&mu_);
  rules_.clear();
}

void KubeFaultProxy::SetLatencyMs(int ms) {
  MutexLock lock(&mu_);
  latency_ms_ = std::max(ms, 0);
}

int KubeFaultProxy::DropWatches() {
  MutexLock lock(&mu_);
  int dropped = 0;
  for (const std::unique_ptr<Connection>& connection : connections_) {
    if (connection->is_watch && !connection->dropped) {
      DropLocked(connection.get());
      ++watches_dropped_;
      ++dropped;
    }
  }
  return dropped;
}

void KubeFaultProxy::SetDropWatchesAfterEvents(int events) {
  MutexLock lock(&mu_);
  drop_after_events_ = std::max(events, 0);
}

int64_t KubeFaultProxy::requests_seen() const {
  MutexLock lock(&mu_);
  return static_cast<int64_t>(request_log_.size());
}

int64_t KubeFaultProxy::RequestsSeen(std::string_view path_substring,
                                     std::string_view method) const {
  MutexLock lock(&mu_);
  int64_t count = 0;
  for (std::string_view request : request_log_) {
    const size_t space = request.find(' ');
    if (!method.empty() && request.substr(0, space) != method) continue;
    if (request.substr(space + 1).find(path_substring) != std::string_view::npos) ++count;
  }
  return count;
}

int64_t KubeFaultProxy::faults_injected() const {
  MutexLock lock(&mu_);
  return faults_injected_;
}

int64_t KubeFaultProxy::watches_opened() const {
  MutexLock lock(&mu_);
  return watches_opened_;
}

int KubeFaultProxy::watches_active() const {
  MutexLock lock(&mu_);
  return watches_active_;
}

int64_t KubeFaultProxy::watches_dropped() const {
  MutexLock lock(&mu_);
  return watches_dropped_;
}

bool KubeFaultProxy::WaitForActiveWatches(int count, std::chrono::milliseconds timeout) const {
  MutexLock lock(&mu_);
  return mu_.AwaitWithDeadline(
      [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return watches_active_ >= count; },
      std::chrono::steady_clock::now() + timeout);
}

void KubeFaultProxy::DropLocked(Connection* connection) {
  connection->dropped = true;
  // shutdown(), not close(): the serving thread still owns the descriptors, and closes them
  // once it has seen the end. The client sees the connection end (FIN) at once.
  if (connection->fd >= 0) shutdown(connection->fd, SHUT_RDWR);
  if (connection->upstream_fd >= 0) shutdown(connection->upstream_fd, SHUT_RDWR);
}

void KubeFaultProxy::ReapConnections() {
  std::list<std::unique_ptr<Connection>> finished;
  {
    MutexLock lock(&mu_);
    for (auto it = connections_.begin(); it != connections_.end();) {
      if ((*it)->done) {
        finished.push_back(std::move(*it));
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const std::unique_ptr<Connection>& connection : finished) connection->thread.join();
}

void KubeFaultProxy::AcceptLoop() {
  while (true) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    {
      MutexLock lock(&mu_);
      if (stopping_) {
        if (fd >= 0) close(fd);
        return;
      }
    }
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE) {
        // Out of descriptors: give connections time to finish instead of spinning.
        if (errno == EMFILE || errno == ENFILE) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        continue;
      }
      return;
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    ReapConnections();
    MutexLock lock(&mu_);
    // The destructor may have dropped every connection since the check above.
    if (stopping_) {
      close(fd);
      return;
    }
    auto connection = std::make_unique<Connection>();
    connection->fd = fd;
    Connection* raw = connection.get();
    connection->thread = std::thread([this, raw] { Serve(raw); });
    connections_.push_back(std::move(connection));
  }
}

void KubeFaultProxy::Serve(Connection* connection) {
  // OpenSSL writes with write(): a server that went away must not kill the test with SIGPIPE.
  // SIGPIPE is sent to the writing thread, so blocking it here is enough.
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, nullptr);

  const int fd = connection->fd;
  SocketSource source(fd);
  BufferedReader reader(&source);
  while (true) {
    Request request;
    std::string head;
    if (!reader.ReadThrough("\r\n\r\n", kMaxHeadBytes, &head)) break;
    const size_t line_end = head.find("\r\n");
    const std::string_view head_view = head;
    const std::string_view line = head_view.substr(0, line_end);
    const size_t first_space = line.find(' ');
    const size_t last_space = line.rfind(' ');
    if (first_space == std::string_view::npos || first_space == last_space ||
        !ParseHeaders(head_view.substr(line_end + 2), &request.headers)) {
      SendAll(fd, StatusResponse(400, "malformed request head", -1, false));
      break;
    }
    request.method = std::string(line.substr(0, first_space));
    std::string_view target = line.substr(first_space + 1, last_space - first_space - 1);
    // The absolute form, as clients configured with an HTTP proxy send it.
    if (ConsumePrefix(&target, "http://") || ConsumePrefix(&target, "https://")) {
      const size_t slash = target.find('/');
      target = slash == std::string_view::npos ? "/" : target.substr(slash);
    }
    request.target = std::string(target);
    const std::string_view version = line.substr(last_space + 1);
    const std::string* connection_header = FindHeader(request.headers, "Connection");
    request.keep_alive =
        version == "HTTP/1.1" &&
        (connection_header == nullptr || !ContainsIgnoreCase(*connection_header, "close"));

    if (const std::string* expect = FindHeader(request.headers, "Expect");
        expect != nullptr && ContainsIgnoreCase(*expect, "100-continue")) {
      if (!SendAll(fd, "HTTP/1.1 100 Continue\r\n\r\n")) break;
    }
    const std::string* transfer_encoding = FindHeader(request.headers, "Transfer-Encoding");
    const std::string* content_length = FindHeader(request.headers, "Content-Length");
    bool body_ok = true;
    if (transfer_encoding != nullptr && ContainsIgnoreCase(*transfer_encoding, "chunked")) {
      body_ok = ReadChunkedBody(&reader, &request.body);
    } else if (content_length != nullptr) {
      const std::optional<uint64_t> size = ParseNumber(*content_length);
      body_ok = size.has_value() && reader.ReadExactly(*size, &request.body);
    }
    if (!body_ok) {
      SendAll(fd, StatusResponse(400, "malformed or incomplete request body", -1, false));
      break;
    }

    {
      MutexLock lock(&mu_);
      request_log_.push_back(StrCat(request.method, " ", request.target));
    }
    if (!Forward(connection, request) || !request.keep_alive) break;
  }

  MutexLock lock(&mu_);
  close(fd);
  connection->fd = -1;
  connection->done = true;
}

bool KubeFaultProxy::TakeFailure(const Request& request, int* status, int* retry_after_s) {
  MutexLock lock(&mu_);
  for (auto it = rules_.begin(); it != rules_.end(); ++it) {
    if (!it->method.empty() && it->method != request.method) continue;
    if (request.target.find(it->path_substring) == std::string::npos) continue;
    *status = it->status;
    *retry_after_s = it->retry_after_s;
    if (--it->remaining <= 0) rules_.erase(it);
    ++faults_injected_;
    return true;
  }
  return false;
}

absl::StatusOr<std::unique_ptr<KubeFaultProxy::Upstream>> KubeFaultProxy::ConnectUpstream(
    Connection* connection) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* addresses = nullptr;
  const std::string port = StrCat(upstream_port_);
  if (const int error = getaddrinfo(upstream_host_.c_str(), port.c_str(), &hints, &addresses);
      error != 0) {
    return absl::UnavailableError(
        StrCat("cannot resolve ", upstream_host_, ": ", gai_strerror(error)));
  }
  auto upstream = std::make_unique<Upstream>();
  upstream->downstream_fd = connection->fd;
  upstream->fd = socket(addresses->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (upstream->fd < 0) {
    freeaddrinfo(addresses);
    return absl::InternalError(StrCat("socket: ", std::strerror(errno)));
  }
  {
    // Registered (and then closed by Forward) so that DropLocked can shut it down.
    MutexLock lock(&mu_);
    connection->upstream_fd = upstream->fd;
    if (connection->dropped) {
      freeaddrinfo(addresses);
      return absl::CancelledError("the connection was dropped");
    }
  }
  const int connected = connect(upstream->fd, addresses->ai_addr, addresses->ai_addrlen);
  freeaddrinfo(addresses);
  const std::string where = StrCat(upstream_host_, ":", upstream_port_);
  if (connected != 0 && errno != EINPROGRESS) {
    return absl::UnavailableError(StrCat("cannot connect to ", where, ": ", std::strerror(errno)));
  }
  if (connected != 0) {
    int error = 0;
    socklen_t length = sizeof(error);
    if (!upstream->Wait(POLLOUT) ||
        getsockopt(upstream->fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0 || error != 0) {
      return absl::UnavailableError(
          StrCat("cannot connect to ", where, ": ", std::strerror(error != 0 ? error : EPIPE)));
    }
  }
  if (upstream_tls_) {
    upstream->ssl = SSL_new(ssl_context_);
    if (upstream->ssl == nullptr) return absl::InternalError(StrCat("SSL_new: ", OpenSslErrors()));
    SSL_set_fd(upstream->ssl, upstream->fd);
    // The serving certificate must name the host we connect to: an IP address SAN or a DNS name.
    X509_VERIFY_PARAM* verify = SSL_get0_param(upstream->ssl);
    if (X509_VERIFY_PARAM_set1_ip_asc(verify, upstream_host_.c_str()) != 1) {
      SSL_set_tlsext_host_name(upstream->ssl, upstream_host_.c_str());
      X509_VERIFY_PARAM_set1_host(verify, upstream_host_.c_str(), 0);
    }
    if (absl::Status status = upstream->Handshake(where); !status.ok()) return status;
  }
  return upstream;
}

bool KubeFaultProxy::Forward(Connection* connection, const Request& request) {
  const int fd = connection->fd;
  const bool is_watch = IsWatchTarget(request.target);
  {
    MutexLock lock(&mu_);
    if (latency_ms_ > 0) {
      const auto deadline =
          std::chrono::steady_clock::now() + std::chrono::milliseconds(latency_ms_);
      mu_.AwaitWithDeadline(
          [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stopping_ || connection->dropped; },
          deadline);
    }
    if (stopping_ || connection->dropped) return false;
  }
  int status = 0;
  int retry_after_s = -1;
  if (TakeFailure(request, &status, &retry_after_s)) {
    return SendAll(fd, StatusResponse(status,
                                      StrCat("injected by KubeFaultProxy for ", request.method, " ",
                                             request.target),
                                      retry_after_s, request.keep_alive));
  }

  if (is_watch) {
    MutexLock lock(&mu_);
    connection->is_watch = true;
    connection->events_forwarded = 0;
    ++watches_opened_;
    ++watches_active_;
  }
  absl::StatusOr<std::unique_ptr<Upstream>> upstream = ConnectUpstream(connection);
  // Set when the downstream connection must close: the upstream response broke off, the client
  // went away, or the connection was dropped.
  bool broken = false;
  if (!upstream.ok()) {
    bool dropped;
    {
      MutexLock lock(&mu_);
      dropped = connection->dropped;
    }
    broken =
        dropped ||
        !SendAll(fd, StatusResponse(502, StrCat("KubeFaultProxy: ", upstream.status().ToString()),
                                    -1, request.keep_alive));
  } else {
    broken = !StreamResponse(connection, request, is_watch, upstream->get());
  }

  MutexLock lock(&mu_);
  if (connection->upstream_fd >= 0) {
    close(connection->upstream_fd);
    connection->upstream_fd = -1;
  }
  if (is_watch) {
    connection->is_watch = false;
    --watches_active_;
  }
  return !broken && !connection->dropped;
}

bool KubeFaultProxy::StreamResponse(Connection* connection, const Request& request, bool is_watch,
                                    Upstream* upstream) {
  const int fd = connection->fd;
  // Answers 502 and closes, unless the connection was dropped: then it just closes.
  auto bad_gateway = [&](std::string_view what) {
    bool dropped;
    {
      MutexLock lock(&mu_);
      dropped = connection->dropped;
    }
    if (!dropped) SendAll(fd, StatusResponse(502, StrCat("KubeFaultProxy: ", what), -1, false));
    return false;
  };

  std::string head = StrCat(request.method, " ", request.target,
                            " HTTP/1.1\r\nHost: ", upstream_host_, ":", upstream_port_, "\r\n");
  for (const auto& [name, value] : request.headers) {
    if (!IsHopByHop(name)) StrAppend(&head, name, ": ", value, "\r\n");
  }
  if (!request.body.empty() || request.method == "POST" || request.method == "PUT" ||
      request.method == "PATCH") {
    StrAppend(&head, "Content-Length: ", request.body.size(), "\r\n");
  }
  StrAppend(&head, "Connection: close\r\n\r\n");
  if (!upstream->WriteAll(head) || !upstream->WriteAll(request.body)) {
    return bad_gateway("the upstream server went away while receiving the request");
  }

  BufferedReader reader(upstream);
  int status = 0;
  Headers headers;
  while (true) {
    std::string response_head;
    if (!reader.ReadThrough("\r\n\r\n", kMaxHeadBytes, &response_head)) {
      return bad_gateway("no response head from the upstream server");
    }
    const std::string_view response_view = response_head;
    const std::string_view line = response_view.substr(0, response_view.find("\r\n"));
    const size_t space = line.find(' ');
    const std::optional<uint64_t> code =
        space == std::string_view::npos ? std::nullopt : ParseNumber(line.substr(space + 1, 3));
    headers.clear();
    if (!code.has_value() || !ParseHeaders(response_view.substr(line.size() + 2), &headers)) {
      return bad_gateway("malformed response head from the upstream server");
    }
    status = static_cast<int>(*code);
    // Interim responses (100 Continue) are the proxy's business; 101 would switch protocols.
    if (status >= 200 || status == 101) break;
  }
  if (status == 101) return bad_gateway("protocol upgrades are not supported");

  enum class Framing { kNone, kLength, kChunked, kUntilClose };
  Framing framing = Framing::kUntilClose;
  uint64_t length = 0;
  const std::string* transfer_encoding = FindHeader(headers, "Transfer-Encoding");
  const std::string* content_length = FindHeader(headers, "Content-Length");
  if (request.method == "HEAD" || status == 204 || status == 304) {
    framing = Framing::kNone;
  } else if (transfer_encoding != nullptr && ContainsIgnoreCase(*transfer_encoding, "chunked")) {
    framing = Framing::kChunked;
  } else if (content_length != nullptr) {
    const std::optional<uint64_t> parsed = ParseNumber(*content_length);
    if (!parsed.has_value()) return bad_gateway("bad Content-Length from the upstream server");
    framing = Framing::kLength;
    length = *parsed;
  }

  // Downstream, a body of known length keeps it; any other body goes chunked.
  const bool chunked_downstream = framing == Framing::kChunked || framing == Framing::kUntilClose;
  std::string downstream_head =
      StrCat("HTTP/1.1 ", status, " ", http::ReasonPhrase(status), "\r\n");
  for (const auto& [name, value] : headers) {
    if (!IsHopByHop(name)) StrAppend(&downstream_head, name, ": ", value, "\r\n");
  }
  if (content_length != nullptr && framing != Framing::kChunked) {
    StrAppend(&downstream_head, "Content-Length: ", *content_length, "\r\n");
  }
  if (chunked_downstream) StrAppend(&downstream_head, "Transfer-Encoding: chunked\r\n");
  if (!request.keep_alive) StrAppend(&downstream_head, "Connection: close\r\n");
  StrAppend(&downstream_head, "\r\n");
  if (!SendAll(fd, downstream_head)) return false;

  // Writes one piece of the body downstream as it came; false when the connection must close.
  auto forward = [&](std::string_view piece) {
    bool drop_after = false;
    if (is_watch) {
      MutexLock lock(&mu_);
      if (connection->dropped) return false;
      int64_t events = std::count(piece.begin(), piece.end(), '\n');
      if (drop_after_events_ > 0) {
        const int64_t left = drop_after_events_ - connection->events_forwarded;
        if (left <= 0) {
          DropLocked(connection);
          ++watches_dropped_;
          return false;
        }
        if (events >= left) {
          size_t end = 0;
          for (int64_t i = 0; i < left; ++i) end = piece.find('\n', end) + 1;
          piece = piece.substr(0, end);
          events = left;
          drop_after = true;
        }
      }
      connection->events_forwarded += events;
    }
    if (!piece.empty()) {
      if (chunked_downstream) {
        char size[32];
        std::snprintf(size, sizeof(size), "%zx\r\n", piece.size());
        if (!SendAll(fd, StrCat(size, piece, "\r\n"))) return false;
      } else if (!SendAll(fd, piece)) {
        return false;
      }
    }
    if (drop_after) {
      MutexLock lock(&mu_);
      if (!connection->dropped) {
        DropLocked(connection);
        ++watches_dropped_;
      }
      return false;
    }
    return true;
  };

  std::string piece;
  switch (framing) {
    case Framing::kNone:
      break;
    case Framing::kLength:
      while (length > 0) {
        if (reader.ReadSome(std::min<uint64_t>(length, kReadBufferBytes), &piece) <= 0) {
          return false;
        }
        length -= piece.size();
        if (!forward(piece)) return false;
      }
      break;
    case Framing::kUntilClose:
      while (true) {
        const ssize_t read = reader.ReadSome(kReadBufferBytes, &piece);
        if (read < 0) return false;
        if (read == 0) break;
        if (!forward(piece)) return false;
      }
      break;
    case Framing::kChunked:
      while (true) {
        std::string size_line;
        if (!reader.ReadThrough("\r\n", kMaxHeadBytes, &size_line)) return false;
        const std::optional<uint64_t> size = ParseNumber(WithoutCrlf(size_line), 16);
        if (!size.has_value()) return false;
        if (*size == 0) break;
        for (uint64_t left = *size; left > 0; left -= piece.size()) {
          if (reader.ReadSome(std::min<uint64_t>(left, kReadBufferBytes), &piece) <= 0) {
            return false;
          }
          if (!forward(piece)) return false;
        }
        std::string crlf;
        if (!reader.ReadExactly(2, &crlf) || crlf != "\r\n") return false;
      }
      // Trailers, which are not forwarded, up to the empty line.
      for (std::string trailer; trailer != "\r\n";) {
        if (!reader.ReadThrough("\r\n", kMaxHeadBytes, &trailer)) return false;
      }
      break;
  }
  return !chunked_downstream || SendAll(fd, "0\r\n\r\n");
}

}  // namespace clusterprof::testing
