// Rate limiters for the Kubernetes client, with the semantics of client-go's
// k8s.io/client-go/util/workqueue rate limiters and golang.org/x/time/rate's token bucket:
//
//   TokenBucket                        client-side QPS/burst (REST client) and the bucket below
//   RateLimiter                        how long a work queue item waits before its next try
//     ItemExponentialFailureRateLimiter  base * 2^failures per item, capped
//     BucketRateLimiter                  one token bucket shared by all items
//     MaxOfRateLimiter                   the longest delay of several limiters
//   DefaultControllerRateLimiter       max(exponential 5 ms..1000 s, bucket 10 qps burst 100)
//
// All times are nanoseconds on the injected Clock's monotonic clock.
#ifndef CLUSTERPROF_OPERATOR_KUBE_RATE_LIMITER_H_
#define CLUSTERPROF_OPERATOR_KUBE_RATE_LIMITER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/base/clock.h"
#include "common/base/mutex.h"

namespace clusterprof::kube {

// A token bucket that fills at `qps` tokens per second up to `burst` tokens and starts full
// (golang.org/x/time/rate.Limiter). Taking a token when none is left reserves the next one:
// the bucket goes into debt and the caller waits until the debt is paid, so reservations queue
// in the order they were made. Thread-safe. `qps` must be > 0 (infinity: no limit) and
// `burst` >= 1, else CHECK fails.
class TokenBucket {
 public:
  TokenBucket(Clock* clock, double qps, int burst);
  TokenBucket(const TokenBucket&) = delete;
  TokenBucket& operator=(const TokenBucket&) = delete;

  // Takes a token now or reserves the next free one, and returns how long the caller must wait
  // before acting on it: 0 when a token was available.
  int64_t ReserveNs();
  // Takes a token if one is available now; reserves nothing otherwise.
  bool TryAccept();
  // Reserves a token and sleeps on the clock until it is due.
  void Accept();
  // As Accept, but returns false once `stop` is true (whoever sets it calls Clock::Wake()).
  // A stopped wait keeps its reservation: the token is spent. Returns false at once, reserving
  // nothing, when `stop` is already true.
  bool AcceptUnless(const std::atomic<bool>& stop);

  double qps() const { return qps_; }
  int burst() const { return burst_; }

 private:
  struct Reservation {
    int64_t now_ns = 0;
    int64_t wait_ns = 0;
  };
  // Takes a token or goes into debt for one; the token is due at now_ns + wait_ns.
  Reservation Reserve();
  // The tokens there would be at `now_ns` (negative: reservations not yet due).
  double TokensAtLocked(int64_t now_ns) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Clock* const clock_;
  const double qps_;
  const int burst_;
  Mutex mu_;
  double tokens_ ABSL_GUARDED_BY(mu_);
  // When `tokens_` was last brought up to date.
  int64_t last_ns_ ABSL_GUARDED_BY(mu_);
};

// Decides how long a work queue item waits before it is tried again. Implementations are
// thread-safe.
class RateLimiter {
 public:
  virtual ~RateLimiter() = default;
  // The delay before `item` may be processed again; counts a failure of `item` where the
  // limiter keeps per-item state.
  virtual int64_t WhenNs(const std::string& item) = 0;
  // Stops tracking `item` (it succeeded): its next delay starts over.
  virtual void Forget(const std::string& item) = 0;
  // How many failures of `item` the limiter is tracking.
  virtual int NumRequeues(const std::string& item) = 0;
};

// Delay = base * 2^failures, capped at `max_delay_ns` (overflow-safe). Keeps one counter per
// item until Forget. Thread-safe.
class ItemExponentialFailureRateLimiter final : public RateLimiter {
 public:
  // client-go's defaults for controllers.
  static constexpr int64_t kDefaultBaseDelayNs = 5 * kNanosPerMilli;
  static constexpr int64_t kDefaultMaxDelayNs = 1000 * kNanosPerSecond;

  // CHECK fails for a negative delay.
  ItemExponentialFailureRateLimiter(int64_t base_delay_ns, int64_t max_delay_ns);

  int64_t WhenNs(const std::string& item) override;
  void Forget(const std::string& item) override;
  int NumRequeues(const std::string& item) override;

 private:
  const int64_t base_delay_ns_;
  const int64_t max_delay_ns_;
  Mutex mu_;
  std::unordered_map<std::string, int> failures_ ABSL_GUARDED_BY(mu_);
};

// One token bucket for all items: the overall retry rate. Keeps no per-item state
// (NumRequeues is 0, Forget does nothing). Thread-safe.
class BucketRateLimiter final : public RateLimiter {
 public:
  // client-go's defaults for controllers.
  static constexpr double kDefaultQps = 10;
  static constexpr int kDefaultBurst = 100;

  BucketRateLimiter(Clock* clock, double qps, int burst);

  int64_t WhenNs(const std::string& item) override;
  void Forget(const std::string& item) override {}
  int NumRequeues(const std::string& item) override { return 0; }

 private:
  TokenBucket bucket_;
};

// The longest delay of several limiters (every one of them is asked, so each counts the
// failure), and the largest requeue count. Thread-safe when the limiters are.
class MaxOfRateLimiter final : public RateLimiter {
 public:
  // CHECK fails for an empty list or a null limiter.
  explicit MaxOfRateLimiter(std::vector<std::unique_ptr<RateLimiter>> limiters);

  int64_t WhenNs(const std::string& item) override;
  void Forget(const std::string& item) override;
  int NumRequeues(const std::string& item) override;

 private:
  const std::vector<std::unique_ptr<RateLimiter>> limiters_;
};

// client-go's DefaultControllerRateLimiter: per-item exponential backoff from 5 ms to 1000 s,
// and at most 10 retries per second overall after a burst of 100.
std::unique_ptr<RateLimiter> DefaultControllerRateLimiter(Clock* clock);

}  // namespace clusterprof::kube

#endif  // CLUSTERPROF_OPERATOR_KUBE_RATE_LIMITER_H_
