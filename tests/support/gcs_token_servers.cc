#include "tests/support/gcs_token_servers.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/rsa.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "common/base/check.h"
#include "common/base/json_escape.h"
#include "common/base/status.h"
#include "common/base/strings.h"
#include "common/http/status.h"
#include "cpprest/json.h"

namespace clusterprof::testing {
namespace internal {

struct HttpRequest {
  std::string method;
  std::string path;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;

  std::string Header(std::string name) const {
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const auto it = headers.find(name);
    return it == headers.end() ? std::string() : it->second;
  }
};

struct HttpReply {
  int code = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

// HTTP/1.1 on 127.0.0.1, port 0, over plain sockets: one thread accepts, and each connection
// gets a thread of its own that reads one request, hands it to the handler and answers with
// Connection: close. (Plain sockets rather than civetweb: civetweb takes a second or two to stop,
// and these servers start and stop in every test.) Thread-safe; the destructor stops accepting,
// interrupts requests still being read, and joins every thread, so the handler must not block
// forever.
class LocalHttpServer {
 public:
  using Handler = std::function<HttpReply(const HttpRequest&)>;

  static absl::StatusOr<std::unique_ptr<LocalHttpServer>> Start(Handler handler) {
    std::unique_ptr<LocalHttpServer> server(new LocalHttpServer(std::move(handler)));
    server->listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    server->wake_fd_ = eventfd(0, EFD_CLOEXEC);
    if (server->listen_fd_ < 0 || server->wake_fd_ < 0) {
      return ErrnoToStatus(errno, "socket", "127.0.0.1:0");
    }
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    if (bind(server->listen_fd_, reinterpret_cast<const sockaddr*>(&address), length) != 0 ||
        listen(server->listen_fd_, 64) != 0 ||
        getsockname(server->listen_fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      return ErrnoToStatus(errno, "listen on", "127.0.0.1:0");
    }
    server->port_ = ntohs(address.sin_port);
    server->acceptor_ = std::thread([raw = server.get()] { raw->AcceptLoop(); });
    return server;
  }

  ~LocalHttpServer() {
    if (wake_fd_ >= 0) {
      const uint64_t one = 1;
      (void)!write(wake_fd_, &one, sizeof(one));  // stays readable: wakes every poll below
    }
    if (acceptor_.joinable()) acceptor_.join();
    std::vector<std::thread> connections;
    {
      MutexLock lock(&mu_);
      connections.swap(connections_);
    }
    for (std::thread& connection : connections) connection.join();
    if (listen_fd_ >= 0) close(listen_fd_);
    if (wake_fd_ >= 0) close(wake_fd_);
  }

  int port() const { return port_; }

 private:
  static constexpr int kReadTimeoutMs = 30'000;
  static constexpr size_t kMaxRequestBytes = 1 << 20;

  explicit LocalHttpServer(Handler handler) : handler_(std::move(handler)) {}

  // Waits until `fd` is readable; false when the server is stopping or after kReadTimeoutMs.
  bool WaitReadable(int fd) const {
    pollfd fds[2] = {{fd, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    while (true) {
      const int ready = poll(fds, 2, kReadTimeoutMs);
      if (ready < 0 && errno == EINTR) continue;
      return ready > 0 && fds[1].revents == 0 && fds[0].revents != 0;
    }
  }

  void AcceptLoop() {
    while (WaitReadable(listen_fd_)) {
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      MutexLock lock(&mu_);
      connections_.emplace_back([this, fd] {
        Serve(fd);
        close(fd);
      });
    }
  }

  // Reads one request from `fd`; false when it is not a whole HTTP/1.1 request.
  bool ReadRequest(int fd, HttpRequest* request) const {
    std::string data;
    size_t header_end = std::string::npos;
    size_t content_length = 0;
    char buffer[8192];
    while (true) {
      if (header_end == std::string::npos) {
        header_end = data.find("\r\n\r\n");
        if (header_end != std::string::npos) {
          std::string_view head(data.data(), header_end);
          const size_t line_end = head.find("\r\n");
          const std::string_view request_line = head.substr(0, line_end);
          const std::vector<std::string_view> words = SplitSkipEmpty(request_line, ' ');
          if (words.size() != 3) return false;
          request->method = std::string(words[0]);
          request->path = std::string(words[1].substr(0, words[1].find('?')));
          std::string_view rest =
              line_end == std::string_view::npos ? std::string_view() : head.substr(line_end + 2);
          while (!rest.empty()) {
            const size_t end = rest.find("\r\n");
            const std::string_view line = rest.substr(0, end);
            rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 2);
            const size_t colon = line.find(':');
            if (colon == std::string_view::npos) continue;
            std::string name(line.substr(0, colon));
            for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
            request->headers[name] = std::string(StripAsciiWhitespace(line.substr(colon + 1)));
          }
          const std::string length = request->Header("Content-Length");
          if (!length.empty()) content_length = std::strtoull(length.c_str(), nullptr, 10);
          if (content_length > kMaxRequestBytes) return false;
        }
      }
      if (header_end != std::string::npos && data.size() >= header_end + 4 + content_length) {
        request->body = data.substr(header_end + 4, content_length);
        return true;
      }
      if (data.size() > kMaxRequestBytes || !WaitReadable(fd)) return false;
      const ssize_t got = recv(fd, buffer, sizeof(buffer), 0);
      if (got <= 0) return false;
      data.append(buffer, static_cast<size_t>(got));
    }
  }

  void Serve(int fd) const {
    HttpRequest request;
    if (!ReadRequest(fd, &request)) return;
    const HttpReply reply = handler_(request);
    std::string out =
        StrCat("HTTP/1.1 ", reply.code, " ", http::ReasonPhrase(reply.code),
               "\r\nContent-Type: ", reply.content_type, "\r\nContent-Length: ", reply.body.size(),
               "\r\nConnection: close\r\n");
    for (const auto& [name, value] : reply.headers) StrAppend(&out, name, ": ", value, "\r\n");
    out.append("\r\n");
    if (request.method != "HEAD") out.append(reply.body);
    for (size_t sent = 0; sent < out.size();) {
      const ssize_t n = send(fd, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return;
      sent += static_cast<size_t>(n);
    }
    shutdown(fd, SHUT_WR);
  }

  const Handler handler_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // an eventfd written once, to stop
  int port_ = 0;
  std::thread acceptor_;
  Mutex mu_;
  std::vector<std::thread> connections_ ABSL_GUARDED_BY(mu_);
};

}  // namespace internal

namespace {

using internal::HttpReply;
using internal::HttpRequest;

constexpr char kJwtBearerGrant[] = "urn:ietf:params:oauth:grant-type:jwt-bearer";
constexpr int64_t kMaxClockSkewS = 60;
constexpr int64_t kMaxJwtLifetimeS = 3600;
constexpr char kMetadataPrefix[] = "/computeMetadata/v1/instance/service-accounts/default/";

std::string OpenSslErrors() {
  std::string out;
  while (const unsigned long error = ERR_get_error()) {
    char buffer[256];
    ERR_error_string_n(error, buffer, sizeof(buffer));
    StrAppend(&out, out.empty() ? "" : "; ", buffer);
  }
  return out;
}

std::string RandomHex(int bytes) {
  std::vector<unsigned char> random(static_cast<size_t>(bytes));
  CLUSTERPROF_CHECK(RAND_bytes(random.data(), bytes) == 1) << OpenSslErrors();
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (const unsigned char byte : random) {
    out.push_back(kHex[byte >> 4]);
    out.push_back(kHex[byte & 0xf]);
  }
  return out;
}

std::string BioText(BIO* bio) {
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio, &data);
  return std::string(data, static_cast<size_t>(size));
}

void AppendMember(std::string* out, std::string_view name, std::string_view value) {
  StrAppend(out, out->size() > 1 ? ",\n  " : "\n  ", "\"", name, "\": \"");
  AppendJsonEscaped(value, out);
  out->push_back('"');
}

std::string OAuthError(std::string_view error, std::string_view description) {
  std::string out = "{";
  AppendMember(&out, "error", error);
  AppendMember(&out, "error_description", description);
  out.append("\n}");
  return out;
}

std::string TokenResponse(std::string_view token, int64_t expires_in_s) {
  std::string out = "{";
  AppendMember(&out, "access_token", token);
  StrAppend(&out, ",\n  \"expires_in\": ", expires_in_s);
  AppendMember(&out, "token_type", "Bearer");
  out.append("\n}");
  return out;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// application/x-www-form-urlencoded: name=value pairs joined by '&', %XX escapes, '+' for space.
std::map<std::string, std::string> ParseForm(std::string_view body) {
  const auto decode = [](std::string_view text) {
    std::string out;
    for (size_t i = 0; i < text.size(); ++i) {
      if (text[i] == '+') {
        out.push_back(' ');
      } else if (text[i] == '%' && i + 2 < text.size() && HexValue(text[i + 1]) >= 0 &&
                 HexValue(text[i + 2]) >= 0) {
        out.push_back(static_cast<char>(HexValue(text[i + 1]) * 16 + HexValue(text[i + 2])));
        i += 2;
      } else {
        out.push_back(text[i]);
      }
    }
    return out;
  };
  std::map<std::string, std::string> form;
  for (std::string_view pair : SplitSkipEmpty(body, '&')) {
    const size_t equals = pair.find('=');
    if (equals == std::string_view::npos) {
      form[decode(pair)] = "";
    } else {
      form[decode(pair.substr(0, equals))] = decode(pair.substr(equals + 1));
    }
  }
  return form;
}

// A base64url JSON object of a JWT, or nullopt.
std::optional<web::json::value> DecodeJwtPart(std::string_view part) {
  std::string text;
  if (!absl::WebSafeBase64Unescape(AbslView(part), &text)) return std::nullopt;
  try {
    std::error_code error;
    web::json::value value = web::json::value::parse(text, error);
    if (error || !value.is_object()) return std::nullopt;
    return value;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::optional<std::string> StringMember(const web::json::value& object, const char* name) {
  if (!object.has_field(name) || !object.at(name).is_string()) return std::nullopt;
  return object.at(name).as_string();
}

std::optional<int64_t> IntegerMember(const web::json::value& object, const char* name) {
  if (!object.has_field(name) || !object.at(name).is_number()) return std::nullopt;
  const double value = object.at(name).as_number().to_double();
  if (value != std::floor(value)) return std::nullopt;
  return static_cast<int64_t>(value);
}

}  // namespace

TestServiceAccountKey MakeTestServiceAccountKey(std::string_view token_uri,
                                                std::string_view client_email) {
  EVP_PKEY* key = EVP_RSA_gen(2048);
  CLUSTERPROF_CHECK(key != nullptr) << "RSA key generation failed: " << OpenSslErrors();
  TestServiceAccountKey out;
  BIO* bio = BIO_new(BIO_s_mem());
  CLUSTERPROF_CHECK(PEM_write_bio_PrivateKey(bio, key, nullptr, nullptr, 0, nullptr, nullptr) == 1)
      << OpenSslErrors();
  out.private_key_pem = BioText(bio);
  BIO_free(bio);
  bio = BIO_new(BIO_s_mem());
  CLUSTERPROF_CHECK(PEM_write_bio_PUBKEY(bio, key) == 1) << OpenSslErrors();
  out.public_key_pem = BioText(bio);
  BIO_free(bio);
  EVP_PKEY_free(key);

  out.private_key_id = RandomHex(20);
  out.client_email = std::string(client_email);
  const size_t at = out.client_email.find('@');
  const size_t dot = out.client_email.find('.', at == std::string::npos ? 0 : at);
  const std::string project = at != std::string::npos && dot != std::string::npos
                                  ? out.client_email.substr(at + 1, dot - at - 1)
                                  : "test-project";
  std::string client_id;
  for (const char c : RandomHex(11)) client_id.push_back(static_cast<char>('0' + c % 10));
  std::string json = "{";
  AppendMember(&json, "type", "service_account");
  AppendMember(&json, "project_id", project);
  AppendMember(&json, "private_key_id", out.private_key_id);
  AppendMember(&json, "private_key", out.private_key_pem);
  AppendMember(&json, "client_email", out.client_email);
  AppendMember(&json, "client_id", client_id);
  AppendMember(&json, "auth_uri", "https://accounts.google.com/o/oauth2/auth");
  AppendMember(&json, "token_uri", token_uri);
  AppendMember(&json, "auth_provider_x509_cert_url", "https://www.googleapis.com/oauth2/v1/certs");
  AppendMember(&json, "universe_domain", "googleapis.com");
  json.append("\n}\n");
  out.json_key = std::move(json);
  return out;
}

// --- IssuedTokens -----------------------------------------------------------------------------

std::string IssuedTokens::Issue(int64_t expires_wall_ns) {
  MutexLock lock(&mu_);
  std::string token = StrCat("ya29.test-", expiry_.size() + 1, "-", RandomHex(8));
  expiry_[token] = expires_wall_ns;
  return token;
}

bool IssuedTokens::IsValid(std::string_view token, int64_t now_wall_ns) const {
  MutexLock lock(&mu_);
  const auto it = expiry_.find(token);
  return it != expiry_.end() && now_wall_ns < it->second;
}

int IssuedTokens::count() const {
  MutexLock lock(&mu_);
  return static_cast<int>(expiry_.size());
}

// --- OAuthTokenServer -------------------------------------------------------------------------

struct OAuthTokenServer::PublicKey {
  ~PublicKey() { EVP_PKEY_free(key); }
  EVP_PKEY* key = nullptr;
};

OAuthTokenServer::OAuthTokenServer(OAuthTokenServerOptions options)
    : options_(std::move(options)), expires_in_s_(options_.expires_in_s) {}

OAuthTokenServer::~OAuthTokenServer() {
  ReleaseRequests();
  http_.reset();  // joins the server threads before the state they use goes
}

absl::StatusOr<std::unique_ptr<OAuthTokenServer>> OAuthTokenServer::Start(
    OAuthTokenServerOptions options) {
  CLUSTERPROF_CHECK(options.clock != nullptr) << "OAuthTokenServerOptions.clock is required";
  std::unique_ptr<OAuthTokenServer> server(new OAuthTokenServer(std::move(options)));
  OAuthTokenServer* raw = server.get();
  CLUSTERPROF_ASSIGN_OR_RETURN(
      server->http_, internal::LocalHttpServer::Start(
                         [raw](const HttpRequest& request) { return raw->Handle(request); }));
  return server;
}

absl::Status OAuthTokenServer::TrustKey(std::string_view public_key_pem,
                                        std::string_view private_key_id,
                                        std::string_view client_email) {
  BIO* bio = BIO_new_mem_buf(public_key_pem.data(), static_cast<int>(public_key_pem.size()));
  auto public_key = std::make_shared<PublicKey>();
  public_key->key = PEM_read_bio_PUBKEY(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  if (public_key->key == nullptr) {
    return absl::InvalidArgumentError(
        StrCat("OAuthTokenServer::TrustKey: not a PEM public key: ", OpenSslErrors()));
  }
  MutexLock lock(&mu_);
  trusted_.push_back(
      {std::string(private_key_id), std::string(client_email), std::move(public_key)});
  return absl::OkStatus();
}

absl::Status OAuthTokenServer::TrustKey(const TestServiceAccountKey& key) {
  return TrustKey(key.public_key_pem, key.private_key_id, key.client_email);
}

void OAuthTokenServer::TrustRefreshToken(std::string_view client_id, std::string_view client_secret,
                                         std::string_view refresh_token) {
  MutexLock lock(&mu_);
  refresh_tokens_[std::string(refresh_token)] = {std::string(client_id),
                                                 std::string(client_secret)};
}

void OAuthTokenServer::RevokeRefreshToken(std::string_view refresh_token) {
  MutexLock lock(&mu_);
  if (auto it = refresh_tokens_.find(refresh_token); it != refresh_tokens_.end()) {
    it->second.revoked = true;
  }
}

std::string OAuthTokenServer::last_grant_type() const {
  MutexLock lock(&mu_);
  return last_grant_type_;
}

int OAuthTokenServer::port() const { return http_->port(); }

std::string OAuthTokenServer::token_uri() const {
  return StrCat("http://127.0.0.1:", port(), "/token");
}

int OAuthTokenServer::grants() const { return tokens_.count(); }

int OAuthTokenServer::requests() const {
  MutexLock lock(&mu_);
  return requests_;
}

std::string OAuthTokenServer::last_error() const {
  MutexLock lock(&mu_);
  return last_error_;
}

std::string OAuthTokenServer::last_scope() const {
  MutexLock lock(&mu_);
  return last_scope_;
}

bool OAuthTokenServer::IsValidToken(std::string_view token, int64_t now_wall_ns) const {
  return tokens_.IsValid(token, now_wall_ns);
}

void OAuthTokenServer::FailNextRequests(int count, int http_code) {
  MutexLock lock(&mu_);
  fail_next_ = count;
  fail_code_ = http_code;
}

void OAuthTokenServer::set_expires_in_s(int64_t seconds) {
  MutexLock lock(&mu_);
  expires_in_s_ = seconds;
}

void OAuthTokenServer::HoldRequests() {
  MutexLock lock(&mu_);
  holding_ = true;
}

void OAuthTokenServer::ReleaseRequests() {
  MutexLock lock(&mu_);
  holding_ = false;
}

void OAuthTokenServer::WaitForHeldRequests(int count) {
  MutexLock lock(&mu_);
  mu_.Await([this, count]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return held_ >= count; });
}

std::string OAuthTokenServer::CheckAssertion(std::string_view assertion, int64_t now_wall_ns) {
  const std::vector<std::string_view> parts = SplitSkipEmpty(assertion, '.');
  if (parts.size() != 3 || std::count(assertion.begin(), assertion.end(), '.') != 2) {
    return "Invalid JWT: not three base64url parts separated by '.'";
  }
  const std::optional<web::json::value> header = DecodeJwtPart(parts[0]);
  const std::optional<web::json::value> claims = DecodeJwtPart(parts[1]);
  if (!header.has_value() || !claims.has_value()) {
    return "Invalid JWT: the header or the claim set is not base64url JSON";
  }
  if (StringMember(*header, "alg") != "RS256") return "Invalid JWT: alg must be RS256";
  if (const std::optional<std::string> typ = StringMember(*header, "typ");
      typ.has_value() && *typ != "JWT") {
    return "Invalid JWT: typ must be JWT";
  }
  std::string signature;
  if (!absl::WebSafeBase64Unescape(AbslView(parts[2]), &signature)) {
    return "Invalid JWT Signature. (not base64url)";
  }
  const std::optional<std::string> iss = StringMember(*claims, "iss");
  const std::optional<std::string> kid = StringMember(*header, "kid");
  std::vector<TrustedKey> candidates;
  {
    MutexLock lock(&mu_);
    for (const TrustedKey& key : trusted_) {
      if (iss == key.client_email && (!kid.has_value() || *kid == key.key_id)) {
        candidates.push_back(key);
      }
    }
  }
  if (candidates.empty()) {
    if (!iss.has_value()) return "Invalid JWT: the claim set has no iss";
    bool known_account = false;
    {
      MutexLock lock(&mu_);
      for (const TrustedKey& key : trusted_) known_account |= key.client_email == *iss;
    }
    if (!known_account) return "Invalid grant: account not found";
    return "Invalid JWT Signature. (kid is not a key of this service account)";
  }
  const std::string signed_part = StrCat(parts[0], ".", parts[1]);
  bool verified = false;
  for (const TrustedKey& key : candidates) {
    EVP_MD_CTX* context = EVP_MD_CTX_new();
    verified =
        EVP_DigestVerifyInit(context, nullptr, EVP_sha256(), nullptr, key.public_key->key) == 1 &&
        EVP_DigestVerify(
            context, reinterpret_cast<const unsigned char*>(signature.data()), signature.size(),
            reinterpret_cast<const unsigned char*>(signed_part.data()), signed_part.size()) == 1;
    EVP_MD_CTX_free(context);
    ERR_clear_error();
    if (verified) break;
  }
  if (!verified) return "Invalid JWT Signature.";
  if (StringMember(*claims, "aud") != token_uri()) {
    return StrCat("Invalid JWT: aud must be ", token_uri());
  }
  const std::string scope = StringMember(*claims, "scope").value_or("");
  if (scope.empty()) return "Invalid JWT: the claim set has no scope";
  const std::optional<int64_t> iat = IntegerMember(*claims, "iat");
  const std::optional<int64_t> exp = IntegerMember(*claims, "exp");
  const int64_t now_s = now_wall_ns / kNanosPerSecond;
  if (!iat.has_value() || !exp.has_value() || std::abs(*iat - now_s) > kMaxClockSkewS ||
      *exp <= *iat || *exp - *iat > kMaxJwtLifetimeS || *exp <= now_s) {
    return "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable "
           "timeframe. Check your iat and exp values in the JWT claim.";
  }
  MutexLock lock(&mu_);
  last_scope_ = scope;
  return "";
}

HttpReply OAuthTokenServer::Handle(const HttpRequest& request) {
  int64_t expires_in_s;
  {
    MutexLock lock(&mu_);
    ++requests_;
    if (holding_) {
      ++held_;
      mu_.Await([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !holding_; });
      --held_;
    }
    if (fail_next_ > 0) {
      --fail_next_;
      return {fail_code_,
              "application/json",
              OAuthError("internal_failure", "the stand-in was told to fail this request"),
              {}};
    }
    expires_in_s = expires_in_s_;
  }
  if (request.path != "/token") {
    return {404, "application/json", OAuthError("not_found", "POST /token"), {}};
  }
  if (request.method != "POST") {
    return {405, "application/json", OAuthError("invalid_request", "POST only"), {}};
  }
  const auto reject = [this](std::string_view error, std::string_view description) {
    MutexLock lock(&mu_);
    last_error_ = std::string(description);
    return HttpReply{400, "application/json", OAuthError(error, description), {}};
  };
  if (!StartsWith(request.Header("Content-Type"), "application/x-www-form-urlencoded")) {
    return reject("invalid_request",
                  StrCat("Content-Type must be application/x-www-form-urlencoded, not \"",
                         request.Header("Content-Type"), "\""));
  }
  std::map<std::string, std::string> form = ParseForm(request.body);
  {
    MutexLock lock(&mu_);
    last_grant_type_ = form["grant_type"];
  }
  if (form["grant_type"] == "refresh_token") return HandleRefresh(form, expires_in_s);
  if (form["grant_type"] != kJwtBearerGrant) {
    return reject("unsupported_grant_type", StrCat("Invalid grant_type: ", form["grant_type"]));
  }
  if (form["assertion"].empty())
    return reject("invalid_request", "Missing required parameter: assertion");
  const int64_t now_wall_ns = options_.clock->WallNs();
  if (std::string problem = CheckAssertion(form["assertion"], now_wall_ns); !problem.empty()) {
    return reject("invalid_grant", problem);
  }
  const std::string token = tokens_.Issue(now_wall_ns + expires_in_s * kNanosPerSecond);
  return {200, "application/json", TokenResponse(token, expires_in_s), {}};
}

HttpReply OAuthTokenServer::HandleRefresh(const std::map<std::string, std::string>& form,
                                          int64_t expires_in_s) {
  const auto value = [&form](const std::string& name) {
    auto it = form.find(name);
    return it == form.end() ? std::string() : it->second;
  };
  const auto reply = [this](int code, std::string_view error, std::string_view description) {
    MutexLock lock(&mu_);
    last_error_ = std::string(description);
    return HttpReply{code, "application/json", OAuthError(error, description), {}};
  };
  for (const char* name : {"client_id", "client_secret", "refresh_token"}) {
    if (value(name).empty()) {
      return reply(400, "invalid_request", StrCat("Missing required parameter: ", name));
    }
  }
  bool known_client = false;
  {
    MutexLock lock(&mu_);
    for (const auto& [token, trusted] : refresh_tokens_) {
      known_client |= trusted.client_id == value("client_id");
    }
    auto it = refresh_tokens_.find(value("refresh_token"));
    if (it != refresh_tokens_.end() && it->second.client_id == value("client_id")) {
      if (it->second.client_secret != value("client_secret")) {
        last_error_ = "Unauthorized";
        return HttpReply{401, "application/json", OAuthError("invalid_client", "Unauthorized"), {}};
      }
      if (!it->second.revoked) {
        const std::string token =
            tokens_.Issue(options_.clock->WallNs() + expires_in_s * kNanosPerSecond);
        return {200, "application/json", TokenResponse(token, expires_in_s), {}};
      }
    }
  }
  if (!known_client) return reply(401, "invalid_client", "The OAuth client was not found.");
  return reply(400, "invalid_grant", "Token has been expired or revoked.");
}

// --- MetadataServer ---------------------------------------------------------------------------

MetadataServer::MetadataServer(MetadataServerOptions options)
    : options_(std::move(options)), expires_in_s_(options_.expires_in_s) {}

MetadataServer::~MetadataServer() { http_.reset(); }

absl::StatusOr<std::unique_ptr<MetadataServer>> MetadataServer::Start(
    MetadataServerOptions options) {
  CLUSTERPROF_CHECK(options.clock != nullptr) << "MetadataServerOptions.clock is required";
  std::unique_ptr<MetadataServer> server(new MetadataServer(std::move(options)));
  MetadataServer* raw = server.get();
  CLUSTERPROF_ASSIGN_OR_RETURN(
      server->http_, internal::LocalHttpServer::Start(
                         [raw](const HttpRequest& request) { return raw->Handle(request); }));
  return server;
}

int MetadataServer::port() const { return http_->port(); }

std::string MetadataServer::host() const { return StrCat("127.0.0.1:", port()); }

int MetadataServer::requests() const {
  MutexLock lock(&mu_);
  return requests_;
}

int MetadataServer::token_requests() const {
  MutexLock lock(&mu_);
  return token_requests_;
}

int MetadataServer::rejected_requests() const {
  MutexLock lock(&mu_);
  return rejected_;
}

bool MetadataServer::IsValidToken(std::string_view token, int64_t now_wall_ns) const {
  return tokens_.IsValid(token, now_wall_ns);
}

void MetadataServer::FailNextRequests(int count, int http_code) {
  MutexLock lock(&mu_);
  fail_next_ = count;
  fail_code_ = http_code;
}

void MetadataServer::set_expires_in_s(int64_t seconds) {
  MutexLock lock(&mu_);
  expires_in_s_ = seconds;
}

HttpReply MetadataServer::Handle(const HttpRequest& request) {
  HttpReply reply;
  reply.headers.emplace_back("Metadata-Flavor", "Google");
  reply.content_type = "text/html; charset=UTF-8";
  int64_t expires_in_s;
  {
    MutexLock lock(&mu_);
    ++requests_;
    if (request.Header("Metadata-Flavor") != "Google") {
      ++rejected_;
      reply.code = 403;
      reply.body = "Missing Metadata-Flavor:Google header.\n";
      return reply;
    }
    if (request.path == StrCat(kMetadataPrefix, "token")) ++token_requests_;
    if (fail_next_ > 0) {
      --fail_next_;
      reply.code = fail_code_;
      reply.body = "the stand-in was told to fail this request\n";
      return reply;
    }
    expires_in_s = expires_in_s_;
  }
  if (request.method != "GET") {
    reply.code = 405;
    return reply;
  }
  if (request.path == StrCat(kMetadataPrefix, "email")) {
    reply.content_type = "application/text";
    reply.body = options_.email;
    return reply;
  }
  if (request.path == StrCat(kMetadataPrefix, "token")) {
    reply.content_type = "application/json";
    const std::string token =
        tokens_.Issue(options_.clock->WallNs() + expires_in_s * kNanosPerSecond);
    reply.body = TokenResponse(token, expires_in_s);
    return reply;
  }
  reply.code = 404;
  reply.body = "not found\n";
  return reply;
}

}  // namespace clusterprof::testing
