// Where the Kubernetes client finds its API server and credentials: in-cluster (the pod's
// service account) or kubeconfig files, with the rules of client-go's clientcmd and kubectl.
//
//   RestConfig config = LoadDefaultConfig(options, ProcessEnvironment(), {}, &clock).value();
//
// Every loader returns a Status that names the file, the field (with its line and column) and
// what to do; nothing throws. The result is plain data plus a TokenSource that the REST client
// asks for the bearer token on each request.
#ifndef CLUSTERPROF_OPERATOR_KUBE_CONFIG_H_
#define CLUSTERPROF_OPERATOR_KUBE_CONFIG_H_

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/clock.h"

namespace clusterprof::kube {

// Environment variables by name, so that tests pass a map instead of changing the process's
// environment. Implementations are thread-safe.
class Environment {
 public:
  virtual ~Environment() = default;
  // The value; nullopt when the variable is not set.
  virtual std::optional<std::string> Get(std::string_view name) const = 0;
};

// The process's environment (getenv). Thread-safe as long as nothing calls setenv.
class ProcessEnvironment final : public Environment {
 public:
  std::optional<std::string> Get(std::string_view name) const override;
};

// A fixed set of variables. Thread-safe.
class MapEnvironment final : public Environment {
 public:
  explicit MapEnvironment(std::map<std::string, std::string, std::less<>> variables)
      : variables_(std::move(variables)) {}
  // MapEnvironment env({{"HOME", "/home/u"}}): without this, a single pair of string literals
  // would also read as std::map's iterator-pair constructor.
  MapEnvironment(std::initializer_list<std::pair<const std::string, std::string>> variables)
      : variables_(variables) {}
  std::optional<std::string> Get(std::string_view name) const override;

 private:
  const std::map<std::string, std::string, std::less<>> variables_;
};

// Supplies the bearer token for each request. Implementations are thread-safe.
class TokenSource {
 public:
  virtual ~TokenSource();
  // The token to send now; an error when there is none (the request should fail with it).
  virtual absl::StatusOr<std::string> Token() = 0;
  // Called after a 401: the next Token() re-reads its source.
  virtual void Invalidate() {}
};

// Always the same token (a kubeconfig `token`).
std::shared_ptr<TokenSource> StaticToken(std::string token);

// client-go re-reads token files once a minute.
inline constexpr int64_t kTokenFileMaxAgeNs = 60 * kNanosPerSecond;

// The token in the file at `path`, whitespace trimmed: a projected service-account token, or a
// kubeconfig `tokenFile`. Each Token() stats the path (following symlinks) and re-reads the file
// when its device, inode, mtime or size differ from the copy it holds: kubelet rotates projected
// tokens by swapping the `..data` symlink, which changes the inode at once. It also re-reads
// when the copy is older than `max_age_ns` (an in-place rewrite within the mtime granularity
// changes nothing stat can see) and after Invalidate(). A missing, unreadable or empty file is
// an error naming the path, every time: the old token is not used after its file is gone.
// Thread-safe; `clock` must outlive the source.
std::shared_ptr<TokenSource> FileToken(std::string path, Clock* clock,
                                       int64_t max_age_ns = kTokenFileMaxAgeNs);

// Impersonation headers (Impersonate-User, -Uid, -Group, -Extra-<key>) from a kubeconfig user's
// `as`, `as-uid`, `as-groups` and `as-user-extra`. Empty: no impersonation.
struct Impersonation {
  std::string user;
  std::string uid;
  std::vector<std::string> groups;
  std::map<std::string, std::vector<std::string>> extra;

  bool empty() const { return user.empty() && uid.empty() && groups.empty() && extra.empty(); }
};

// How to reach and authenticate to one API server. Plain data, except `token`, which is shared
// and thread-safe; a token source from a file or an exec plugin holds the Clock the loader was
// given, so that Clock must outlive the config.
//
// Exec credential plugins (gke-gcloud-auth-plugin, `aws eks get-token`, kubelogin) run as
// client-go runs them (operator/kube/exec_credential.h): once when the config is loaded, and
// again when their token expires or the server answers 401. Their client certificates are
// taken from the run at load and not renewed; a process that outlives them loads its config
// again. A token or client certificate written in the kubeconfig wins over the user's exec
// block, which then does not run (as in client-go).
//
// Not supported, each an error when the selected context needs it (never silently ignored):
// auth-providers (the legacy gcp and azure providers, which client-go removed too, and oidc;
// the error names the exec plugin that replaces each), basic auth (kube-apiserver removed it in
// 1.19) and the cluster's `proxy-url` (the REST client connects directly; HTTPS_PROXY and
// friends are the REST client's business, not the kubeconfig's).
struct RestConfig {
  // "https://host:port", possibly with a path prefix (a proxying front end); no trailing slash.
  std::string server;
  // CA bundle (PEM); empty means the system roots.
  std::string ca_pem;
  // Never true together with a non-empty ca_pem.
  bool insecure_skip_tls_verify = false;
  // SNI and the name the server certificate is checked against; empty: the server's host.
  std::string tls_server_name;
  // Client certificate authentication (PEM): both or neither.
  std::string client_cert_pem;
  std::string client_key_pem;
  // Bearer token; null: none.
  std::shared_ptr<TokenSource> token;
  Impersonation impersonate;
  // The cluster's `disable-compression`: do not ask for gzip responses.
  bool disable_compression = false;
  // The context's namespace, or the service account's; "default" otherwise.
  std::string namespace_ = "default";
  // Where this came from, for error messages: `kubeconfig /home/u/.kube/config, context
  // "kind-kind", cluster "kind-kind", user "kind-kind"` or `in-cluster (service account
  // "ns/name")`.
  std::string description;
  // Empty: the REST client's default.
  std::string user_agent;
};

// The files of a pod's service account; parameters so that tests use fixture trees.
struct InClusterPaths {
  std::string token_file = "/var/run/secrets/kubernetes.io/serviceaccount/token";
  std::string ca_file = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";
  std::string namespace_file = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";
};

// The pod's own API access, as client-go's rest.InClusterConfig: the server from
// KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT (an IPv6 host in brackets), the token
// through FileToken (so rotation is seen), the CA from `paths.ca_file`, the namespace from
// $POD_NAMESPACE, else the namespace file, else "default". FailedPrecondition when the variables
// are not set (not in a pod); NotFound / InvalidArgument naming the path when the token or CA
// cannot be read.
absl::StatusOr<RestConfig> LoadInClusterConfig(const Environment& env, const InClusterPaths& paths,
                                               Clock* clock);

// How exec credential plugins run (operator/kube/exec_credential.h).
struct ExecOptions {
  // A non-interactive run that takes longer is killed and is an error (DeadlineExceeded).
  int64_t timeout_ns = 60 * kNanosPerSecond;
  // Where a bare command name is looked up (':'-separated); nullopt: this process's $PATH.
  std::optional<std::string> search_path;
  // Whether stdin is a terminal (interactiveMode IfAvailable and Always); null: isatty(0).
  std::function<bool()> stdin_is_terminal;
  // false: a user with an exec block is a FailedPrecondition error and nothing runs (for callers
  // that load kubeconfigs they do not trust, such as the kubeconfig fuzzer).
  bool allow = true;
};

struct KubeconfigOptions {
  // Explicit files (--kubeconfig): each must exist. Empty: $KUBECONFIG split on ':' (missing
  // files skipped, at least one must exist), else $HOME/.kube/config.
  std::vector<std::string> paths;
  // --context; empty: the merged current-context.
  std::string context;
  ExecOptions exec;
};

// Loads and merges kubeconfig files as clientcmd does: files in order, and the first file to
// set a value wins (the first definition of a cluster, user or context name; the first
// current-context). Relative file references (certificate-authority, client-certificate,
// client-key, tokenFile) resolve against the directory of the file that defined the entry.
// A context that is not found lists the available ones. An exec user's plugin runs here
// (options.exec), and its errors (ExecTokenSource, RunExecPlugin) name the user, the context,
// the plugin and where the kubeconfig configures it; auth-provider users are Unimplemented
// errors that name the provider and the exec plugin to use instead.
absl::StatusOr<RestConfig> LoadKubeconfig(const KubeconfigOptions& options, const Environment& env,
                                          Clock* clock);

// One kubeconfig given as text; `path` names it in errors and in the description, and relative
// file references resolve against its directory. `context` and `exec` as in KubeconfigOptions.
absl::StatusOr<RestConfig> LoadKubeconfigFromString(std::string_view yaml, std::string_view path,
                                                    std::string_view context, Clock* clock,
                                                    const ExecOptions& exec = {});

// kubectl's order: kubeconfig when files are given explicitly (or a context is, which only a
// kubeconfig has); else in-cluster when KUBERNETES_SERVICE_HOST is set and KUBECONFIG is not;
// else $KUBECONFIG / ~/.kube/config.
absl::StatusOr<RestConfig> LoadDefaultConfig(const KubeconfigOptions& options,
                                             const Environment& env,
                                             const InClusterPaths& in_cluster, Clock* clock);

}  // namespace clusterprof::kube

#endif  // CLUSTERPROF_OPERATOR_KUBE_CONFIG_H_
