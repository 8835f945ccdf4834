// The operator process's object graph, as controller-runtime's Manager: informers for
// ProfileJobs, ProfileSchedules and pods; the two controllers; the event recorder; leader
// election; and the /healthz, /readyz and /metrics server. clusterprof-operator's main() parses
// flags into ManagerOptions and calls Run.
//
// Without leader election the controllers start once the caches have synced. With it, every
// replica keeps its caches warm and only the leader runs controllers; a leader that loses the
// Lease stops at once (Run returns Aborted, and the process exits so that it restarts clean, as
// controller-runtime does), and the next leader resumes any capture from the jobs' status.
#ifndef CLUSTERPROF_OPERATOR_MANAGER_MANAGER_H_
#define CLUSTERPROF_OPERATOR_MANAGER_MANAGER_H_

#include <atomic>
#include <string>

#include "absl/status/status.h"
#include "common/base/clock.h"
#include "operator/controllers/profilejob_controller.h"
#include "operator/controllers/profileschedule_controller.h"
#include "operator/controllers/profiletrigger_controller.h"
#include "operator/kube/config.h"
#include "operator/webhook/webhook_server.h"

namespace clusterprof::manager {

struct ManagerOptions {
  kube::RestConfig rest_config;
  double qps = 50;
  int burst = 100;
  // "": every namespace.
  std::string namespace_;
  bool leader_elect = false;
  std::string leader_election_namespace = "clusterprof-system";
  std::string leader_election_id = "clusterprof-operator";
  // Unique among replicas; empty: "<hostname>_<pid>".
  std::string identity;
  int64_t lease_duration_ns = 15 * kNanosPerSecond;
  int64_t renew_deadline_ns = 10 * kNanosPerSecond;
  int64_t retry_period_ns = 2 * kNanosPerSecond;
  // /healthz, /readyz, /metrics; port -1 turns the server off, 0 picks one.
  std::string health_address = "0.0.0.0";
  int health_port = 8081;
  // Written with "http=N" (and "webhook=N") once serving, for tests and scripts (port 0).
  std::string port_file;
  // The sidecar-injection webhook (HTTPS, POST /mutate-pods), served by every replica; port -1
  // turns it off. A native sidecar asked of an API server older than 1.29 becomes a regular
  // container, with a warning.
  webhook::WebhookServerOptions webhook = {.port = -1};
  controllers::ProfileJobControllerOptions jobs;
  // Connections to sidecars the leader keeps across captures, warmed as their pods become Ready
  // (--sidecar-connections; coordinator/connector.h, ChannelPool). 0: each capture connects anew.
  size_t sidecar_connections = 2048;
  controllers::ProfileScheduleControllerOptions schedules;
  controllers::ProfileTriggerControllerOptions triggers;
  // On shutdown, how long running captures may take to finish.
  int64_t shutdown_grace_ns = 25 * kNanosPerSecond;
};

// Runs until `stop` becomes true (then returns OK after an orderly shutdown), or until
// leadership is lost (Aborted). Errors that keep it from starting (no API access, the CRDs not
// installed) come back at once with what to do.
absl::Status RunManager(const ManagerOptions& options, Clock& clock, const std::atomic<bool>& stop);

}  // namespace clusterprof::manager

#endif  // CLUSTERPROF_OPERATOR_MANAGER_MANAGER_H_
