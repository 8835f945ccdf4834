#include "operator/kube/retry.h"

#include "common/retry/backoff.h"
#include "operator/kube/api_error.h"

namespace clusterprof::kube {

absl::Status RetryOnConflict(Clock* clock, const std::function<absl::Status()>& attempt,
                             ConflictBackoff backoff) {
  // A constant pause with up to 10% more at random (client-go's DefaultRetry).
  Backoff pauses({.initial_ns = backoff.delay_ns,
                  .max_ns = backoff.delay_ns,
                  .multiplier = 1,
                  .jitter_mode = BackoffPolicy::Jitter::kUp,
                  .jitter = 0.1});
  absl::Status status;
  for (int i = 0; i < backoff.max_attempts; ++i) {
    if (i > 0) clock->SleepForNs(pauses.NextDelayNs());
    status = attempt();
    if (!IsConflict(status)) return status;
  }
  return status;
}

}  // namespace clusterprof::kube
