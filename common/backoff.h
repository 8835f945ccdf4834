// Jittered exponential backoff for retrying calls to remote services (GCS, token endpoints).
#ifndef CLUSTERPROF_COMMON_BACKOFF_H_
#define CLUSTERPROF_COMMON_BACKOFF_H_

#include <cstdint>
#include <random>

#include "common/clock.h"

namespace clusterprof {

struct BackoffPolicy {
  // The first pause's upper bound; each retry multiplies it, up to max_ns.
  int64_t initial_ns = 1 * kNanosPerSecond;
  int64_t max_ns = 32 * kNanosPerSecond;
  double multiplier = 2.0;
};

// "Full jitter": the n-th pause is uniform in [bound/2, bound], bound = min(max, initial *
// multiplier^n). Half the bound at least keeps retries from hammering a server that just said
// it is overloaded; the random half spreads the clients that failed together. Not thread-safe.
class Backoff {
 public:
  explicit Backoff(BackoffPolicy policy, uint64_t seed = std::random_device{}());
  // The next pause.
  int64_t NextDelayNs();
  // After progress: the next pause starts from initial_ns again.
  void Reset() { bound_ns_ = policy_.initial_ns; }

 private:
  BackoffPolicy policy_;
  int64_t bound_ns_;
  std::mt19937_64 random_;
};

}  // namespace clusterprof

#endif  // CLUSTERPROF_COMMON_BACKOFF_H_
