// The worker loop both controllers run (workqueue.h shows its shape): reconcile each key the
// queue hands out; on success forget the key's failures, on error log it and requeue the key with
// the queue's rate limit; count both in the metrics.
#ifndef CLUSTERPROF_OPERATOR_CONTROLLERS_WORKER_H_
#define CLUSTERPROF_OPERATOR_CONTROLLERS_WORKER_H_

#include <functional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "operator/controllers/metrics.h"
#include "operator/kube/workqueue.h"

namespace clusterprof::controllers {

// Returns when the queue shuts down. `metrics` may be null; `controller` names the controller in
// logs and metrics ("profilejob").
void RunWorker(kube::RateLimitingQueue& queue, std::string_view controller,
               OperatorMetrics* metrics,
               const std::function<absl::Status(const std::string& key)>& reconcile);

}  // namespace clusterprof::controllers

#endif  // CLUSTERPROF_OPERATOR_CONTROLLERS_WORKER_H_
