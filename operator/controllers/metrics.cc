#include "operator/controllers/metrics.h"

#include "common/grpc/tls.h"
#include "coordinator/coordinator.h"
#include "operator/api/types.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace clusterprof::controllers {
namespace {

// Seconds a ProfileJob may wait in the queue: spec.queueTimeoutSeconds is 600 by default and at
// most 86400.
const prometheus::Histogram::BucketBoundaries kQueueWaitBuckets{
    1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 24 * 3600};

}  // namespace

class OperatorMetrics::QueueObserver final : public kube::WorkQueueMetrics {
 public:
  QueueObserver(prometheus::Gauge* depth, prometheus::Counter* adds, prometheus::Histogram* latency)
      : depth_(depth), adds_(adds), latency_(latency) {}
  void OnAdd(const std::string&) override {
    depth_->Increment();
    adds_->Increment();
  }
  void OnGet(const std::string&, int64_t queued_ns) override {
    depth_->Decrement();
    latency_->Observe(static_cast<double>(queued_ns) / 1e9);
  }

 private:
  prometheus::Gauge* depth_;
  prometheus::Counter* adds_;
  prometheus::Histogram* latency_;
};

OperatorMetrics::OperatorMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  jobs_ = &prometheus::BuildGauge()
               .Name("clusterprof_operator_profilejobs")
               .Help("ProfileJobs the operator sees, by phase")
               .Register(*registry_);
  capture_duration_ = &prometheus::BuildHistogram()
                           .Name("clusterprof_operator_capture_duration_seconds")
                           .Help("From a capture's clock probes to its per-target results")
                           .Register(*registry_)
                           .Add({}, prometheus::Histogram::BucketBoundaries{0.5, 1, 2, 5, 10, 20,
                                                                            30, 60, 120, 300, 600});
  start_skew_ = &prometheus::BuildHistogram()
                     .Name("clusterprof_operator_start_skew_seconds")
                     .Help("|start a target achieved - the capture's T0|, per target")
                     .Register(*registry_)
                     .Add({}, prometheus::Histogram::BucketBoundaries{1e-5, 5e-5, 1e-4, 2e-4, 5e-4,
                                                                      1e-3, 5e-3, 1e-2, 0.1, 1});
  targets_ = &prometheus::BuildCounter()
                  .Name("clusterprof_operator_targets_total")
                  .Help("Targets of finished captures, by outcome (succeeded, empty, failed)")
                  .Register(*registry_);
  refusals_ = &prometheus::BuildCounter()
                   .Name("clusterprof_operator_sidecar_refusals_total")
                   .Help(
                       "Targets that failed because their sidecar refused the connection or the "
                       "call, by reason (certificate_expired, certificate_unknown_ca, "
                       "certificate_wrong_name, tls_other, plaintext_peer, tls_peer, token)")
                   .Register(*registry_);
  upload_failures_ =
      &prometheus::BuildCounter()
           .Name("clusterprof_operator_upload_failures_total")
           .Help(
               "Targets of finished captures whose files did not all reach the logdir, by "
               "upload state (failed: for good; pending: still spooled or uploading)")
           .Register(*registry_);
  queue_wait_ = &prometheus::BuildHistogram()
                     .Name("clusterprof_operator_queue_wait_seconds")
                     .Help(
                         "How long ProfileJobs waited for targets other jobs held, by how the "
                         "wait ended (scheduled, timeout)")
                     .Register(*registry_);
  reconciles_ = &prometheus::BuildCounter()
                     .Name("clusterprof_operator_reconciles_total")
                     .Help("Reconciles, by controller")
                     .Register(*registry_);
  reconcile_errors_ = &prometheus::BuildCounter()
                           .Name("clusterprof_operator_reconcile_errors_total")
                           .Help("Reconciles that failed and were requeued, by controller")
                           .Register(*registry_);
  api_latency_ = &prometheus::BuildHistogram()
                      .Name("clusterprof_operator_api_request_duration_seconds")
                      .Help("Kubernetes API requests (watches excluded), by method and code")
                      .Register(*registry_);
  leader_ = &prometheus::BuildGauge()
                 .Name("clusterprof_operator_leader")
                 .Help("1 while this replica leads (or runs without leader election)")
                 .Register(*registry_)
                 .Add({});
  trigger_firings_ = &prometheus::BuildCounter()
                          .Name("clusterprof_operator_trigger_firings_total")
                          .Help("ProfileTrigger rules that fired and created a ProfileJob, by rule")
                          .Register(*registry_);
  trigger_suppressed_ =
      &prometheus::BuildCounter()
           .Name("clusterprof_operator_trigger_suppressed_total")
           .Help(
               "ProfileTrigger rules that held but created no job, by reason (cooldown, "
               "daily-cap, active-job)")
           .Register(*registry_);
  queue_depth_ = &prometheus::BuildGauge()
                      .Name("clusterprof_operator_workqueue_depth")
                      .Help("Keys waiting in a controller's work queue")
                      .Register(*registry_);
  queue_adds_ = &prometheus::BuildCounter()
                     .Name("clusterprof_operator_workqueue_adds_total")
                     .Help("Keys added to a controller's work queue")
                     .Register(*registry_);
  queue_latency_ = &prometheus::BuildHistogram()
                        .Name("clusterprof_operator_workqueue_queue_duration_seconds")
                        .Help("How long keys wait in a work queue before a worker takes them")
                        .Register(*registry_);
  std::map<std::string, int> zero;
  for (api::JobPhase phase :
       {api::JobPhase::kPending, api::JobPhase::kScheduled, api::JobPhase::kCapturing,
        api::JobPhase::kSucceeded, api::JobPhase::kPartiallySucceeded, api::JobPhase::kFailed}) {
    zero[std::string(api::JobPhaseName(phase))] = 0;
  }
  SetJobsByPhase(zero);
  for (const char* outcome : {"succeeded", "empty", "failed"}) {
    targets_->Add({{"outcome", outcome}});
  }
  for (const char* state : {"failed", "pending"}) upload_failures_->Add({{"state", state}});
  for (const char* outcome : {"scheduled", "timeout"}) {
    queue_wait_->Add({{"outcome", outcome}}, kQueueWaitBuckets);
  }
}

OperatorMetrics::~OperatorMetrics() = default;

void OperatorMetrics::SetJobsByPhase(const std::map<std::string, int>& counts) {
  for (const auto& [phase, count] : counts) {
    jobs_->Add({{"phase", phase}}).Set(count);
  }
}

void OperatorMetrics::CaptureFinished(double seconds) { capture_duration_->Observe(seconds); }

void OperatorMetrics::ObserveStartSkew(double seconds) { start_skew_->Observe(seconds); }

void OperatorMetrics::TargetFinished(std::string_view outcome) {
  targets_->Add({{"outcome", std::string(outcome)}}).Increment();
}

void OperatorMetrics::TargetUploads(const coordinator::TargetResult& target) {
  std::string_view state;
  for (const coordinator::TargetResult::Upload& upload : target.uploads) {
    if (upload.state == "failed") {
      state = "failed";
      break;
    }
    if (upload.state == "spooled" || upload.state == "uploading") state = "pending";
  }
  if (!state.empty()) upload_failures_->Add({{"state", std::string(state)}}).Increment();
}

void OperatorMetrics::TargetRefused(const coordinator::TargetResult& target) {
  if (target.outcome != coordinator::Outcome::kFailed) return;
  std::string_view reason = tls::TlsFailureReason(target.message);
  if (reason.empty() && target.message.starts_with("UNAUTHENTICATED")) reason = "token";
  if (!reason.empty()) refusals_->Add({{"reason", std::string(reason)}}).Increment();
}

void OperatorMetrics::QueueWaitEnded(std::string_view outcome, double seconds) {
  queue_wait_->Add({{"outcome", std::string(outcome)}}, kQueueWaitBuckets).Observe(seconds);
}

void OperatorMetrics::ReconcileFinished(std::string_view controller, bool ok) {
  reconciles_->Add({{"controller", std::string(controller)}}).Increment();
  if (!ok) reconcile_errors_->Add({{"controller", std::string(controller)}}).Increment();
}

void OperatorMetrics::ApiRequest(std::string_view method, int code, int64_t latency_ns) {
  api_latency_
      ->Add({{"method", std::string(method)}, {"code", std::to_string(code)}},
            prometheus::Histogram::BucketBoundaries{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
                                                    2.5, 5, 10})
      .Observe(static_cast<double>(latency_ns) / 1e9);
}

void OperatorMetrics::SetLeader(bool leader) { leader_->Set(leader ? 1 : 0); }

void OperatorMetrics::TriggerFired(std::string_view rule) {
  trigger_firings_->Add({{"rule", std::string(rule)}}).Increment();
}

void OperatorMetrics::TriggerSuppressed(std::string_view reason) {
  trigger_suppressed_->Add({{"reason", std::string(reason)}}).Increment();
}

kube::WorkQueueMetrics* OperatorMetrics::QueueMetrics(const std::string& name) {
  std::unique_ptr<QueueObserver>& observer = queues_[name];
  if (observer == nullptr) {
    observer = std::make_unique<QueueObserver>(
        &queue_depth_->Add({{"name", name}}), &queue_adds_->Add({{"name", name}}),
        &queue_latency_->Add({{"name", name}},
                             prometheus::Histogram::BucketBoundaries{0.001, 0.01, 0.1, 1, 10, 60}));
  }
  return observer.get();
}

}  // namespace clusterprof::controllers
