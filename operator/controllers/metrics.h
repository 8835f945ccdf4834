// The operator's Prometheus metrics (served on /metrics by common/http/health_server.h).
// Thread-safe: prometheus-cpp's metrics are.
#ifndef CLUSTERPROF_OPERATOR_CONTROLLERS_METRICS_H_
#define CLUSTERPROF_OPERATOR_CONTROLLERS_METRICS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "operator/kube/workqueue.h"

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace clusterprof::coordinator {
struct TargetResult;
}  // namespace clusterprof::coordinator

namespace clusterprof::controllers {

class OperatorMetrics {
 public:
  OperatorMetrics();
  ~OperatorMetrics();
  OperatorMetrics(const OperatorMetrics&) = delete;
  OperatorMetrics& operator=(const OperatorMetrics&) = delete;

  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

  // ProfileJobs in the cache, by phase (every phase is set, zeros included).
  void SetJobsByPhase(const std::map<std::string, int>& counts);
  // One capture from its first Profile request to its results.
  void CaptureFinished(double seconds);
  // |achieved start - T0| of one target.
  void ObserveStartSkew(double seconds);
  // outcome: succeeded, empty, failed.
  void TargetFinished(std::string_view outcome);
  // Counts a target of a finished capture whose files did not all reach the logdir, by the
  // furthest-from-done upload state its sidecar reported: "failed" (the upload failed for good;
  // the file stays in the sidecar's spool) or "pending" (still spooled or uploading when the
  // capture ended; the sidecar keeps trying). A target without files, or whose files are all
  // committed (or of a state it did not report), counts nothing.
  void TargetUploads(const coordinator::TargetResult& target);
  // Counts a failed target that its sidecar refused, by why (docs/security.md): its TLS
  // certificate was not accepted (certificate_expired, certificate_unknown_ca,
  // certificate_wrong_name, tls_other), it answered in plaintext (plaintext_peer) or in TLS to a
  // plaintext client (tls_peer), or it refused
  // the bearer token (token). Other failures count nothing here.
  void TargetRefused(const coordinator::TargetResult& target);
  // A ProfileJob stopped waiting in the queue for targets other jobs held, after `seconds`:
  // outcome "scheduled" (its targets came free) or "timeout" (spec.queueTimeoutSeconds passed).
  void QueueWaitEnded(std::string_view outcome, double seconds);
  void ReconcileFinished(std::string_view controller, bool ok);
  void ApiRequest(std::string_view method, int code, int64_t latency_ns);
  void SetLeader(bool leader);
  // A ProfileTrigger's rule held: fired (a job created), or held back ("cooldown",
  // "daily-cap", "active-job").
  void TriggerFired(std::string_view rule);
  void TriggerSuppressed(std::string_view reason);

  // A work queue's depth and adds, labelled with `name`; the observer must outlive the queue's
  // use of it.
  kube::WorkQueueMetrics* QueueMetrics(const std::string& name);

 private:
  class QueueObserver;

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Gauge>* jobs_;
  prometheus::Histogram* capture_duration_;
  prometheus::Histogram* start_skew_;
  prometheus::Family<prometheus::Counter>* targets_;
  prometheus::Family<prometheus::Counter>* upload_failures_;
  prometheus::Family<prometheus::Counter>* refusals_;
  prometheus::Family<prometheus::Histogram>* queue_wait_;
  prometheus::Family<prometheus::Counter>* reconciles_;
  prometheus::Family<prometheus::Counter>* reconcile_errors_;
  prometheus::Family<prometheus::Histogram>* api_latency_;
  prometheus::Gauge* leader_;
  prometheus::Family<prometheus::Counter>* trigger_firings_;
  prometheus::Family<prometheus::Counter>* trigger_suppressed_;
  prometheus::Family<prometheus::Gauge>* queue_depth_;
  prometheus::Family<prometheus::Counter>* queue_adds_;
  prometheus::Family<prometheus::Histogram>* queue_latency_;
  std::map<std::string, std::unique_ptr<QueueObserver>> queues_;
};

}  // namespace clusterprof::controllers

#endif  // CLUSTERPROF_OPERATOR_CONTROLLERS_METRICS_H_
