#include "operator/kube/rate_limiter.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "common/base/check.h"

namespace clusterprof::kube {
namespace {

constexpr int64_t kMaxNs = std::numeric_limits<int64_t>::max();

// a + b for b >= 0, stopping at the largest int64_t instead of overflowing.
int64_t SaturatingAdd(int64_t a, int64_t b) { return a > kMaxNs - b ? kMaxNs : a + b; }

// The time `tokens` (> 0) take to accumulate at `qps`, rounded up so that a caller who waits
// this long finds them there. Multiplying before dividing keeps whole numbers exact
// (1 token at 10 qps is exactly 100 ms).
int64_t DurationFromTokensNs(double tokens, double qps) {
  const double ns = std::ceil(tokens * static_cast<double>(kNanosPerSecond) / qps);
  // kMaxNs converts to 2^63, itself out of range: compare with >=.
  if (ns >= static_cast<double>(kMaxNs)) return kMaxNs;
  return static_cast<int64_t>(ns);
}

}  // namespace

TokenBucket::TokenBucket(Clock* clock, double qps, int burst)
    : clock_(clock), qps_(qps), burst_(burst), tokens_(burst), last_ns_(clock->MonotonicNs()) {
  CLUSTERPROF_CHECK(qps > 0) << "a token bucket needs a positive rate, not " << qps;
  CLUSTERPROF_CHECK(burst >= 1) << "a token bucket needs a burst of at least 1, not " << burst;
}

double TokenBucket::TokensAtLocked(int64_t now_ns) const {
  // Readings are taken under the lock from a monotonic clock; max() only guards against a clock
  // that breaks that promise.
  const int64_t elapsed_ns = std::max<int64_t>(0, now_ns - last_ns_);
  const double added =
      static_cast<double>(elapsed_ns) * qps_ / static_cast<double>(kNanosPerSecond);
  return std::min(static_cast<double>(burst_), tokens_ + added);
}

TokenBucket::Reservation TokenBucket::Reserve() {
  if (std::isinf(qps_)) return {};
  MutexLock lock(&mu_);
  // Read under the lock so that readings reach the bucket in order.
  const int64_t now_ns = clock_->MonotonicNs();
  tokens_ = TokensAtLocked(now_ns) - 1;
  last_ns_ = now_ns;
  return {now_ns, tokens_ >= 0 ? 0 : DurationFromTokensNs(-tokens_, qps_)};
}

int64_t TokenBucket::ReserveNs() { return Reserve().wait_ns; }

bool TokenBucket::TryAccept() {
  if (std::isinf(qps_)) return true;
  MutexLock lock(&mu_);
  const int64_t now_ns = clock_->MonotonicNs();
  const double tokens = TokensAtLocked(now_ns);
  // As rate.Limiter.Allow: a refusal leaves the bucket as it was.
  if (tokens < 1) return false;
  tokens_ = tokens - 1;
  last_ns_ = now_ns;
  return true;
}

void TokenBucket::Accept() {
  const Reservation reservation = Reserve();
  if (reservation.wait_ns > 0) {
    clock_->SleepUntilMonotonicNs(SaturatingAdd(reservation.now_ns, reservation.wait_ns));
  }
}

bool TokenBucket::AcceptUnless(const std::atomic<bool>& stop) {
  if (stop.load(std::memory_order_acquire)) return false;
  const Reservation reservation = Reserve();
  if (reservation.wait_ns == 0) return true;
  return clock_->SleepUntilMonotonicNsUnless(SaturatingAdd(reservation.now_ns, reservation.wait_ns),
                                             stop);
}

ItemExponentialFailureRateLimiter::ItemExponentialFailureRateLimiter(int64_t base_delay_ns,
                                                                     int64_t max_delay_ns)
    : base_delay_ns_(base_delay_ns), max_delay_ns_(max_delay_ns) {
  CLUSTERPROF_CHECK(base_delay_ns >= 0 && max_delay_ns >= 0)
      << "negative backoff: base " << base_delay_ns << " ns, max " << max_delay_ns << " ns";
}

int64_t ItemExponentialFailureRateLimiter::WhenNs(const std::string& item) {
  int exponent;
  {
    MutexLock lock(&mu_);
    int& failures = failures_[item];
    exponent = failures;
    // Past 2^62 every delay is capped anyway; stopping the count keeps it from overflowing.
    if (failures < std::numeric_limits<int>::max()) ++failures;
  }
  // base * 2^exponent overflows int64_t exactly when base > max >> exponent.
  if (base_delay_ns_ == 0) return 0;
  if (exponent >= 63 || base_delay_ns_ > (kMaxNs >> exponent)) return max_delay_ns_;
  return std::min(base_delay_ns_ << exponent, max_delay_ns_);
}

void ItemExponentialFailureRateLimiter::Forget(const std::string& item) {
  MutexLock lock(&mu_);
  failures_.erase(item);
}

int ItemExponentialFailureRateLimiter::NumRequeues(const std::string& item) {
  MutexLock lock(&mu_);
  const auto it = failures_.find(item);
  return it == failures_.end() ? 0 : it->second;
}

BucketRateLimiter::BucketRateLimiter(Clock* clock, double qps, int burst)
    : bucket_(clock, qps, burst) {}

int64_t BucketRateLimiter::WhenNs(const std::string& item) { return bucket_.ReserveNs(); }

MaxOfRateLimiter::MaxOfRateLimiter(std::vector<std::unique_ptr<RateLimiter>> limiters)
    : limiters_(std::move(limiters)) {
  CLUSTERPROF_CHECK(!limiters_.empty()) << "MaxOfRateLimiter needs at least one limiter";
  for (const auto& limiter : limiters_) CLUSTERPROF_CHECK(limiter != nullptr);
}

int64_t MaxOfRateLimiter::WhenNs(const std::string& item) {
  int64_t longest = 0;
  for (const auto& limiter : limiters_) longest = std::max(longest, limiter->WhenNs(item));
  return longest;
}

void MaxOfRateLimiter::Forget(const std::string& item) {
  for (const auto& limiter : limiters_) limiter->Forget(item);
}

int MaxOfRateLimiter::NumRequeues(const std::string& item) {
  int most = 0;
  for (const auto& limiter : limiters_) most = std::max(most, limiter->NumRequeues(item));
  return most;
}

std::unique_ptr<RateLimiter> DefaultControllerRateLimiter(Clock* clock) {
  std::vector<std::unique_ptr<RateLimiter>> limiters;
  limiters.push_back(std::make_unique<ItemExponentialFailureRateLimiter>(
      ItemExponentialFailureRateLimiter::kDefaultBaseDelayNs,
      ItemExponentialFailureRateLimiter::kDefaultMaxDelayNs));
  limiters.push_back(std::make_unique<BucketRateLimiter>(clock, BucketRateLimiter::kDefaultQps,
                                                         BucketRateLimiter::kDefaultBurst));
  return std::make_unique<MaxOfRateLimiter>(std::move(limiters));
}

}  // namespace clusterprof::kube
