#include "common/backoff.h"

#include <algorithm>

namespace clusterprof {

Backoff::Backoff(BackoffPolicy policy, uint64_t seed)
    : policy_(policy), bound_ns_(std::max<int64_t>(policy.initial_ns, 0)), random_(seed) {}

int64_t Backoff::NextDelayNs() {
  const int64_t bound = std::min(bound_ns_, policy_.max_ns);
  const int64_t delay =
      bound <= 1 ? bound : std::uniform_int_distribution<int64_t>(bound / 2, bound)(random_);
  const double next = static_cast<double>(bound_ns_) * std::max(policy_.multiplier, 1.0);
  bound_ns_ =
      next >= static_cast<double>(policy_.max_ns) ? policy_.max_ns : static_cast<int64_t>(next);
  return delay;
}

}  // namespace clusterprof
