#include "common/http/stream.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <cerrno>
#include <cstring>

#include "common/base/status.h"
#include "common/base/strings.h"

namespace clusterprof::http {
namespace {

namespace beast = boost::beast;

struct Endpoint {
  bool tls = false;
  std::string host;  // without brackets
  std::string port;
};

absl::StatusOr<Endpoint> ParseServer(std::string_view server) {
  Endpoint endpoint;
  std::string_view rest = server;
  if (ConsumePrefix(&rest, "https://")) {
    endpoint.tls = true;
  } else if (!ConsumePrefix(&rest, "http://")) {
    return absl::InvalidArgumentError(StrCat("\"", server, "\" is not an http(s):// URL"));
  }
  while (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  endpoint.port = endpoint.tls ? "443" : "80";
  if (StartsWith(rest, "[")) {
    const size_t close = rest.find(']');
    if (close == std::string_view::npos) {
      return absl::InvalidArgumentError(StrCat("\"", server, "\": unclosed [ in the host"));
    }
    endpoint.host = std::string(rest.substr(1, close - 1));
    rest.remove_prefix(close + 1);
    if (ConsumePrefix(&rest, ":")) endpoint.port = std::string(rest);
  } else if (const size_t colon = rest.rfind(':'); colon != std::string_view::npos) {
    endpoint.host = std::string(rest.substr(0, colon));
    endpoint.port = std::string(rest.substr(colon + 1));
  } else {
    endpoint.host = std::string(rest);
  }
  if (endpoint.host.empty() || endpoint.port.empty()) {
    return absl::InvalidArgumentError(StrCat("\"", server, "\" has no host or port"));
  }
  return endpoint;
}

bool IsIpAddress(const std::string& host) {
  unsigned char buffer[sizeof(in6_addr)];
  return inet_pton(AF_INET, host.c_str(), buffer) == 1 ||
         inet_pton(AF_INET6, host.c_str(), buffer) == 1;
}

std::string OpenSslErrors() {
  std::string out;
  while (unsigned long code = ERR_get_error()) {
    char text[256];
    ERR_error_string_n(code, text, sizeof(text));
    if (!out.empty()) out += "; ";
    out += text;
  }
  return out.empty() ? "unknown TLS error" : out;
}

// Reads every certificate of a PEM bundle.
absl::StatusOr<std::vector<X509*>> ReadCertificates(const std::string& pem, std::string_view what) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  std::vector<X509*> certificates;
  while (X509* certificate = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr)) {
    certificates.push_back(certificate);
  }
  ERR_clear_error();  // the read that ends the loop leaves "no start line"
  BIO_free(bio);
  if (certificates.empty()) {
    return absl::InvalidArgumentError(StrCat(what, ": no PEM certificate in it"));
  }
  return certificates;
}

absl::StatusOr<SSL_CTX*> MakeContext(const StreamTls& tls) {
  SSL_CTX* context = SSL_CTX_new(TLS_client_method());
  if (context == nullptr) return absl::InternalError(OpenSslErrors());
  const auto fail = [&](absl::Status status) {
    SSL_CTX_free(context);
    return status;
  };
  SSL_CTX_set_min_proto_version(context, TLS1_2_VERSION);
  if (tls.insecure_skip_verify) {
    SSL_CTX_set_verify(context, SSL_VERIFY_NONE, nullptr);
  } else {
    SSL_CTX_set_verify(context, SSL_VERIFY_PEER, nullptr);
    if (tls.ca_pem.empty()) {
      SSL_CTX_set_default_verify_paths(context);
    } else {
      absl::StatusOr<std::vector<X509*>> cas = ReadCertificates(tls.ca_pem, "the CA bundle");
      if (!cas.ok()) return fail(cas.status());
      X509_STORE* store = SSL_CTX_get_cert_store(context);
      for (X509* ca : *cas) {
        X509_STORE_add_cert(store, ca);
        X509_free(ca);
      }
    }
  }
  if (!tls.client_cert_pem.empty()) {
    absl::StatusOr<std::vector<X509*>> chain =
        ReadCertificates(tls.client_cert_pem, "the client certificate");
    if (!chain.ok()) return fail(chain.status());
    const int used = SSL_CTX_use_certificate(context, chain->front());
    X509_free(chain->front());
    for (size_t i = 1; i < chain->size(); ++i) SSL_CTX_add_extra_chain_cert(context, (*chain)[i]);
    BIO* bio =
        BIO_new_mem_buf(tls.client_key_pem.data(), static_cast<int>(tls.client_key_pem.size()));
    EVP_PKEY* key = PEM_read_bio_PrivateKey(bio, nullptr, nullptr, nullptr);
    BIO_free(bio);
    if (used != 1 || key == nullptr || SSL_CTX_use_PrivateKey(context, key) != 1 ||
        SSL_CTX_check_private_key(context) != 1) {
      if (key != nullptr) EVP_PKEY_free(key);
      return fail(absl::InvalidArgumentError(
          StrCat("the client certificate or key does not load: ", OpenSslErrors())));
    }
    EVP_PKEY_free(key);
  }
  return context;
}

}  // namespace

class ResponseStream::Connection {
 public:
  ~Connection() {
    if (ssl_ != nullptr) SSL_free(ssl_);
    if (context_ != nullptr) SSL_CTX_free(context_);
    if (fd_ >= 0) close(fd_);
  }

  absl::Status Open(const StreamRequest& request) {
    CLUSTERPROF_ASSIGN_OR_RETURN(Endpoint endpoint, ParseServer(request.server));
    what_ = StrCat("GET ", request.target);
    server_ = request.server;
    idle_timeout_ns_ = request.idle_timeout_ns;
    const int64_t deadline = clock_.MonotonicNs() + request.connect_timeout_ns;
    CLUSTERPROF_RETURN_IF_ERROR(Connect(endpoint, deadline));
    if (endpoint.tls) CLUSTERPROF_RETURN_IF_ERROR(Handshake(endpoint, request.tls, deadline));
    std::string head = StrCat("GET ", request.target, " HTTP/1.1\r\nHost: ", endpoint.host, ":",
                              endpoint.port, "\r\n");
    for (const auto& [name, value] : request.headers) StrAppend(&head, name, ": ", value, "\r\n");
    head += "\r\n";
    CLUSTERPROF_RETURN_IF_ERROR(WriteAll(head, deadline));
    parser_.body_limit(boost::none);
    parser_.eager(true);
    while (!parser_.is_header_done()) CLUSTERPROF_RETURN_IF_ERROR(Fill(deadline));
    return absl::OkStatus();
  }

  int status_code() const { return static_cast<int>(parser_.get().result_int()); }
  std::string Header(std::string_view name) const {
    auto it = parser_.get().find(beast::string_view(name.data(), name.size()));
    return it == parser_.get().end() ? "" : std::string(it->value());
  }

  absl::StatusOr<std::string> Read(size_t max) {
    while (true) {
      std::string& body = parser_.get().body();
      if (!body.empty()) {
        const size_t n = std::min(max, body.size());
        std::string out = body.substr(0, n);
        body.erase(0, n);
        return out;
      }
      if (parser_.is_done()) return std::string();
      CLUSTERPROF_RETURN_IF_ERROR(Fill(clock_.MonotonicNs() + idle_timeout_ns_));
    }
  }

  void Cancel() {
    if (cancelled_.exchange(true)) return;
    // The descriptor stays open (and ours) until the destructor: a blocked poll or read wakes,
    // and no other file can take its number meanwhile.
    if (fd_ >= 0) shutdown(fd_, SHUT_RDWR);
  }

 private:
  absl::Status Broken(std::string_view why) const {
    if (cancelled_) return absl::UnavailableError(StrCat(what_, ": cancelled"));
    return absl::UnavailableError(StrCat(what_, " to ", server_, ": ", why));
  }

  // Waits for `events` on the socket until `deadline` (monotonic).
  absl::Status Wait(short events, int64_t deadline, std::string_view doing) {
    while (true) {
      if (cancelled_) return Broken("cancelled");
      const int64_t left_ns = deadline - clock_.MonotonicNs();
      if (left_ns <= 0) {
        return absl::DeadlineExceededError(
            StrCat(what_, " to ", server_, ": no progress ", doing, " within the time allowed"));
      }
      pollfd entry{fd_, events, 0};
      const int timeout_ms = static_cast<int>(
          std::min<int64_t>((left_ns + kNanosPerMilli - 1) / kNanosPerMilli, 60'000));
      const int ready = poll(&entry, 1, timeout_ms);
      if (ready > 0) return absl::OkStatus();
      if (ready < 0 && errno != EINTR) return Broken(StrCat("poll: ", strerror(errno)));
    }
  }

  absl::Status Connect(const Endpoint& endpoint, int64_t deadline) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* addresses = nullptr;
    if (int error = getaddrinfo(endpoint.host.c_str(), endpoint.port.c_str(), &hints, &addresses);
        error != 0) {
      return absl::UnavailableError(
          StrCat(what_, ": cannot resolve ", endpoint.host, ": ", gai_strerror(error)));
    }
    absl::Status last = absl::UnavailableError(StrCat(what_, ": no address for ", endpoint.host));
    for (addrinfo* address = addresses; address != nullptr; address = address->ai_next) {
      fd_ = socket(address->ai_family, address->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                   address->ai_protocol);
      if (fd_ < 0) continue;
      if (connect(fd_, address->ai_addr, address->ai_addrlen) == 0) break;
      if (errno == EINPROGRESS) {
        last = Wait(POLLOUT, deadline, "connecting");
        int error = 0;
        socklen_t size = sizeof(error);
        if (last.ok() && getsockopt(fd_, SOL_SOCKET, SO_ERROR, &error, &size) == 0 && error == 0) {
          break;
        }
        if (last.ok()) last = Broken(StrCat("connect: ", strerror(error)));
      } else {
        last = Broken(StrCat("connect: ", strerror(errno)));
      }
      close(fd_);
      fd_ = -1;
    }
    freeaddrinfo(addresses);
    return fd_ >= 0 ? absl::OkStatus() : last;
  }

  absl::Status Handshake(const Endpoint& endpoint, const StreamTls& tls, int64_t deadline) {
    CLUSTERPROF_ASSIGN_OR_RETURN(context_, MakeContext(tls));
    ssl_ = SSL_new(context_);
    if (ssl_ == nullptr) return absl::InternalError(OpenSslErrors());
    SSL_set_fd(ssl_, fd_);
    if (IsIpAddress(endpoint.host)) {
      X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl_), endpoint.host.c_str());
    } else {
      SSL_set_tlsext_host_name(ssl_, endpoint.host.c_str());
      SSL_set1_host(ssl_, endpoint.host.c_str());
    }
    while (true) {
      ERR_clear_error();  // see Fill
      const int done = SSL_connect(ssl_);
      if (done == 1) return absl::OkStatus();
      const int error = SSL_get_error(ssl_, done);
      if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) {
        CLUSTERPROF_RETURN_IF_ERROR(Wait(error == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline,
                                         "in the TLS handshake"));
        continue;
      }
      const long verify = SSL_get_verify_result(ssl_);
      if (verify != X509_V_OK) {
        return absl::UnavailableError(StrCat(
            what_, " to ", server_,
            ": the server certificate is not trusted: ", X509_verify_cert_error_string(verify)));
      }
      return Broken(StrCat("TLS handshake: ", OpenSslErrors()));
    }
  }

  absl::Status WriteAll(std::string_view data, int64_t deadline) {
    while (!data.empty()) {
      ssize_t written;
      if (ssl_ != nullptr) {
        ERR_clear_error();  // see Fill
        written = SSL_write(ssl_, data.data(), static_cast<int>(data.size()));
        if (written <= 0) {
          const int error = SSL_get_error(ssl_, static_cast<int>(written));
          if (error != SSL_ERROR_WANT_READ && error != SSL_ERROR_WANT_WRITE) {
            return Broken(StrCat("TLS write: ", OpenSslErrors()));
          }
          CLUSTERPROF_RETURN_IF_ERROR(
              Wait(error == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline, "sending"));
          continue;
        }
      } else {
        written = send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
        if (written < 0) {
          if (errno != EAGAIN && errno != EINTR) return Broken(StrCat("send: ", strerror(errno)));
          CLUSTERPROF_RETURN_IF_ERROR(Wait(POLLOUT, deadline, "sending"));
          continue;
        }
      }
      data.remove_prefix(static_cast<size_t>(written));
    }
    return absl::OkStatus();
  }

  // Reads what the socket has (waiting up to `deadline`) and feeds the parser.
  absl::Status Fill(int64_t deadline) {
    char chunk[16 << 10];
    while (true) {
      if (cancelled_) return Broken("cancelled");
      ssize_t got;
      if (ssl_ != nullptr) {
        // SSL_get_error reads this thread's error queue: an error left there by earlier OpenSSL
        // calls (reading a PEM bundle ends with one) would turn "no data yet" into a failure.
        ERR_clear_error();
        got = SSL_read(ssl_, chunk, sizeof(chunk));
        if (got <= 0) {
          const int error = SSL_get_error(ssl_, static_cast<int>(got));
          if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) {
            CLUSTERPROF_RETURN_IF_ERROR(
                Wait(error == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline, "reading"));
            continue;
          }
          if (error != SSL_ERROR_ZERO_RETURN && !(error == SSL_ERROR_SYSCALL && errno == 0)) {
            ERR_clear_error();
            return Broken("the connection broke");
          }
          got = 0;
        }
      } else {
        got = recv(fd_, chunk, sizeof(chunk), 0);
        if (got < 0) {
          if (errno == EAGAIN || errno == EINTR) {
            CLUSTERPROF_RETURN_IF_ERROR(Wait(POLLIN, deadline, "reading"));
            continue;
          }
          return Broken(StrCat("recv: ", strerror(errno)));
        }
      }
      if (cancelled_) return Broken("cancelled");
      boost::system::error_code error;
      if (got == 0) {
        parser_.put_eof(error);
        if (error) return Broken("the connection closed inside the response");
        return absl::OkStatus();
      }
      pending_.commit(
          boost::asio::buffer_copy(pending_.prepare(static_cast<size_t>(got)),
                                   boost::asio::buffer(chunk, static_cast<size_t>(got))));
      while (pending_.size() > 0 && !parser_.is_done()) {
        const size_t used = parser_.put(pending_.data(), error);
        pending_.consume(used);
        if (error == beast::http::error::need_more) break;
        if (error) return Broken(StrCat("a malformed response: ", error.message()));
        if (used == 0) break;
      }
      return absl::OkStatus();
    }
  }

  RealClock clock_;
  std::string what_;
  std::string server_;
  int64_t idle_timeout_ns_ = 0;
  int fd_ = -1;
  SSL_CTX* context_ = nullptr;
  SSL* ssl_ = nullptr;
  std::atomic<bool> cancelled_{false};
  beast::flat_buffer pending_;
  beast::http::response_parser<beast::http::string_body> parser_;
};

absl::StatusOr<std::unique_ptr<ResponseStream>> ResponseStream::Open(const StreamRequest& request) {
  auto connection = std::make_unique<Connection>();
  CLUSTERPROF_RETURN_IF_ERROR(connection->Open(request));
  return std::unique_ptr<ResponseStream>(new ResponseStream(std::move(connection)));
}

ResponseStream::ResponseStream(std::unique_ptr<Connection> connection)
    : connection_(std::move(connection)) {}
ResponseStream::~ResponseStream() = default;

int ResponseStream::status_code() const { return connection_->status_code(); }
std::string ResponseStream::Header(std::string_view name) const {
  return connection_->Header(name);
}
absl::StatusOr<std::string> ResponseStream::Read(size_t max) { return connection_->Read(max); }

absl::StatusOr<std::string> ResponseStream::ReadAll(size_t limit) {
  std::string all;
  while (all.size() < limit) {
    CLUSTERPROF_ASSIGN_OR_RETURN(std::string piece, Read(limit - all.size()));
    if (piece.empty()) break;
    all += piece;
  }
  return all;
}

void ResponseStream::Cancel() { connection_->Cancel(); }

}  // namespace clusterprof::http
