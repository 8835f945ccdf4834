// Jittered exponential backoff, and the retry policy every retry loop takes (API servers, GCS,
// token endpoints, leader election, the coordinator's attempts).
#ifndef CLUSTERPROF_COMMON_RETRY_BACKOFF_H_
#define CLUSTERPROF_COMMON_RETRY_BACKOFF_H_

#include <cstdint>
#include <random>

#include "common/base/clock.h"

namespace clusterprof {

struct BackoffPolicy {
  // The first pause's bound; each retry multiplies it, up to max_ns.
  int64_t initial_ns = 1 * kNanosPerSecond;
  int64_t max_ns = 32 * kNanosPerSecond;
  double multiplier = 2.0;
  // How a pause is drawn around its bound b:
  //   kDown: uniform in [b * (1 - jitter), b]. Half the bound at least (jitter 0.5, the
  //          default) keeps retries from hammering a server that just said it is overloaded;
  //          the random part spreads the clients that failed together ("full jitter").
  //   kUp:   uniform in [b, b * (1 + jitter)], never shorter than b (client-go's wait.Jitter).
  enum class Jitter { kDown, kUp };
  Jitter jitter_mode = Jitter::kDown;
  double jitter = 0.5;
};

// The pauses of one retry loop. Not thread-safe.
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

// When a retry loop gives up: after max_attempts calls (0: no limit), or once deadline_ns has
// passed since it began (0: no deadline), whichever comes first.
struct RetryPolicy {
  BackoffPolicy backoff;
  int max_attempts = 0;
  int64_t deadline_ns = 0;
};

}  // namespace clusterprof

#endif  // CLUSTERPROF_COMMON_RETRY_BACKOFF_H_
