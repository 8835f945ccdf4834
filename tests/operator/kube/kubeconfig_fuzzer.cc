// Fuzzes kubeconfig parsing (LoadKubeconfigFromString) with arbitrary text: it must return a
// Status, never throw or crash, and a config it accepts must hold what RestConfig promises:
// - the server is an http:// or https:// URL with a host, no spaces or control characters and
//   no trailing slash;
// - a client certificate comes with its key, and both are PEM;
// - insecure-skip-tls-verify never comes with a CA;
// - the namespace and the description are not empty.
// The first line may be "#context NAME", which selects a context as --context would.
// The kubeconfig's path lies in a directory that does not exist, so relative file references
// fail to resolve instead of reading the working directory; exec credential plugins are turned
// off, so that no input makes it start a program.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/base/clock.h"
#include "operator/kube/config.h"

namespace {

void Check(bool condition) {
  if (!condition) __builtin_trap();
}

bool IsPem(std::string_view s) { return s.find("-----BEGIN ") != std::string_view::npos; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view yaml(reinterpret_cast<const char*>(data), size);
  std::string context;
  if (yaml.starts_with("#context ")) {
    const size_t end = yaml.find('\n');
    context = std::string(yaml.substr(9, end == yaml.npos ? yaml.npos : end - 9));
  }
  clusterprof::SimulatedClock clock;
  clusterprof::kube::ExecOptions exec;
  exec.allow = false;
  absl::StatusOr<clusterprof::kube::RestConfig> config =
      clusterprof::kube::LoadKubeconfigFromString(yaml, "/nonexistent-kubeconfig-fuzz/config",
                                                  context, &clock, exec);
  if (!config.ok()) {
    Check(!config.status().message().empty());
    return 0;
  }
  const std::string_view server = config->server;
  Check(server.starts_with("https://") || server.starts_with("http://"));
  Check(server.substr(server.find("://") + 3).size() > 0);
  Check(!server.ends_with("/"));
  for (char c : server) Check(static_cast<unsigned char>(c) > ' ' && c != 0x7f);
  Check(config->client_cert_pem.empty() == config->client_key_pem.empty());
  Check(config->client_cert_pem.empty() || IsPem(config->client_cert_pem));
  Check(config->client_key_pem.empty() || IsPem(config->client_key_pem));
  Check(config->ca_pem.empty() || IsPem(config->ca_pem));
  Check(!(config->insecure_skip_tls_verify && !config->ca_pem.empty()));
  Check(!config->namespace_.empty());
  Check(!config->description.empty());
  if (config->token != nullptr) {
    absl::StatusOr<std::string> token = config->token->Token();
    Check(token.ok());
  }
  return 0;
}
