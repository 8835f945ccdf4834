// TLS on the sidecars' gRPC port (docs/security.md): the server's credentials, which reread the
// certificate and key when they change, and the clients' (operator, CLI), which verify a
// sidecar's certificate against a CA file and a fixed name, reread the CA too, and, when a
// handshake fails, look at the peer's certificate themselves to say why.
//
// gRPC 1.51's TLS classes are all grpc::experimental; they stay behind this header.
#ifndef CLUSTERPROF_COMMON_GRPC_TLS_H_
#define CLUSTERPROF_COMMON_GRPC_TLS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace grpc {
class ChannelArguments;
class ChannelCredentials;
class ServerCredentials;
}  // namespace grpc

namespace clusterprof::tls {

// The name a sidecar's certificate carries and every client verifies, in place of the pod IP,
// which no shared certificate can name. The chart issues the sidecars' certificate for it.
inline constexpr char kDefaultServerName[] = "clusterprof-sidecar";

// How often credential files are reread. The kubelet updates a mounted Secret within about a
// minute; a few seconds more is nothing beside that, and rereading is a stat and a small read.
inline constexpr unsigned kDefaultReloadSeconds = 5;

// What a PEM certificate says, for logs, metrics and error messages.
struct CertificateInfo {
  std::string subject;  // "CN=clusterprof-sidecar"
  std::string issuer;
  std::vector<std::string> dns_names;  // subjectAltName DNS entries
  int64_t not_before_s = 0;            // seconds since the epoch
  int64_t not_after_s = 0;
};

// The first certificate of a PEM file. Errors name the file and what is wrong with it.
absl::StatusOr<CertificateInfo> ReadCertificate(const std::string& cert_file);

// Checks a serving pair before it is used: both files readable, the certificate PEM, the key a
// PEM private key that belongs to the certificate. Errors name the file and the fault; no key
// material is ever put into them.
absl::Status CheckKeyPair(const std::string& cert_file, const std::string& key_file);

// Server credentials for TLS with the pair of files, reread every `reload_seconds` (>= 1). A
// new pair is served to new connections; connections open keep theirs. Checks the pair first
// (CheckKeyPair). The pair must be replaced as a whole (a Secret's atomic symlink swap): a key
// read with the other pair's certificate fails the handshakes until the next reread.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const std::string& cert_file, const std::string& key_file,
    unsigned reload_seconds = kDefaultReloadSeconds);

// How a client reaches sidecars: plaintext, or TLS verified against a CA file and a fixed name.
// One per process, shared by every channel (TLS: the CA file is reread on a thread of its own).
// Thread-safe.
class ChannelSecurity {
 public:
  static std::shared_ptr<const ChannelSecurity> Insecure();
  // Checks that the CA file holds at least one certificate.
  static absl::StatusOr<std::shared_ptr<const ChannelSecurity>> Tls(
      std::string ca_file, std::string server_name = kDefaultServerName,
      unsigned reload_seconds = kDefaultReloadSeconds);

  bool tls() const { return tls_; }
  const std::string& ca_file() const { return ca_file_; }
  const std::string& server_name() const { return server_name_; }

  std::shared_ptr<grpc::ChannelCredentials> credentials() const { return credentials_; }
  // Sets what the channel needs beside the credentials (the name verified, TLS only).
  void ConfigureArgs(grpc::ChannelArguments* args) const;

  // After a call to `address` (host:port) failed to connect: what a TLS handshake with it shows,
  // as a sentence naming the cause ("the certificate of 10.0.0.2:8466 expired at
  // 2026-01-01T00:00:00Z"; for a plaintext client, "10.0.0.2:8466 serves TLS ..."), or "" when
  // the handshake is not the problem. Blocks up to `timeout_ms`.
  std::string Diagnose(const std::string& address, int64_t timeout_ms = 2000) const;

 private:
  ChannelSecurity() = default;

  bool tls_ = false;
  std::string ca_file_;
  std::string server_name_;
  std::shared_ptr<grpc::ChannelCredentials> credentials_;
};

// Whether a failed call's message is one a TLS handshake gives (a certificate not verified, a
// name not matched, a plaintext peer): a configuration fault that retrying does not mend.
bool IsTlsVerificationFailure(std::string_view message);

// The cause of a failed call's TLS trouble, from its message (with Diagnose's sentence where
// there is one), for metrics: "certificate_expired", "certificate_unknown_ca",
// "certificate_wrong_name", "plaintext_peer", "tls_peer" (a plaintext client met a TLS server),
// "tls_other"; "" when the message is not of TLS.
std::string_view TlsFailureReason(std::string_view message);

}  // namespace clusterprof::tls

#endif  // CLUSTERPROF_COMMON_GRPC_TLS_H_
