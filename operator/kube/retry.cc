#include "operator/kube/retry.h"

#include <random>

#include "operator/kube/api_error.h"

namespace clusterprof::kube {

absl::Status RetryOnConflict(Clock* clock, const std::function<absl::Status()>& attempt,
                             ConflictBackoff backoff) {
  std::minstd_rand random(static_cast<uint32_t>(clock->MonotonicNs()));
  absl::Status status;
  for (int i = 0; i < backoff.max_attempts; ++i) {
    if (i > 0) {
      const int64_t jitter =
          static_cast<int64_t>(random() % static_cast<uint32_t>(backoff.delay_ns / 10 + 1));
      clock->SleepForNs(backoff.delay_ns + jitter);
    }
    status = attempt();
    if (!IsConflict(status)) return status;
  }
  return status;
}

}  // namespace clusterprof::kube
