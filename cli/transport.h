// How the CLI reaches sidecars: --tls-ca / --tls-server-name / --insecure, shared by capture and
// top (docs/cli.md, "TLS").
#ifndef CLUSTERPROF_CLI_TRANSPORT_H_
#define CLUSTERPROF_CLI_TRANSPORT_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/grpc/tls.h"

namespace clusterprof::cli {

struct TransportFlags {
  // The CA that issued the sidecars' certificate: TLS to every target.
  std::string tls_ca;
  // The name verified in the sidecars' certificate (the chart's sidecar.tls.serverName).
  std::string tls_server_name = tls::kDefaultServerName;
  // Plaintext to every target.
  bool insecure = false;
};

// Whether `address` (host:port) names this machine's loopback: localhost, 127.0.0.0/8 or [::1].
bool IsLoopbackAddress(std::string_view address);

// TLS with --tls-ca; plaintext with --insecure; with neither, plaintext when every target is on
// loopback (local sidecars, or a pod's through kubectl port-forward, which arrives at the
// sidecar's plaintext loopback listener) and an error naming a target that is not, since a
// token sent in plaintext across a network can be read on the way.
absl::StatusOr<std::shared_ptr<const tls::ChannelSecurity>> ChooseTransport(
    const TransportFlags& flags, const std::vector<std::string>& addresses);

}  // namespace clusterprof::cli

#endif  // CLUSTERPROF_CLI_TRANSPORT_H_
