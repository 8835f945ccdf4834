// A real Kubernetes control plane for tests, the way Go operators test with envtest: etcd and
// kube-apiserver as child processes on loopback, with a generated CA, serving certificate,
// service-account key pair and static tokens. scripts/install-kube-control-plane installs the
// binaries (docs/development.md, "A real Kubernetes control plane for tests").
#ifndef CLUSTERPROF_TESTS_SUPPORT_KUBE_CONTROL_PLANE_H_
#define CLUSTERPROF_TESTS_SUPPORT_KUBE_CONTROL_PLANE_H_

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"

namespace clusterprof::testing {

// The kube-apiserver binary: $CLUSTERPROF_KUBE_APISERVER when set (an error when it is not an
// executable), else the newest kube-<version>/kube-apiserver in the install script's cache
// ($CLUSTERPROF_KUBE_CACHE, else $XDG_CACHE_HOME/clusterprof, else ~/.cache/clusterprof), else
// kube-apiserver on PATH. NotFound, naming the install script, when there is none.
absl::StatusOr<std::string> FindKubeApiserver();

// The etcd binary: $CLUSTERPROF_ETCD when set, else etcd on PATH, else /usr/bin/etcd (Debian's
// etcd-server). NotFound, naming the install script, when there is none.
absl::StatusOr<std::string> FindEtcd();

// The path of `name` on PATH; NotFound when it is not there.
absl::StatusOr<std::string> FindProgram(std::string_view name);

// What a command run to its end printed, and how it ended.
struct CommandResult {
  // The exit code; -1 when a signal ended it.
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs `argv` (argv[0] a path, or a name looked up on PATH) to its end with stdout and stderr
// captured. DeadlineExceeded (the process killed) after `timeout`; NotFound for an unknown
// program.
absl::StatusOr<CommandResult> RunCommand(std::vector<std::string> argv,
                                         std::chrono::seconds timeout = std::chrono::seconds(60));

struct KubeControlPlaneOptions {
  // Binaries; empty: FindKubeApiserver() and FindEtcd().
  std::string apiserver_path;
  std::string etcd_path;
  // How long Start() waits for /readyz.
  std::chrono::seconds ready_timeout = std::chrono::seconds(90);
  // Appended to kube-apiserver's command line (later flags override earlier ones).
  std::vector<std::string> extra_apiserver_flags;
};

// An HTTP response from the control plane's API server.
struct HttpResponse {
  int status_code = 0;
  std::string body;
};

// etcd and kube-apiserver on free 127.0.0.1 ports, with everything they need in a temporary
// directory: a self-signed CA and serving certificate (SANs 127.0.0.1 and localhost, made with
// the openssl CLI), a service-account key pair, and a static token file with an admin token
// (group system:masters) and an unprivileged user token (no roles: RBAC denies it everything
// until a test binds one). Authorization is RBAC; the ServiceAccount admission plugin is off
// (there is no controller manager to make default service accounts).
//
// There is no kube-controller-manager: no garbage collection, namespaces stay Terminating after
// deletion, pods stay Pending unless a test sets their status.
//
// Destruction stops both processes (SIGTERM, then SIGKILL) and removes the directory; both
// processes also die with a crashed test. The accessors are safe to call from any thread; Get()
// too.
class KubeControlPlane {
 public:
  static constexpr char kAdminUser[] = "clusterprof-admin";
  static constexpr char kUser[] = "clusterprof-user";

  // Starts etcd and kube-apiserver and waits until /readyz says ok. NotFound when a binary is
  // not installed (tests skip on it); other errors carry the tail of the failing process's log.
  static absl::StatusOr<std::unique_ptr<KubeControlPlane>> Start(
      const KubeControlPlaneOptions& options = {});

  ~KubeControlPlane();
  KubeControlPlane(const KubeControlPlane&) = delete;
  KubeControlPlane& operator=(const KubeControlPlane&) = delete;

  // "https://127.0.0.1:PORT".
  const std::string& url() const { return url_; }
  // The CA that signed the serving certificate (PEM).
  const std::string& ca_file() const { return ca_file_; }
  // A bearer token for kAdminUser in group system:masters.
  const std::string& admin_token() const { return admin_token_; }
  // A bearer token for kUser, with no roles.
  const std::string& user_token() const { return user_token_; }
  // Scratch space for the test, removed with the control plane.
  const std::string& dir() const { return dir_.path(); }
  const std::string& apiserver_log() const { return apiserver_log_; }
  pid_t apiserver_pid() const { return apiserver_->pid(); }
  pid_t etcd_pid() const { return etcd_->pid(); }

  // Writes a kubeconfig for `kubectl --kubeconfig` (and other clients) that reaches this server
  // with `token`, verifying the serving certificate against ca_file().
  absl::Status WriteKubeconfig(const std::string& path, const std::string& token) const;

  // GET url() + `path` with `token` as bearer token (none when empty). An error only when no
  // HTTP response came back.
  absl::StatusOr<HttpResponse> Get(const std::string& path, const std::string& token,
                                   std::chrono::seconds timeout = std::chrono::seconds(10)) const;

  // Kills kube-apiserver (SIGKILL: no graceful shutdown, open watches break) and starts it again
  // on the same port with the same flags; etcd keeps every object. Returns once /readyz says ok.
  // Not safe to call while another thread uses apiserver_pid().
  absl::Status RestartApiserver();

  // The last `lines` lines of kube-apiserver's output.
  std::string ApiserverLogTail(int lines = 40) const;

 private:
  KubeControlPlane() = default;

  absl::Status GenerateCredentials();
  absl::Status StartEtcd(const std::string& etcd);
  // On `port`, or on a free port when 0.
  absl::Status StartApiserver(const KubeControlPlaneOptions& options, const std::string& apiserver,
                              int port = 0);
  void Stop();

  // Declared first so that it is removed after the processes have stopped.
  TempDir dir_;
  KubeControlPlaneOptions options_;
  std::string apiserver_path_;
  int apiserver_port_ = 0;
  std::string url_;
  std::string ca_file_;
  std::string admin_token_;
  std::string user_token_;
  std::string etcd_url_;
  std::string etcd_log_;
  std::string apiserver_log_;
  std::unique_ptr<Subprocess> etcd_;
  std::unique_ptr<Subprocess> apiserver_;
};

}  // namespace clusterprof::testing

#endif  // CLUSTERPROF_TESTS_SUPPORT_KUBE_CONTROL_PLANE_H_
