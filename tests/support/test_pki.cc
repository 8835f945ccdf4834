#include "tests/support/test_pki.h"

#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace clusterprof::testing {
namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "test PKI: %s failed\n", what);
    std::abort();
  }
}

EVP_PKEY* NewKey() {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  Check(key != nullptr, "EVP_EC_gen");
  return key;
}

std::string Pem(X509* cert) {
  BIO* bio = BIO_new(BIO_s_mem());
  Check(PEM_write_bio_X509(bio, cert) == 1, "PEM_write_bio_X509");
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio, &data);
  std::string out(data, static_cast<size_t>(size));
  BIO_free(bio);
  return out;
}

std::string Pem(EVP_PKEY* key) {
  BIO* bio = BIO_new(BIO_s_mem());
  Check(PEM_write_bio_PrivateKey(bio, key, nullptr, nullptr, 0, nullptr, nullptr) == 1,
        "PEM_write_bio_PrivateKey");
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio, &data);
  std::string out(data, static_cast<size_t>(size));
  BIO_free(bio);
  return out;
}

void AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* extension = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  Check(extension != nullptr, "X509V3_EXT_conf_nid");
  X509_add_ext(cert, extension, -1);
  X509_EXTENSION_free(extension);
}

X509* NewCertificate(EVP_PKEY* key, const std::string& cn, int64_t not_before_s,
                     int64_t not_after_s) {
  static std::atomic<long> serial{1000};
  X509* cert = X509_new();
  X509_set_version(cert, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert), serial++);
  X509_gmtime_adj(X509_getm_notBefore(cert), static_cast<long>(not_before_s));
  X509_gmtime_adj(X509_getm_notAfter(cert), static_cast<long>(not_after_s));
  X509_set_pubkey(cert, key);
  X509_NAME* name = X509_get_subject_name(cert);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  return cert;
}

}  // namespace

struct TestCa::Impl {
  EVP_PKEY* key = nullptr;
  X509* cert = nullptr;
  ~Impl() {
    X509_free(cert);
    EVP_PKEY_free(key);
  }
};

TestCa::TestCa(const std::string& name) : impl_(std::make_unique<Impl>()) {
  impl_->key = NewKey();
  impl_->cert = NewCertificate(impl_->key, name, -3600, 10 * 86400);
  X509_set_issuer_name(impl_->cert, X509_get_subject_name(impl_->cert));
  AddExtension(impl_->cert, impl_->cert, NID_basic_constraints, "critical,CA:TRUE");
  AddExtension(impl_->cert, impl_->cert, NID_key_usage, "critical,keyCertSign,cRLSign");
  AddExtension(impl_->cert, impl_->cert, NID_subject_key_identifier, "hash");
  Check(X509_sign(impl_->cert, impl_->key, EVP_sha256()) > 0, "X509_sign");
  ca_pem_ = Pem(impl_->cert);
}

TestCa::~TestCa() = default;

IssuedPair TestCa::Issue(const std::vector<std::string>& dns_names, int64_t not_before_s,
                         int64_t not_after_s, const std::string& cn) {
  EVP_PKEY* key = NewKey();
  X509* cert = NewCertificate(key, cn, not_before_s, not_after_s);
  X509_set_issuer_name(cert, X509_get_subject_name(impl_->cert));
  AddExtension(cert, impl_->cert, NID_basic_constraints, "critical,CA:FALSE");
  AddExtension(cert, impl_->cert, NID_key_usage, "critical,digitalSignature,keyEncipherment");
  AddExtension(cert, impl_->cert, NID_ext_key_usage, "serverAuth");
  AddExtension(cert, impl_->cert, NID_authority_key_identifier, "keyid");
  if (!dns_names.empty()) {
    std::string sans;
    for (const std::string& name : dns_names) sans += (sans.empty() ? "DNS:" : ",DNS:") + name;
    AddExtension(cert, impl_->cert, NID_subject_alt_name, sans);
  }
  Check(X509_sign(cert, impl_->key, EVP_sha256()) > 0, "X509_sign");
  IssuedPair pair{Pem(cert), Pem(key)};
  X509_free(cert);
  EVP_PKEY_free(key);
  return pair;
}

void PublishSecret(const std::string& dir, const std::map<std::string, std::string>& files) {
  namespace fs = std::filesystem;
  static std::atomic<int> generation{0};
  fs::create_directories(dir);
  const std::string version = "..v" + std::to_string(++generation);
  fs::create_directories(dir + "/" + version);
  for (const auto& [name, content] : files) {
    std::ofstream out(dir + "/" + version + "/" + name, std::ios::binary | std::ios::trunc);
    out << content;
    Check(static_cast<bool>(out.flush()), "writing a secret file");
  }
  const std::string temporary = dir + "/..data_tmp";
  fs::remove(temporary);
  fs::create_directory_symlink(version, temporary);
  fs::rename(temporary, dir + "/..data");
  for (const auto& [name, content] : files) {
    const std::string link = dir + "/" + name;
    if (!fs::is_symlink(fs::symlink_status(link))) fs::create_symlink("..data/" + name, link);
  }
}

}  // namespace clusterprof::testing
