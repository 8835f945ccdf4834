#include "common/grpc/tls.h"

#include <fcntl.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>

#include "absl/time/time.h"
#include "common/base/status.h"
#include "common/base/strings.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "grpcpp/support/channel_arguments.h"

namespace clusterprof::tls {
namespace {

namespace gx = grpc::experimental;

template <typename T, void (*Free)(T*)>
struct Deleter {
  void operator()(T* p) const { Free(p); }
};
using BioPtr = std::unique_ptr<BIO, Deleter<BIO, BIO_free_all>>;
using X509Ptr = std::unique_ptr<X509, Deleter<X509, X509_free>>;
using KeyPtr = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY, EVP_PKEY_free>>;
using StorePtr = std::unique_ptr<X509_STORE, Deleter<X509_STORE, X509_STORE_free>>;
using StoreCtxPtr = std::unique_ptr<X509_STORE_CTX, Deleter<X509_STORE_CTX, X509_STORE_CTX_free>>;
using SslCtxPtr = std::unique_ptr<SSL_CTX, Deleter<SSL_CTX, SSL_CTX_free>>;
using SslPtr = std::unique_ptr<SSL, Deleter<SSL, SSL_free>>;

// OpenSSL's error queue as text (and emptied), for messages; never holds key material.
std::string TakeOpensslErrors() {
  std::string out;
  while (unsigned long code = ERR_get_error()) {
    char buffer[256];
    ERR_error_string_n(code, buffer, sizeof(buffer));
    // "error:0A000086:SSL routines::certificate verify failed": the reason is the last part.
    std::string_view text(buffer);
    const size_t colon = text.rfind(':');
    if (colon != std::string_view::npos) text.remove_prefix(colon + 1);
    if (!out.empty()) out += "; ";
    out += text;
  }
  return out;
}

// Never prompts for a passphrase: an encrypted key is refused.
int NoPassphrase(char*, int, int, void*) { return -1; }

absl::StatusOr<X509Ptr> ReadPemCertificate(const std::string& path) {
  BioPtr bio(BIO_new_file(path.c_str(), "r"));
  if (bio == nullptr) {
    ERR_clear_error();
    return ErrnoToStatus(errno, "cannot read the certificate file", path);
  }
  X509Ptr cert(PEM_read_bio_X509(bio.get(), nullptr, NoPassphrase, nullptr));
  if (cert == nullptr) {
    const std::string why = TakeOpensslErrors();
    return absl::InvalidArgumentError(StrCat(path, " holds no PEM certificate (", why, ")"));
  }
  return cert;
}

std::string NameText(const X509_NAME* name) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  X509_NAME_print_ex(bio.get(), name, 0, XN_FLAG_RFC2253);
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(size));
}

int64_t AsnTimeSeconds(const ASN1_TIME* time) {
  std::tm tm = {};
  if (ASN1_TIME_to_tm(time, &tm) != 1) return 0;
  return static_cast<int64_t>(timegm(&tm));
}

CertificateInfo Describe(X509* cert) {
  CertificateInfo info;
  info.subject = NameText(X509_get_subject_name(cert));
  info.issuer = NameText(X509_get_issuer_name(cert));
  info.not_before_s = AsnTimeSeconds(X509_get0_notBefore(cert));
  info.not_after_s = AsnTimeSeconds(X509_get0_notAfter(cert));
  auto* names =
      static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  if (names != nullptr) {
    for (int i = 0; i < sk_GENERAL_NAME_num(names); ++i) {
      const GENERAL_NAME* name = sk_GENERAL_NAME_value(names, i);
      if (name->type != GEN_DNS) continue;
      const ASN1_STRING* dns = name->d.dNSName;
      info.dns_names.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(dns)),
                                  static_cast<size_t>(ASN1_STRING_length(dns)));
    }
    GENERAL_NAMES_free(names);
  }
  return info;
}

std::string Rfc3339(int64_t seconds) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::FromUnixSeconds(seconds),
                          absl::UTCTimeZone());
}

std::string NamesText(const CertificateInfo& info) {
  if (info.dns_names.empty()) return "no DNS name";
  std::string out;
  for (const std::string& name : info.dns_names) {
    if (!out.empty()) out += ", ";
    out += "DNS:" + name;
  }
  return out;
}

// A TCP connection to host:port within `deadline` (absl::Now()-based), or -1.
int ConnectTcp(const std::string& address, absl::Time deadline) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return -1;
  const std::string host(AddressHost(address));
  const std::string port = address.substr(colon + 1);
  addrinfo hints = {};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0) return -1;
  int fd = -1;
  for (addrinfo* ai = found; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) continue;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) {
      close(fd);
      fd = -1;
      continue;
    }
    pollfd p = {fd, POLLOUT, 0};
    const int64_t wait_ms = std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now()));
    int error = 0;
    socklen_t length = sizeof(error);
    if (poll(&p, 1, static_cast<int>(wait_ms)) != 1 ||
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0 || error != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) return -1;
  // Blocking from here, each read and write bounded by what is left.
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  const int64_t left_us =
      std::max<int64_t>(1000, absl::ToInt64Microseconds(deadline - absl::Now()));
  timeval tv = {static_cast<time_t>(left_us / 1'000'000),
                static_cast<suseconds_t>(left_us % 1'000'000)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  return fd;
}

std::string ExplainVerifyError(const std::string& address, const std::string& ca_file, int error,
                               const CertificateInfo& peer) {
  const std::string whose =
      StrCat("the certificate of ", address, " (", peer.subject, ", issued by ", peer.issuer, ")");
  switch (error) {
    case X509_V_ERR_CERT_HAS_EXPIRED:
      return StrCat(whose, " expired at ", Rfc3339(peer.not_after_s),
                    ": issue a new one (the chart: helm upgrade --set sidecar.tls.renew=true; "
                    "cert-manager renews its own)");
    case X509_V_ERR_CERT_NOT_YET_VALID:
      return StrCat(whose, " is not valid before ", Rfc3339(peer.not_before_s),
                    " (is this machine's clock behind?)");
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
    case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
    case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
    case X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE:
    case X509_V_ERR_CERT_SIGNATURE_FAILURE:
      return StrCat(whose, " is not signed by a CA in ", ca_file,
                    ": give the CA that issued the sidecars' certificate (the chart's: the "
                    "ca.crt of the Secret clusterprof-sidecar-tls)");
    default:
      return StrCat(whose, " was not accepted: ", X509_verify_cert_error_string(error));
  }
}

}  // namespace

absl::StatusOr<CertificateInfo> ReadCertificate(const std::string& cert_file) {
  CLUSTERPROF_ASSIGN_OR_RETURN(X509Ptr cert, ReadPemCertificate(cert_file));
  return Describe(cert.get());
}

absl::Status CheckKeyPair(const std::string& cert_file, const std::string& key_file) {
  CLUSTERPROF_ASSIGN_OR_RETURN(X509Ptr cert, ReadPemCertificate(cert_file));
  BioPtr bio(BIO_new_file(key_file.c_str(), "r"));
  if (bio == nullptr) {
    ERR_clear_error();
    return ErrnoToStatus(errno, "cannot read the key file", key_file);
  }
  KeyPtr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassphrase, nullptr));
  if (key == nullptr) {
    ERR_clear_error();
    return absl::InvalidArgumentError(StrCat(key_file, " holds no unencrypted PEM private key"));
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(StrCat("the key in ", key_file,
                                             " does not belong to the certificate in ", cert_file,
                                             " (replace both together)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const std::string& cert_file, const std::string& key_file, unsigned reload_seconds) {
  CLUSTERPROF_RETURN_IF_ERROR(CheckKeyPair(cert_file, key_file));
  // 0 would make gRPC's watcher thread reread without pause.
  auto provider = std::make_shared<gx::FileWatcherCertificateProvider>(
      key_file, cert_file, std::max(1u, reload_seconds));
  gx::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  return gx::TlsServerCredentials(options);
}

std::shared_ptr<const ChannelSecurity> ChannelSecurity::Insecure() {
  std::shared_ptr<ChannelSecurity> security(new ChannelSecurity());
  security->credentials_ = grpc::InsecureChannelCredentials();
  return security;
}

absl::StatusOr<std::shared_ptr<const ChannelSecurity>> ChannelSecurity::Tls(
    std::string ca_file, std::string server_name, unsigned reload_seconds) {
  if (server_name.empty()) {
    return absl::InvalidArgumentError("the TLS server name is empty");
  }
  {
    absl::StatusOr<X509Ptr> ca = ReadPemCertificate(ca_file);
    if (!ca.ok()) {
      return absl::Status(ca.status().code(), StrCat("the TLS CA: ", ca.status().message()));
    }
  }
  std::shared_ptr<ChannelSecurity> security(new ChannelSecurity());
  security->tls_ = true;
  security->ca_file_ = std::move(ca_file);
  security->server_name_ = std::move(server_name);
  auto provider = std::make_shared<gx::FileWatcherCertificateProvider>(
      security->ca_file_, std::max(1u, reload_seconds));
  gx::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(provider);
  // Without this the system's trust store would be used, not the CA file.
  options.watch_root_certs();
  security->credentials_ = gx::TlsCredentials(options);
  return security;
}

void ChannelSecurity::ConfigureArgs(grpc::ChannelArguments* args) const {
  if (tls_) args->SetSslTargetNameOverride(server_name_);
}

std::string ChannelSecurity::Diagnose(const std::string& address, int64_t timeout_ms) const {
  const absl::Time deadline = absl::Now() + absl::Milliseconds(timeout_ms);
  const int fd = ConnectTcp(address, deadline);
  if (fd < 0) return "";  // not a TLS matter: the call's own message says it
  SslCtxPtr ctx(SSL_CTX_new(TLS_client_method()));
  SslPtr ssl(ctx != nullptr ? SSL_new(ctx.get()) : nullptr);
  if (ssl == nullptr) {
    close(fd);
    ERR_clear_error();
    return "";
  }
  // The certificate is judged below, where the reason can be told.
  SSL_set_verify(ssl.get(), SSL_VERIFY_NONE, nullptr);
  SSL_set_tlsext_host_name(ssl.get(), server_name_.c_str());
  static constexpr unsigned char kAlpn[] = {2, 'h', '2'};
  SSL_set_alpn_protos(ssl.get(), kAlpn, sizeof(kAlpn));
  SSL_set_fd(ssl.get(), fd);
  ERR_clear_error();
  const int connected = SSL_connect(ssl.get());
  std::string explanation;
  if (!tls_) {
    // A plaintext client whose server closed the connection: does the server speak TLS?
    if (connected == 1) {
      explanation = StrCat(address,
                           " serves TLS, and this client spoke plaintext: give the CA of its "
                           "certificate (--tls-ca; the operator's --sidecar-tls-ca-file)");
    }
  } else if (connected != 1) {
    const std::string why = TakeOpensslErrors();
    if (why.find("wrong version number") != std::string::npos ||
        why.find("packet length too long") != std::string::npos) {
      explanation = StrCat(address, " answered a TLS handshake in plaintext (", why,
                           "): a sidecar started without --tls-cert-file (the chart's "
                           "sidecar.tls.enabled=false); reach it with --insecure, or turn TLS "
                           "on there");
    } else {
      explanation = StrCat(address, " closed the connection during the TLS handshake (",
                           why.empty() ? "no alert" : why,
                           "): a plaintext sidecar, or one whose certificate and key do not "
                           "belong together (its log says which)");
    }
  } else if (X509Ptr peer(SSL_get1_peer_certificate(ssl.get())); peer == nullptr) {
    explanation = StrCat(address, " sent no certificate");
  } else {
    const CertificateInfo info = Describe(peer.get());
    StorePtr store(X509_STORE_new());
    StoreCtxPtr verify(X509_STORE_CTX_new());
    if (X509_STORE_load_file(store.get(), ca_file_.c_str()) != 1) {
      explanation = StrCat("cannot read the CA file ", ca_file_, " (", TakeOpensslErrors(), ")");
    } else if (X509_STORE_CTX_init(verify.get(), store.get(), peer.get(),
                                   SSL_get_peer_cert_chain(ssl.get())) == 1 &&
               X509_verify_cert(verify.get()) != 1) {
      explanation =
          ExplainVerifyError(address, ca_file_, X509_STORE_CTX_get_error(verify.get()), info);
    } else if (X509_check_host(peer.get(), server_name_.data(), server_name_.size(), 0, nullptr) !=
               1) {
      explanation =
          StrCat("the certificate of ", address, " names ", NamesText(info), ", not ", server_name_,
                 ": verify the name it carries (--tls-server-name, the chart's "
                 "sidecar.tls.serverName)");
    }
  }
  ERR_clear_error();
  SSL_shutdown(ssl.get());
  close(fd);
  return explanation;
}

bool IsTlsVerificationFailure(std::string_view message) {
  for (std::string_view text :
       {"certificate verify failed", "Hostname Verification Check failed", "wrong version number",
        "not in peer certificate", "Tls handshake failed", "Ssl handshake failed"}) {
    if (message.find(text) != std::string_view::npos) return true;
  }
  return false;
}

std::string_view TlsFailureReason(std::string_view message) {
  const auto has = [message](std::string_view text) {
    return message.find(text) != std::string_view::npos;
  };
  // Diagnose's sentences first: they say more than gRPC's text beside them.
  if (has(" expired at ")) return "certificate_expired";
  if (has(" is not signed by a CA in ")) return "certificate_unknown_ca";
  if (has("verify the name it carries") || has("Hostname Verification Check failed") ||
      has("not in peer certificate")) {
    return "certificate_wrong_name";
  }
  if (has("answered a TLS handshake in plaintext") || has("wrong version number")) {
    return "plaintext_peer";
  }
  if (has(" serves TLS, and this client spoke plaintext")) return "tls_peer";
  if (IsTlsVerificationFailure(message) || has("during the TLS handshake")) return "tls_other";
  return "";
}

}  // namespace clusterprof::tls
