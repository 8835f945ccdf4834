// clusterprof-operator's settings: flags, or a YAML file (--config) with the same names in
// snake_case; a flag given on the command line wins over the file. Each is declared once, in
// operator_config.cc's table, which makes the flags, the YAML reader and docs/operator.md's
// table.
#ifndef CLUSTERPROF_OPERATOR_MANAGER_OPERATOR_CONFIG_H_
#define CLUSTERPROF_OPERATOR_MANAGER_OPERATOR_CONFIG_H_

#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/settings/settings.h"
#include "operator/manager/manager.h"

namespace clusterprof::manager {

struct OperatorConfig {
  // The settings that RunManager takes as they are; their defaults are ManagerOptions'.
  ManagerOptions manager;
  // The settings that ManagerOptions takes in another form (ManagerOptionsFrom).
  std::string kubeconfig;
  std::string context;
  // Empty: $POD_NAMESPACE, else manager.leader_election_namespace.
  std::string leader_election_namespace;
  std::vector<std::string> allowed_logdirs;
  std::string sidecar_tls_ca_file;
  std::string sidecar_tls_server_name;
  std::string injection_config;
  std::string log_format = "auto";
  std::string log_level = "info";

  OperatorConfig();
};

// Every setting: its flag, YAML key, help and docs.
std::span<const settings::Setting<OperatorConfig>> OperatorSettings();

// What RunManager takes, less the API access (rest_config): the injection config read, the
// sidecars' TLS set up, the allowed logdirs parsed. Errors name the setting and the file.
// `pod_namespace` is $POD_NAMESPACE, if set.
absl::StatusOr<ManagerOptions> ManagerOptionsFrom(const OperatorConfig& config,
                                                  const std::optional<std::string>& pod_namespace);

}  // namespace clusterprof::manager

#endif  // CLUSTERPROF_OPERATOR_MANAGER_OPERATOR_CONFIG_H_
