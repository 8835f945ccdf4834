#include "operator/kube/workqueue.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "common/base/check.h"

namespace clusterprof::kube {
namespace {

// a + b for b >= 0, stopping at the largest int64_t instead of overflowing.
int64_t SaturatingAdd(int64_t a, int64_t b) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  return a > kMax - b ? kMax : a + b;
}

}  // namespace

WorkQueue::WorkQueue(Clock* clock, WorkQueueMetrics* metrics) : clock_(clock), metrics_(metrics) {}

void WorkQueue::Add(const std::string& item) {
  MutexLock lock(&mu_);
  if (shutting_down_) return;
  if (!dirty_.insert(item).second) return;
  ++adds_;
  added_ns_[item] = clock_->MonotonicNs();
  if (metrics_ != nullptr) metrics_->OnAdd(item);
  // A processing item goes back in the queue when its worker calls Done.
  if (processing_.contains(item)) return;
  queue_.push_back(item);
}

std::optional<std::string> WorkQueue::Get() {
  MutexLock lock(&mu_);
  if (queue_.empty() && !shutting_down_) {
    ++blocked_gets_;
    mu_.Await([this]()
                  ABSL_NO_THREAD_SAFETY_ANALYSIS { return !queue_.empty() || shutting_down_; });
    --blocked_gets_;
  }
  if (queue_.empty()) return std::nullopt;
  std::string item = std::move(queue_.front());
  queue_.pop_front();
  const int64_t now_ns = clock_->MonotonicNs();
  processing_.emplace(item, now_ns);
  dirty_.erase(item);
  const auto added = added_ns_.find(item);
  CLUSTERPROF_CHECK(added != added_ns_.end()) << "queued item '" << item << "' has no add time";
  const int64_t queued_ns = now_ns - added->second;
  added_ns_.erase(added);
  if (metrics_ != nullptr) metrics_->OnGet(item, queued_ns);
  return item;
}

void WorkQueue::Done(const std::string& item) {
  MutexLock lock(&mu_);
  const auto it = processing_.find(item);
  CLUSTERPROF_CHECK(it != processing_.end())
      << "Done('" << item << "') for an item that is not being processed (Done twice, or no Get)";
  const int64_t work_ns = clock_->MonotonicNs() - it->second;
  processing_.erase(it);
  if (metrics_ != nullptr) metrics_->OnDone(item, work_ns);
  // Added while it was processing: its turn again (even after ShutDown, as in client-go, so
  // that the add is not lost while workers drain the queue).
  if (dirty_.contains(item)) queue_.push_back(item);
}

int WorkQueue::Len() {
  MutexLock lock(&mu_);
  return static_cast<int>(queue_.size());
}

void WorkQueue::ShutDown() {
  MutexLock lock(&mu_);
  shutting_down_ = true;
  draining_ = false;
}

void WorkQueue::ShutDownWithDrain() {
  MutexLock lock(&mu_);
  shutting_down_ = true;
  draining_ = true;
  mu_.Await([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return processing_.empty() || !draining_; });
}

bool WorkQueue::ShuttingDown() {
  MutexLock lock(&mu_);
  return shutting_down_;
}

WorkQueueStats WorkQueue::Stats() {
  MutexLock lock(&mu_);
  WorkQueueStats stats;
  stats.depth = static_cast<int64_t>(dirty_.size());
  stats.adds = adds_;
  stats.processing = static_cast<int64_t>(processing_.size());
  stats.blocked_gets = blocked_gets_;
  const int64_t now_ns = clock_->MonotonicNs();
  for (const auto& [item, started_ns] : processing_) {
    const int64_t running_ns = now_ns - started_ns;
    stats.unfinished_work_ns += running_ns;
    stats.longest_running_processor_ns = std::max(stats.longest_running_processor_ns, running_ns);
  }
  return stats;
}

void WorkQueue::WaitForBlockedGets(int count) {
  MutexLock lock(&mu_);
  mu_.Await([this, count]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return blocked_gets_ >= count; });
}

RateLimitingQueue::RateLimitingQueue(Clock* clock, std::unique_ptr<RateLimiter> limiter,
                                     WorkQueueMetrics* metrics)
    : clock_(clock),
      limiter_(std::move(limiter)),
      metrics_(metrics),
      queue_(clock, metrics),
      waiting_loop_([this] { WaitingLoop(); }) {
  CLUSTERPROF_CHECK(limiter_ != nullptr) << "a RateLimitingQueue needs a RateLimiter";
}

RateLimitingQueue::~RateLimitingQueue() {
  ShutDown();
  waiting_loop_.join();
}

void RateLimitingQueue::AddAfter(const std::string& item, int64_t delay_ns) {
  {
    MutexLock lock(&mu_);
    if (stopped_) return;
    ++retries_;
    if (metrics_ != nullptr) metrics_->OnRetry(item);
    if (delay_ns <= 0) {
      queue_.Add(item);
      return;
    }
    const int64_t due_ns = SaturatingAdd(clock_->MonotonicNs(), delay_ns);
    const auto known = waiting_keys_.find(item);
    if (known != waiting_keys_.end()) {
      // Already waiting: the earlier deadline wins.
      if (known->second.first <= due_ns) return;
      waiting_.erase(known->second);
      waiting_keys_.erase(known);
    }
    const WaitKey key{due_ns, next_arrival_++};
    waiting_.emplace(key, item);
    waiting_keys_.emplace(item, key);
    if (due_ns >= loop_wakes_at_ns_) return;
    // The waiting loop sleeps past this deadline: make it look again. Recording the new time
    // spares the Wake for further items due no earlier.
    loop_wakes_at_ns_ = due_ns;
    news_.store(true, std::memory_order_release);
  }
  clock_->Wake();
}

void RateLimitingQueue::AddRateLimited(const std::string& item) {
  AddAfter(item, limiter_->WhenNs(item));
}

std::optional<std::string> RateLimitingQueue::Get() {
  QueueDue();
  return queue_.Get();
}

int RateLimitingQueue::Len() {
  QueueDue();
  return queue_.Len();
}

void RateLimitingQueue::ShutDown() {
  StopWaiting();
  queue_.ShutDown();
}

void RateLimitingQueue::ShutDownWithDrain() {
  StopWaiting();
  queue_.ShutDownWithDrain();
}

WorkQueueStats RateLimitingQueue::Stats() {
  int64_t retries;
  int64_t waiting;
  {
    MutexLock lock(&mu_);
    QueueDueLocked(clock_->MonotonicNs());
    retries = retries_;
    waiting = static_cast<int64_t>(waiting_.size());
  }
  WorkQueueStats stats = queue_.Stats();
  stats.retries = retries;
  stats.waiting = waiting;
  return stats;
}

void RateLimitingQueue::QueueDueLocked(int64_t now_ns) {
  while (!waiting_.empty() && waiting_.begin()->first.first <= now_ns) {
    const auto first = waiting_.begin();
    queue_.Add(first->second);
    waiting_keys_.erase(first->second);
    waiting_.erase(first);
  }
}

void RateLimitingQueue::QueueDue() {
  MutexLock lock(&mu_);
  QueueDueLocked(clock_->MonotonicNs());
}

void RateLimitingQueue::StopWaiting() {
  {
    MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    waiting_.clear();
    waiting_keys_.clear();
    news_.store(true, std::memory_order_release);
  }
  clock_->Wake();
}

void RateLimitingQueue::WaitingLoop() {
  while (true) {
    int64_t wake_at_ns;
    {
      MutexLock lock(&mu_);
      // Cleared under the lock: news from here on comes after this look and ends the sleep.
      news_.store(false, std::memory_order_relaxed);
      if (stopped_) return;
      const int64_t now_ns = clock_->MonotonicNs();
      QueueDueLocked(now_ns);
      wake_at_ns = SaturatingAdd(now_ns, kMaxWaitNs);
      if (!waiting_.empty()) wake_at_ns = std::min(wake_at_ns, waiting_.begin()->first.first);
      loop_wakes_at_ns_ = wake_at_ns;
    }
    clock_->SleepUntilMonotonicNsUnless(wake_at_ns, news_);
  }
}

}  // namespace clusterprof::kube
