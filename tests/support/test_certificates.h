// Certificates for tests that serve or call HTTPS: a fresh CA and a serving certificate it signed,
// made with the openssl CLI, and a small HTTPS client (OpenSSL) that verifies the server against
// a given CA and reports which certificate it served.
#ifndef CLUSTERPROF_TESTS_SUPPORT_TEST_CERTIFICATES_H_
#define CLUSTERPROF_TESTS_SUPPORT_TEST_CERTIFICATES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace clusterprof::testing {

struct TestCertificates {
  std::string ca_file;    // the CA certificate (PEM)
  std::string cert_file;  // <dir>/tls.crt: the serving certificate (PEM)
  std::string key_file;   // <dir>/tls.key: its key (PEM)
  std::string serial;     // the serving certificate's serial number, hex
};

// Makes a CA and a serving certificate for `sans` (e.g. {"IP:127.0.0.1", "DNS:localhost"}),
// written to `dir`/tls.crt and `dir`/tls.key (the layout of a kubernetes.io/tls Secret), with
// the CA in `dir`/ca.crt. Needs the openssl program.
absl::StatusOr<TestCertificates> MakeTestCertificates(const std::string& dir,
                                                      const std::vector<std::string>& sans = {
                                                          "IP:127.0.0.1", "DNS:localhost"});

struct HttpsResponse {
  int status = 0;
  std::string body;
  // The serial number (hex) of the certificate the server presented.
  std::string server_serial;
};

// One HTTP/1.1 request over TLS to 127.0.0.1:`port`, verifying the server's certificate against
// `ca_file` and the name 127.0.0.1. An error when the connection or the verification fails.
absl::StatusOr<HttpsResponse> HttpsRequest(int port, const std::string& ca_file,
                                           const std::string& method, const std::string& path,
                                           const std::string& body = "");

// `bodies.size()` POSTs to `path` over one kept-alive TLS connection, one after the other (the
// last says Connection: close), as the API server sends reviews over a pooled connection. An
// error when the server closes the connection before the last answer.
absl::StatusOr<std::vector<HttpsResponse>> HttpsPostsOnOneConnection(
    int port, const std::string& ca_file, const std::string& path,
    const std::vector<std::string>& bodies);

}  // namespace clusterprof::testing

#endif  // CLUSTERPROF_TESTS_SUPPORT_TEST_CERTIFICATES_H_
