#include "tests/support/test_certificates.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <random>

#include "common/status.h"
#include "common/strings.h"
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

absl::StatusOr<HttpsResponse> HttpsRequest(int port, const std::string& ca_file,
                                           const std::string& method, const std::string& path,
                                           const std::string& body) {
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> context(SSL_CTX_new(TLS_client_method()),
                                                            SSL_CTX_free);
  if (SSL_CTX_load_verify_locations(context.get(), ca_file.c_str(), nullptr) != 1) {
    return absl::InvalidArgumentError(StrCat("cannot load the CA ", ca_file, ": ", OpenSslError()));
  }
  SSL_CTX_set_verify(context.get(), SSL_VERIFY_PEER, nullptr);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return absl::UnavailableError(StrCat("cannot connect to 127.0.0.1:", port));
  }
  std::unique_ptr<SSL, decltype(&SSL_free)> ssl(SSL_new(context.get()), SSL_free);
  SSL_set_fd(ssl.get(), fd);
  X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl.get()), "127.0.0.1");
  if (SSL_connect(ssl.get()) != 1) {
    const long verify = SSL_get_verify_result(ssl.get());
    const std::string error = OpenSslError();
    close(fd);
    return absl::UnavailableError(StrCat("TLS handshake with 127.0.0.1:", port, " failed: ",
                                         X509_verify_cert_error_string(verify), " (", error, ")"));
  }
  HttpsResponse response;
  if (X509* peer = SSL_get1_peer_certificate(ssl.get())) {
    BIGNUM* serial = ASN1_INTEGER_to_BN(X509_get_serialNumber(peer), nullptr);
    char* hex = BN_bn2hex(serial);
    response.server_serial = hex;
    OPENSSL_free(hex);
    BN_free(serial);
    X509_free(peer);
  }
  const std::string request =
      StrCat(method, " ", path, " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n",
             "Content-Type: application/json\r\nContent-Length: ", body.size(), "\r\n\r\n", body);
  if (SSL_write(ssl.get(), request.data(), static_cast<int>(request.size())) <= 0) {
    close(fd);
    return absl::UnavailableError("cannot send the request");
  }
  std::string raw;
  char buffer[16384];
  for (;;) {
    const int n = SSL_read(ssl.get(), buffer, sizeof(buffer));
    if (n <= 0) break;
    raw.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  const size_t header_end = raw.find("\r\n\r\n");
  if (raw.compare(0, 9, "HTTP/1.1 ") != 0 || header_end == std::string::npos) {
    return absl::DataLossError(StrCat("not an HTTP response: ", raw.substr(0, 200)));
  }
  response.status = std::atoi(raw.c_str() + 9);
  response.body = raw.substr(header_end + 4);
  return response;
}

}  // namespace clusterprof::testing
