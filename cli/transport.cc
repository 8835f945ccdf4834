#include "cli/transport.h"

#include "common/base/strings.h"

namespace clusterprof::cli {

bool IsLoopbackAddress(std::string_view address) {
  const std::string_view host = AddressHost(address);
  return host == "localhost" || IsLoopbackIp(host);
}

absl::StatusOr<std::shared_ptr<const tls::ChannelSecurity>> ChooseTransport(
    const TransportFlags& flags, const std::vector<std::string>& addresses) {
  if (!flags.tls_ca.empty() && flags.insecure) {
    return absl::InvalidArgumentError("--tls-ca and --insecure contradict each other: give one");
  }
  if (!flags.tls_ca.empty()) {
    absl::StatusOr<std::shared_ptr<const tls::ChannelSecurity>> security =
        tls::ChannelSecurity::Tls(flags.tls_ca, flags.tls_server_name);
    if (!security.ok()) {
      return absl::InvalidArgumentError(StrCat("--tls-ca: ", security.status().message()));
    }
    return security;
  }
  if (flags.insecure) return tls::ChannelSecurity::Insecure();
  for (const std::string& address : addresses) {
    if (IsLoopbackAddress(address)) continue;
    return absl::InvalidArgumentError(StrCat(
        address,
        " is not on this machine, and sidecars elsewhere are reached over TLS: give --tls-ca "
        "FILE, the CA of their certificate (the chart's: kubectl get secret "
        "clusterprof-sidecar-tls -n NAMESPACE -o jsonpath='{.data.ca\\.crt}' | base64 -d > "
        "ca.crt), or --insecure for sidecars that serve plaintext (the token, if any, then "
        "crosses the network readable)"));
  }
  return tls::ChannelSecurity::Insecure();
}

}  // namespace clusterprof::cli
