// What the chaos suite runs and breaks: a real kube-apiserver and etcd (tests/support/
// kube_control_plane.h) reached through the fault proxy, the GCS test server, clusterprof-operator
// processes (one, or two replicas with leader election), and per host a clusterprof-sidecar beside
// an annotating workload, each a process that a scenario can kill and start again on the same
// ports and directories, as a container restart would.
#ifndef CLUSTERPROF_TESTS_CHAOS_WORLD_H_
#define CLUSTERPROF_TESTS_CHAOS_WORLD_H_

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "clusterprof/v1alpha1/sidecar.pb.h"
#include "common/base/clock.h"
#include "cpprest/json.h"
#include "operator/kube/rest_client.h"
#include "tests/support/gcs_test_server.h"
#include "tests/support/kube_control_plane.h"
#include "tests/support/kube_fault_proxy.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"

namespace clusterprof::chaos {

struct WorldOptions {
  std::string source_dir;
  std::string operator_path;
  std::string sidecar_path;
  std::string annotator_path;
  int hosts = 3;
  // The last host's spool lies on a tmpfs of this size (the spool-full scenario fills it); 0, or
  // not root: a plain directory.
  uint64_t small_spool_bytes = 0;
};

// One pod: its sidecar and workload.
struct Host {
  std::string name;
  int grpc_port = 0;
  int http_port = 0;
  std::string shm_dir;
  std::string spool_dir;
  bool spool_on_tmpfs = false;
  std::string heartbeat;
  std::string port_file;
  std::string log;
  std::unique_ptr<testing::Subprocess> sidecar;
  std::unique_ptr<testing::Subprocess> workload;
};

// Records the phases every ProfileJob of the namespace shows, from a watch on the API server
// itself (not through the proxy), listing again whenever the watch breaks.
class PhaseRecorder {
 public:
  PhaseRecorder(const testing::KubeControlPlane& plane, std::string ns);
  ~PhaseRecorder();
  std::vector<std::string> Phases(const std::string& job) const;
  // Waits until `job` shows a final phase; false on timeout.
  bool WaitForFinal(const std::string& job, std::chrono::milliseconds timeout) const;

 private:
  void Run();
  void Record(const web::json::value& object);

  const testing::KubeControlPlane& plane_;
  std::string ns_;
  RealClock clock_;
  mutable std::mutex mu_;
  mutable std::condition_variable changed_;
  std::map<std::string, std::vector<std::string>> phases_;
  bool stopping_ = false;
  std::unique_ptr<kube::WatchStream> stream_;
  std::thread thread_;
};

class World {
 public:
  static constexpr char kNamespace[] = "chaos";
  static constexpr char kBucket[] = "chaos";

  // NotFound (the suite skips) when the control plane's binaries or kubectl are missing.
  static absl::StatusOr<std::unique_ptr<World>> Start(WorldOptions options);
  ~World();

  testing::KubeControlPlane& plane() { return *plane_; }
  testing::KubeFaultProxy& proxy() { return *proxy_; }
  testing::GcsTestServer& gcs() { return *gcs_; }
  kube::RestClient& admin() { return *admin_; }
  const PhaseRecorder& phases() const { return *recorder_; }
  const std::string& root() const { return root_.path(); }

  // Hosts.
  std::vector<Host>& hosts() { return hosts_; }
  absl::Status StartSidecar(Host& host);
  void KillSidecar(Host& host);
  void StartWorkload(Host& host);
  void KillWorkload(Host& host);
  // The workload's loop iterations so far (its heartbeat file); -1 when unreadable.
  static int64_t Heartbeat(const Host& host);
  // Captures the sidecar finished with `outcome` ("" for all); -1 when it does not answer.
  static double Captures(const Host& host, const std::string& outcome);
  static absl::StatusOr<v1alpha1::GetSessionResponse> GetSession(const Host& host,
                                                                 const std::string& session);

  // Operators. `leader_elect`: with leader election (short leases, so that a takeover is quick).
  void StartOperator(const std::string& identity, bool leader_elect);
  void KillOperator(const std::string& identity);
  void StopOperators();
  std::vector<std::string> Operators() const;
  // The holder of the leader Lease; "" when none.
  std::string Leader();
  // VmRSS of the operator in KiB; 0 when it is not running.
  int64_t OperatorRssKib(const std::string& identity) const;
  std::string OperatorLogTail(const std::string& identity, int lines = 30) const;

  // Copies every process's log (operators, sidecars and workloads, kube-apiserver) into `dir`.
  void SaveLogs(const std::string& dir) const;

  // ProfileJobs.
  absl::StatusOr<web::json::value> CreateJob(const std::string& name, const web::json::value& spec);
  absl::StatusOr<web::json::value> GetJob(const std::string& name);
  absl::Status DeleteJob(const std::string& name);

 private:
  explicit World(WorldOptions options) : options_(std::move(options)) {}
  absl::Status Setup();
  absl::Status CreateRunningPod(const Host& host);

  struct OperatorProcess {
    std::string log;
    std::unique_ptr<testing::Subprocess> process;
  };

  WorldOptions options_;
  testing::TempDir root_;
  RealClock clock_;
  std::unique_ptr<testing::KubeControlPlane> plane_;
  std::unique_ptr<testing::KubeFaultProxy> proxy_;
  std::unique_ptr<testing::GcsTestServer> gcs_;
  std::unique_ptr<kube::RestClient> admin_;
  std::unique_ptr<PhaseRecorder> recorder_;
  std::string proxy_kubeconfig_;
  std::vector<Host> hosts_;
  std::map<std::string, OperatorProcess> operators_;
  std::vector<std::string> tmpfs_mounts_;
};

}  // namespace clusterprof::chaos

#endif  // CLUSTERPROF_TESTS_CHAOS_WORLD_H_
