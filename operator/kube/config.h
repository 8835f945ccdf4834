// PLACEHOLDER until the config loader lands: the shape the REST client consumes.
#ifndef CLUSTERPROF_OPERATOR_KUBE_CONFIG_H_
#define CLUSTERPROF_OPERATOR_KUBE_CONFIG_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace clusterprof::kube {

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual absl::StatusOr<std::string> Token() = 0;
  virtual void Invalidate() {}
};

std::shared_ptr<TokenSource> StaticToken(std::string token);

struct RestConfig {
  std::string server;
  std::string ca_pem;
  bool insecure_skip_tls_verify = false;
  std::string tls_server_name;
  std::string client_cert_pem, client_key_pem;
  std::shared_ptr<TokenSource> token;
  std::string namespace_;
  std::string description;
  std::string user_agent;
};

}  // namespace clusterprof::kube

#endif  // CLUSTERPROF_OPERATOR_KUBE_CONFIG_H_
