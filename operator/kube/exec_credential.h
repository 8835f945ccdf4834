// Kubeconfig exec credential plugins (gke-gcloud-auth-plugin, `aws eks get-token`, kubelogin,
// ...), as client-go runs them (k8s.io/client-go/plugin/pkg/client/auth/exec): the plugin is a
// program that prints an ExecCredential (client.authentication.k8s.io/v1 or v1beta1) holding a
// bearer token, a client certificate and key, or both, and optionally when they expire.
//
//   ExecTokenSource source(config, options, &clock);
//   absl::StatusOr<ExecCredential> credential = source.Credential();  // runs the plugin
//
// The plugin runs with this process's environment plus the exec block's `env` and
// KUBERNETES_EXEC_INFO (the ExecCredential request: spec.interactive, and spec.cluster when the
// kubeconfig sets provideClusterInfo). A command with a '/' is a path (the kubeconfig loader
// resolves a relative one against the kubeconfig's directory); a bare name is looked up on PATH.
//
// Non-interactive runs (the usual case: interactiveMode Never, or IfAvailable without a
// terminal on stdin) get /dev/null as stdin, their stderr is kept for error messages, and they
// are killed (with their process group) after ExecOptions::timeout_ns. Interactive runs share
// this process's stdin and stderr, so that the plugin can prompt the user, and have no timeout:
// they wait on a person.
//
// Tokens are never logged and never put into error messages; neither is the plugin's stdout.
#ifndef CLUSTERPROF_OPERATOR_KUBE_EXEC_CREDENTIAL_H_
#define CLUSTERPROF_OPERATOR_KUBE_EXEC_CREDENTIAL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/base/clock.h"
#include "common/base/mutex.h"
#include "operator/kube/config.h"

namespace clusterprof::kube {

inline constexpr char kExecApiV1[] = "client.authentication.k8s.io/v1";
inline constexpr char kExecApiV1Beta1[] = "client.authentication.k8s.io/v1beta1";
// The name of the cluster extension whose value is handed to the plugin as spec.cluster.config.
inline constexpr char kExecClusterExtension[] = "client.authentication.k8s.io/exec";

enum class ExecInteractiveMode {
  kNever,        // never give the plugin stdin
  kIfAvailable,  // give it stdin when stdin is a terminal
  kAlways,       // the plugin needs a terminal: an error when stdin is not one
};

// The cluster as KUBERNETES_EXEC_INFO's spec.cluster describes it (provideClusterInfo).
struct ExecClusterInfo {
  std::string server;
  std::string tls_server_name;
  bool insecure_skip_tls_verify = false;
  std::string ca_pem;  // sent base64-encoded, as certificate-authority-data
  bool disable_compression = false;
  // The JSON of the cluster's extension named kExecClusterExtension; empty: none.
  std::string config_json;
};

// A kubeconfig user's `exec` block, decoded and checked by the kubeconfig loader.
struct ExecConfig {
  // A path (absolute, or relative to the working directory) when it holds a '/'; else a name
  // looked up on PATH.
  std::string command;
  std::vector<std::string> args;
  // Added to the plugin's environment, replacing variables of the same name.
  std::vector<std::pair<std::string, std::string>> env;
  std::string api_version;  // kExecApiV1 or kExecApiV1Beta1
  // Shown when the command is not found (the kubeconfig's installHint).
  std::string install_hint;
  ExecInteractiveMode interactive_mode = ExecInteractiveMode::kIfAvailable;
  // Set when the kubeconfig asks for provideClusterInfo.
  std::optional<ExecClusterInfo> cluster;
  // Names the plugin and where it was configured, at the start of every error:
  // `exec plugin "aws" of user "u" (kubeconfig /x/config: users[0].user.exec (line 4, column 7))`.
  std::string description;
};

// What the plugin printed (status of its ExecCredential).
struct ExecCredential {
  std::string token;  // bearer token; may be empty when certificates are given
  // status.expirationTimestamp, wall-clock ns; nullopt: does not expire.
  std::optional<int64_t> expires_wall_ns;
  // PEM; both or neither.
  std::string client_cert_pem;
  std::string client_key_pem;
};

// Runs the plugin once and checks its answer. Errors (each starting with config.description):
// - NotFound: the command is not on PATH or not at its path (with the install hint);
// - FailedPrecondition: interactiveMode Always without a terminal on stdin;
// - Unauthenticated: it exited non-zero (its stderr, trimmed, is in the message) or was killed;
// - DeadlineExceeded: it ran longer than options.timeout_ns (killed);
// - InvalidArgument: the output is not an ExecCredential of config.api_version (not JSON,
//   another apiVersion or kind, no status, neither a token nor a certificate and key, only one
//   of those two, a bad expirationTimestamp).
// Thread-safe; blocks for as long as the plugin runs.
absl::StatusOr<ExecCredential> RunExecPlugin(const ExecConfig& config, const ExecOptions& options);

// The KUBERNETES_EXEC_INFO value for a run (exposed for tests).
std::string ExecInfoJson(const ExecConfig& config, bool interactive);

// The bearer token of an exec plugin, as client-go's exec authenticator keeps it: the plugin's
// answer is cached until its expirationTimestamp (for ever when it has none) and the plugin run
// again after that, and after Invalidate() (an HTTP 401). There is no early refresh: plugins
// such as gke-gcloud-auth-plugin cache their own token and would hand back the same one, so the
// first request after the instant runs the plugin again. One run at a time: concurrent callers
// wait for it and share its answer. A failed run is not cached; the next call runs it again.
// Thread-safe; `clock` (wall time, for the expiry) must outlive the source.
class ExecTokenSource final : public TokenSource {
 public:
  ExecTokenSource(ExecConfig config, ExecOptions options, Clock* clock);

  // The plugin's token; an Unauthenticated error when its answer holds only a certificate.
  absl::StatusOr<std::string> Token() override;
  void Invalidate() override;
  // The whole answer, from the cache when it has not expired.
  absl::StatusOr<ExecCredential> Credential();
  // How many times the plugin ran (tests).
  int runs() const;

 private:
  absl::StatusOr<ExecCredential> CredentialLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ExecConfig config_;
  const ExecOptions options_;
  Clock* const clock_;
  mutable Mutex mu_;
  std::optional<ExecCredential> cached_ ABSL_GUARDED_BY(mu_);
  int runs_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace clusterprof::kube

#endif  // CLUSTERPROF_OPERATOR_KUBE_EXEC_CREDENTIAL_H_
