#include "tests/support/test_certificates.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <random>

#include "common/base/status.h"
#include "common/base/strings.h"
#include "tests/support/kube_control_plane.h"

namespace clusterprof::testing {
namespace {

std::string RandomSerial() {
  std::random_device random;
  std::string serial;
  for (int i = 0; i < 4; ++i) {
    char buffer[9];
    std::snprintf(buffer, sizeof(buffer), "%08X", static_cast<unsigned>(random()));
    serial += buffer;
  }
  // A positive number without leading zeros reads back the same from openssl.
  serial[0] = '1';
  return serial;
}

std::string OpenSslError() {
  const unsigned long code = ERR_get_error();
  if (code == 0) return "no OpenSSL error";
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  ERR_clear_error();
  return text;
}

}  // namespace

absl::StatusOr<TestCertificates> MakeTestCertificates(const std::string& dir,
                                                      const std::vector<std::string>& sans) {
  CLUSTERPROF_ASSIGN_OR_RETURN(const std::string openssl, FindProgram("openssl"));
  std::string san_list;
  for (const std::string& san : sans) StrAppend(&san_list, san_list.empty() ? "" : ", ", san);
  const std::string config = StrCat(dir, "/openssl.cnf");
  {
    std::ofstream out(config);
    out << "[req]\ndistinguished_name = dn\nprompt = no\n[dn]\nCN = clusterprof-test\n"
        << "[ca_ext]\nbasicConstraints = critical, CA:TRUE\n"
        << "keyUsage = critical, keyCertSign, cRLSign, digitalSignature\n"
        << "subjectKeyIdentifier = hash\n"
        << "[serving_ext]\nbasicConstraints = critical, CA:FALSE\n"
        << "keyUsage = critical, digitalSignature, keyEncipherment\n"
        << "extendedKeyUsage = serverAuth\nsubjectAltName = " << san_list << "\n"
        << "subjectKeyIdentifier = hash\nauthorityKeyIdentifier = keyid\n";
    if (!out.flush()) return absl::InternalError(StrCat("cannot write ", config));
  }
  TestCertificates certificates;
  certificates.ca_file = StrCat(dir, "/ca.crt");
  certificates.cert_file = StrCat(dir, "/tls.crt");
  certificates.key_file = StrCat(dir, "/tls.key");
  certificates.serial = RandomSerial();
  const std::string ca_key = StrCat(dir, "/ca.key");
  const std::string csr = StrCat(dir, "/tls.csr");
  // EC keys: quick to make, and what the API server accepts from webhooks.
  const std::vector<std::vector<std::string>> commands = {
      {"req", "-x509", "-config", config, "-extensions", "ca_ext", "-newkey", "ec", "-pkeyopt",
       "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", ca_key, "-out", certificates.ca_file,
       "-days", "2", "-subj", "/CN=clusterprof-test-ca"},
      {"req", "-new", "-config", config, "-newkey", "ec", "-pkeyopt",
       "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", certificates.key_file, "-out", csr,
       "-subj", "/CN=clusterprof-test-webhook"},
      {"x509", "-req", "-in", csr, "-CA", certificates.ca_file, "-CAkey", ca_key, "-set_serial",
       StrCat("0x", certificates.serial), "-days", "2", "-extfile", config, "-extensions",
       "serving_ext", "-out", certificates.cert_file},
  };
  for (const std::vector<std::string>& args : commands) {
    std::vector<std::string> argv = {openssl};
    argv.insert(argv.end(), args.begin(), args.end());
    CLUSTERPROF_ASSIGN_OR_RETURN(const CommandResult result, RunCommand(argv));
    if (result.exit_code != 0) {
      return absl::InternalError(StrCat("openssl ", args[0], " failed: ", result.err));
    }
  }
  return certificates;
}

namespace {

// A verified TLS connection to 127.0.0.1:port.
class TlsConnection {
 public:
  ~TlsConnection() {
    ssl_.reset();
    context_.reset();
    if (fd_ >= 0) close(fd_);
  }

  absl::Status Connect(int port, const std::string& ca_file) {
    context_.reset(SSL_CTX_new(TLS_client_method()));
    if (SSL_CTX_load_verify_locations(context_.get(), ca_file.c_str(), nullptr) != 1) {
      return absl::InvalidArgumentError(
          StrCat("cannot load the CA ", ca_file, ": ", OpenSslError()));
    }
    SSL_CTX_set_verify(context_.get(), SSL_VERIFY_PEER, nullptr);
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      return absl::UnavailableError(StrCat("cannot connect to 127.0.0.1:", port));
    }
    ssl_.reset(SSL_new(context_.get()));
    SSL_set_fd(ssl_.get(), fd_);
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl_.get()), "127.0.0.1");
    if (SSL_connect(ssl_.get()) != 1) {
      const long verify = SSL_get_verify_result(ssl_.get());
      return absl::UnavailableError(StrCat("TLS handshake with 127.0.0.1:", port,
                                           " failed: ", X509_verify_cert_error_string(verify), " (",
                                           OpenSslError(), ")"));
    }
    if (X509* peer = SSL_get1_peer_certificate(ssl_.get())) {
      BIGNUM* serial = ASN1_INTEGER_to_BN(X509_get_serialNumber(peer), nullptr);
      char* hex = BN_bn2hex(serial);
      serial_ = hex;
      OPENSSL_free(hex);
      BN_free(serial);
      X509_free(peer);
    }
    return absl::OkStatus();
  }

  // Sends one request and reads its response (by Content-Length, or to the end of the stream).
  absl::StatusOr<HttpsResponse> Exchange(const std::string& method, const std::string& path,
                                         const std::string& body, bool keep_alive) {
    const std::string request = StrCat(
        method, " ", path,
        " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: ", keep_alive ? "keep-alive" : "close",
        "\r\nContent-Type: application/json\r\nContent-Length: ", body.size(), "\r\n\r\n", body);
    if (SSL_write(ssl_.get(), request.data(), static_cast<int>(request.size())) <= 0) {
      return absl::UnavailableError("cannot send the request");
    }
    size_t header_end;
    while ((header_end = pending_.find("\r\n\r\n")) == std::string::npos) {
      if (!ReadMore()) return absl::UnavailableError("the connection closed before a response");
    }
    if (pending_.compare(0, 9, "HTTP/1.1 ") != 0) {
      return absl::DataLossError(StrCat("not an HTTP response: ", pending_.substr(0, 200)));
    }
    HttpsResponse response;
    response.status = std::atoi(pending_.c_str() + 9);
    response.server_serial = serial_;
    std::string headers = pending_.substr(0, header_end);
    for (char& c : headers) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const size_t length_at = headers.find("content-length: ");
    if (length_at == std::string::npos) {
      while (ReadMore()) {
      }
      response.body = pending_.substr(header_end + 4);
      pending_.clear();
      return response;
    }
    const size_t length = std::stoul(headers.substr(length_at + 16));
    while (pending_.size() < header_end + 4 + length) {
      if (!ReadMore()) return absl::DataLossError("the response body was cut short");
    }
    response.body = pending_.substr(header_end + 4, length);
    pending_.erase(0, header_end + 4 + length);
    return response;
  }

 private:
  bool ReadMore() {
    char buffer[16384];
    const int n = SSL_read(ssl_.get(), buffer, sizeof(buffer));
    if (n <= 0) return false;
    pending_.append(buffer, static_cast<size_t>(n));
    return true;
  }

  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> context_{nullptr, SSL_CTX_free};
  std::unique_ptr<SSL, decltype(&SSL_free)> ssl_{nullptr, SSL_free};
  int fd_ = -1;
  std::string serial_;
  std::string pending_;
};

}  // namespace

absl::StatusOr<HttpsResponse> HttpsRequest(int port, const std::string& ca_file,
                                           const std::string& method, const std::string& path,
                                           const std::string& body) {
  TlsConnection connection;
  CLUSTERPROF_RETURN_IF_ERROR(connection.Connect(port, ca_file));
  return connection.Exchange(method, path, body, /*keep_alive=*/false);
}

absl::StatusOr<std::vector<HttpsResponse>> HttpsPostsOnOneConnection(
    int port, const std::string& ca_file, const std::string& path,
    const std::vector<std::string>& bodies) {
  TlsConnection connection;
  CLUSTERPROF_RETURN_IF_ERROR(connection.Connect(port, ca_file));
  std::vector<HttpsResponse> responses;
  for (size_t i = 0; i < bodies.size(); ++i) {
    CLUSTERPROF_ASSIGN_OR_RETURN(
        HttpsResponse response,
        connection.Exchange("POST", path, bodies[i], /*keep_alive=*/i + 1 < bodies.size()));
    responses.push_back(std::move(response));
  }
  return responses;
}

}  // namespace clusterprof::testing
