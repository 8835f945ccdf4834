// Retrying an optimistic-concurrency write, as client-go's retry.RetryOnConflict: read the
// latest object, change it, write it with the resourceVersion read; on 409 Conflict do it all
// again after a short, jittered pause.
#ifndef CLUSTERPROF_OPERATOR_KUBE_RETRY_H_
#define CLUSTERPROF_OPERATOR_KUBE_RETRY_H_

#include <functional>

#include "absl/status/status.h"
#include "common/base/clock.h"

namespace clusterprof::kube {

struct ConflictBackoff {
  int max_attempts = 5;
  // The pause between attempts, with up to 10% more at random (client-go's DefaultRetry).
  int64_t delay_ns = 10 * kNanosPerMilli;
};

// Calls `attempt` until it returns something other than a Conflict (IsConflict in
// api_error.h), at most backoff.max_attempts times. `attempt` must read the object afresh each
// time. Returns the last attempt's status: OK, the first non-conflict error, or the last
// Conflict when every attempt conflicted.
absl::Status RetryOnConflict(Clock* clock, const std::function<absl::Status()>& attempt,
                             ConflictBackoff backoff = {});

}  // namespace clusterprof::kube

#endif  // CLUSTERPROF_OPERATOR_KUBE_RETRY_H_
