// A CA for TLS tests, made in process with OpenSSL: certificates for any names and any validity
// (expired ones included), and files published as the kubelet publishes a Secret's (a directory
// swapped in with one rename), so rotation tests see what pods see.
#ifndef CLUSTERPROF_TESTS_SUPPORT_TEST_PKI_H_
#define CLUSTERPROF_TESTS_SUPPORT_TEST_PKI_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace clusterprof::testing {

struct IssuedPair {
  std::string cert_pem;
  std::string key_pem;
};

// Not thread-safe. Aborts on OpenSSL failures (tests only).
class TestCa {
 public:
  explicit TestCa(const std::string& name = "clusterprof-test-ca");
  ~TestCa();
  TestCa(const TestCa&) = delete;
  TestCa& operator=(const TestCa&) = delete;

  const std::string& ca_pem() const { return ca_pem_; }
  // An EC P-256 serving certificate for `dns_names`, valid from now + not_before_s to now +
  // not_after_s (negative: in the past), with the common name `cn`.
  IssuedPair Issue(const std::vector<std::string>& dns_names, int64_t not_before_s = -60,
                   int64_t not_after_s = 86400, const std::string& cn = "clusterprof-sidecar");

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string ca_pem_;
};

// Writes `files` (name -> content) into `dir` the way the kubelet updates a mounted Secret: the
// contents go into a fresh directory dir/..<n>, dir/..data is swapped to it with one rename, and
// dir/<name> are links to ..data/<name>. Call again to rotate.
void PublishSecret(const std::string& dir, const std::map<std::string, std::string>& files);

}  // namespace clusterprof::testing

#endif  // CLUSTERPROF_TESTS_SUPPORT_TEST_PKI_H_
