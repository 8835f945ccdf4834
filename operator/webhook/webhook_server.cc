#include "operator/webhook/webhook_server.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <chrono>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "common/base/file_stamp.h"
#include "common/base/status.h"
#include "common/base/strings.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "spdlog/spdlog.h"

namespace clusterprof::webhook {
namespace {

// The API server sends at most 3 MiB of object; a review wraps it.
constexpr uint64_t kMaxBodyBytes = 6 << 20;

std::string OpenSslError() {
  const unsigned long code = ERR_get_error();
  if (code == 0) return "unknown error";
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  ERR_clear_error();
  return text;
}

// A missing file has the empty stamp.
FileStamp Stamp(const std::string& path) { return StampFile(path).value_or(FileStamp()); }

// A certificate chain and its key, as read from PEM files.
struct KeyPair {
  X509* leaf = nullptr;
  STACK_OF(X509) * chain = nullptr;
  EVP_PKEY* key = nullptr;
  ~KeyPair() {
    X509_free(leaf);
    sk_X509_pop_free(chain, X509_free);
    EVP_PKEY_free(key);
  }
};

absl::StatusOr<std::shared_ptr<KeyPair>> ReadKeyPair(const std::string& cert_path,
                                                     const std::string& key_path) {
  auto pair = std::make_shared<KeyPair>();
  FILE* cert_file = fopen(cert_path.c_str(), "r");
  if (cert_file == nullptr) {
    return absl::NotFoundError(StrCat("cannot read the webhook certificate ", cert_path));
  }
  pair->leaf = PEM_read_X509(cert_file, nullptr, nullptr, nullptr);
  if (pair->leaf != nullptr) {
    pair->chain = sk_X509_new_null();
    while (X509* intermediate = PEM_read_X509(cert_file, nullptr, nullptr, nullptr)) {
      sk_X509_push(pair->chain, intermediate);
    }
    ERR_clear_error();  // the end of the file reads as an error
  }
  fclose(cert_file);
  if (pair->leaf == nullptr) {
    return absl::InvalidArgumentError(
        StrCat("the webhook certificate ", cert_path, " holds no PEM certificate"));
  }
  FILE* key_file = fopen(key_path.c_str(), "r");
  if (key_file == nullptr) {
    return absl::NotFoundError(StrCat("cannot read the webhook key ", key_path));
  }
  pair->key = PEM_read_PrivateKey(key_file, nullptr, nullptr, nullptr);
  fclose(key_file);
  if (pair->key == nullptr) {
    return absl::InvalidArgumentError(
        StrCat("the webhook key ", key_path, " holds no PEM private key: ", OpenSslError()));
  }
  if (X509_check_private_key(pair->leaf, pair->key) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        StrCat("the webhook key ", key_path, " does not belong to the certificate ", cert_path));
  }
  return pair;
}

}  // namespace

class WebhookServer::Impl {
 public:
  explicit Impl(WebhookServerOptions options)
      : options_(std::move(options)),
        clock_(options_.clock != nullptr ? *options_.clock : SystemClock()),
        cert_path_(StrCat(options_.cert_dir, "/tls.crt")),
        key_path_(StrCat(options_.cert_dir, "/tls.key")) {
    if (options_.registry != nullptr) {
      admissions_ =
          &prometheus::BuildCounter()
               .Name("clusterprof_webhook_admissions_total")
               .Help(
                   "Pods the injection webhook answered for, by outcome (injected, "
                   "already-injected, opted-out, host-network, invalid, ignored, bad-request)")
               .Register(*options_.registry);
      latency_ = &prometheus::BuildHistogram()
                      .Name("clusterprof_webhook_request_duration_seconds")
                      .Help("Time to answer an AdmissionReview")
                      .Register(*options_.registry)
                      .Add({}, prometheus::Histogram::BucketBoundaries{1e-4, 5e-4, 1e-3, 5e-3, 1e-2,
                                                                       5e-2, 0.1, 0.5});
    }
  }

  Clock& clock() { return clock_; }

  absl::Status LoadInitial() {
    std::lock_guard lock(mu_);
    stamps_ = {Stamp(cert_path_), Stamp(key_path_)};
    CLUSTERPROF_ASSIGN_OR_RETURN(current_, ReadKeyPair(cert_path_, key_path_));
    return absl::OkStatus();
  }

  // The key pair to serve: re-read when either file changed (a rotated Secret), checked at most
  // once a second. A pair that fails to load leaves the old one in place.
  std::shared_ptr<KeyPair> Current() {
    std::lock_guard lock(mu_);
    const int64_t now_ns = clock_.MonotonicNs();
    if (now_ns - last_check_ns_ >= kNanosPerSecond) {
      last_check_ns_ = now_ns;
      const std::pair<FileStamp, FileStamp> stamps = {Stamp(cert_path_), Stamp(key_path_)};
      if (stamps != stamps_) {
        absl::StatusOr<std::shared_ptr<KeyPair>> pair = ReadKeyPair(cert_path_, key_path_);
        if (pair.ok()) {
          stamps_ = stamps;
          current_ = *std::move(pair);
          spdlog::info("webhook: serving the new certificate from {}", options_.cert_dir);
        } else if (!warned_) {
          // Kubelet swaps the files of a Secret volume in one rename, but a half-written pair
          // from elsewhere reads as a mismatch for a moment: keep trying, warn once.
          spdlog::warn("webhook: keeping the previous certificate: {}",
                       std::string(pair.status().message()));
          warned_ = true;
        }
        if (pair.ok()) warned_ = false;
      }
    }
    return current_;
  }

  void Count(const std::string& outcome, double seconds) {
    if (admissions_ == nullptr) return;
    admissions_->Add({{"outcome", outcome}}).Increment();
    latency_->Observe(seconds);
  }

  const WebhookServerOptions& options() const { return options_; }

 private:
  const WebhookServerOptions options_;
  Clock& clock_;
  const std::string cert_path_;
  const std::string key_path_;
  std::mutex mu_;
  std::pair<FileStamp, FileStamp> stamps_;
  std::shared_ptr<KeyPair> current_;
  int64_t last_check_ns_ = clock_.MonotonicNs();
  bool warned_ = false;
  prometheus::Family<prometheus::Counter>* admissions_ = nullptr;
  prometheus::Histogram* latency_ = nullptr;
};

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

int CertificateCallback(SSL* ssl, void* arg) {
  std::shared_ptr<KeyPair> pair = static_cast<WebhookServer::Impl*>(arg)->Current();
  // The SSL takes its own references.
  return SSL_use_cert_and_key(ssl, pair->leaf, pair->key, pair->chain, 1) == 1 ? 1 : 0;
}

struct Reply {
  http::status status = http::status::ok;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

Reply HandleRequest(WebhookServer::Impl& impl, const http::request<http::string_body>& request) {
  const int64_t start_ns = impl.clock().MonotonicNs();
  const std::string_view target(request.target().data(), request.target().size());
  if (target != "/mutate-pods" && !target.starts_with("/mutate-pods?")) {
    return {http::status::not_found, "text/plain; charset=utf-8",
            "not found: the admission webhook serves POST /mutate-pods\n"};
  }
  if (request.method() != http::verb::post) {
    return {http::status::method_not_allowed, "text/plain; charset=utf-8",
            "POST an AdmissionReview here\n"};
  }
  absl::StatusOr<ReviewAnswer> answer = Review(impl.options().injection, request.body());
  const double seconds =
      static_cast<double>(impl.clock().MonotonicNs() - start_ns) / kNanosPerSecond;
  if (!answer.ok()) {
    spdlog::warn("webhook: bad request: {}", std::string(answer.status().message()));
    impl.Count("bad-request", seconds);
    return {http::status::bad_request, "text/plain; charset=utf-8",
            StrCat(StdView(answer.status().message()), "\n")};
  }
  const InjectionResult& result = answer->result;
  if (result.outcome == "injected") {
    spdlog::info("webhook: injected the sidecar into pod {}", answer->pod);
  } else if (result.outcome != "ignored") {
    spdlog::debug("webhook: pod {}: {}", answer->pod, result.outcome);
  }
  for (const std::string& warning : result.warnings) {
    spdlog::warn("webhook: pod {}: {}", answer->pod, warning);
  }
  impl.Count(result.outcome, seconds);
  return {http::status::ok, "application/json", std::move(answer->body)};
}

// One connection: a TLS handshake, then requests and responses while the client keeps the
// connection alive (the API server pools its connections to webhooks), then close.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, asio::ssl::context& tls, WebhookServer::Impl* impl)
      : stream_(std::move(socket), tls), impl_(impl) {}

  void Run() {
    beast::get_lowest_layer(stream_).expires_after(std::chrono::seconds(30));
    stream_.async_handshake(asio::ssl::stream_base::server,
                            [self = shared_from_this()](beast::error_code error) {
                              if (!error) self->Read();
                            });
  }

 private:
  void Read() {
    // A request must arrive within this (an idle pooled connection is closed after it).
    beast::get_lowest_layer(stream_).expires_after(std::chrono::seconds(60));
    parser_.emplace();
    parser_->body_limit(kMaxBodyBytes);
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code error, size_t) { self->OnRead(error); });
  }

  void OnRead(beast::error_code error) {
    Reply reply;
    bool keep_alive = false;
    if (error == http::error::body_limit) {
      reply = {http::status::payload_too_large, "text/plain; charset=utf-8",
               "the AdmissionReview is too large\n"};
      impl_->Count("bad-request", 0);
    } else if (error) {
      return;  // the client went away or sent no HTTP: drop the connection
    } else {
      keep_alive = parser_->get().keep_alive();
      reply = HandleRequest(*impl_, parser_->get());
    }
    response_ = {};
    response_.result(reply.status);
    response_.version(11);
    response_.set(http::field::content_type, reply.content_type);
    response_.set(http::field::cache_control, "no-store");
    response_.keep_alive(keep_alive);
    response_.body() = std::move(reply.body);
    response_.prepare_payload();
    http::async_write(stream_, response_,
                      [self = shared_from_this(), keep_alive](beast::error_code error, size_t) {
                        if (!error && keep_alive) {
                          self->Read();
                        } else {
                          self->stream_.async_shutdown([self](beast::error_code) {});
                        }
                      });
  }

  beast::ssl_stream<beast::tcp_stream> stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::response<http::string_body> response_;
  WebhookServer::Impl* impl_;
};

}  // namespace

struct WebhookServer::Network {
  static constexpr int kThreads = 2;
  // Destroyed in reverse: the acceptor and any sessions left in the io_context before the TLS
  // context they use.
  asio::ssl::context tls{asio::ssl::context::tls_server};
  asio::io_context io{kThreads};
  tcp::acceptor acceptor{io};
  std::vector<std::thread> threads;

  void Accept(Impl* impl) {
    acceptor.async_accept(asio::make_strand(io),
                          [this, impl](beast::error_code error, tcp::socket socket) {
                            if (error == asio::error::operation_aborted) return;
                            if (!error) {
                              // One small response per connection: no Nagle delay before it.
                              beast::error_code ignored;
                              socket.set_option(tcp::no_delay(true), ignored);
                              std::make_shared<Session>(std::move(socket), tls, impl)->Run();
                            }
                            Accept(impl);
                          });
  }
};

WebhookServer::WebhookServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<WebhookServer>> WebhookServer::Start(WebhookServerOptions options) {
  CLUSTERPROF_RETURN_IF_ERROR(ValidateInjectionConfig(options.injection));
  const std::string listen = options.address.find(':') != std::string::npos
                                 ? StrCat("[", options.address, "]:", options.port)
                                 : StrCat(options.address, ":", options.port);
  beast::error_code error;
  const asio::ip::address address = asio::ip::make_address(options.address, error);
  if (error) {
    return absl::InvalidArgumentError(
        StrCat("webhook address '", options.address, "' is not an IP address"));
  }
  auto impl = std::make_unique<Impl>(std::move(options));
  CLUSTERPROF_RETURN_IF_ERROR(impl->LoadInitial());
  std::unique_ptr<WebhookServer> server(new WebhookServer(std::move(impl)));
  server->network_ = std::make_unique<Network>();
  Network& network = *server->network_;
  SSL_CTX* context = network.tls.native_handle();
  SSL_CTX_set_min_proto_version(context, TLS1_2_VERSION);
  SSL_CTX_set_cert_cb(context, CertificateCallback, server->impl_.get());

  const tcp::endpoint endpoint(address, static_cast<uint16_t>(server->impl_->options().port));
  network.acceptor.open(endpoint.protocol(), error);
  if (!error) network.acceptor.set_option(asio::socket_base::reuse_address(true), error);
  if (!error) network.acceptor.bind(endpoint, error);
  if (!error) network.acceptor.listen(asio::socket_base::max_listen_connections, error);
  if (error) {
    return absl::UnavailableError(StrCat("cannot serve HTTPS on ", listen, ": ", error.message()));
  }
  server->port_ = network.acceptor.local_endpoint().port();
  network.Accept(server->impl_.get());
  for (int i = 0; i < Network::kThreads; ++i) {
    network.threads.emplace_back([&network] { network.io.run(); });
  }
  return server;
}

WebhookServer::~WebhookServer() {
  if (network_ == nullptr) return;
  network_->io.stop();
  for (std::thread& thread : network_->threads) thread.join();
}

}  // namespace clusterprof::webhook
