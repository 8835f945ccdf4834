#include "common/retry/backoff.h"

#include <algorithm>
#include <cmath>

namespace clusterprof {

Backoff::Backoff(BackoffPolicy policy, uint64_t seed)
    : policy_(policy), bound_ns_(std::max<int64_t>(policy.initial_ns, 0)), random_(seed) {}

int64_t Backoff::NextDelayNs() {
  const int64_t bound = std::min(bound_ns_, policy_.max_ns);
  const auto spread = static_cast<int64_t>(
      std::llround(static_cast<double>(bound) * std::clamp(policy_.jitter, 0.0, 10.0)));
  int64_t delay = bound;
  if (spread > 0) {
    const bool down = policy_.jitter_mode == BackoffPolicy::Jitter::kDown;
    const int64_t low = down ? std::max<int64_t>(bound - spread, 0) : bound;
    const int64_t high = down ? bound : bound + spread;
    delay = std::uniform_int_distribution<int64_t>(low, high)(random_);
  }
  const double next = static_cast<double>(bound_ns_) * std::max(policy_.multiplier, 1.0);
  bound_ns_ =
      next >= static_cast<double>(policy_.max_ns) ? policy_.max_ns : static_cast<int64_t>(next);
  return delay;
}

}  // namespace clusterprof
