// Controller work queues with the semantics of client-go's k8s.io/client-go/util/workqueue:
//
//   WorkQueue          de-duplicating FIFO of keys ("namespace/name"); an item is never handed to
//                      two workers at once, and one added while being processed comes back once
//                      the worker calls Done
//   RateLimitingQueue  a WorkQueue plus AddAfter (delays on the injected clock) and
//                      AddRateLimited (delays from a RateLimiter): what controllers use
//
// A controller's worker loop:
//
//   while (std::optional<std::string> key = queue.Get()) {
//     absl::Status status = Reconcile(*key);
//     if (status.ok()) queue.Forget(*key); else queue.AddRateLimited(*key);
//     queue.Done(*key);
//   }
#ifndef CLUSTERPROF_OPERATOR_KUBE_WORKQUEUE_H_
#define CLUSTERPROF_OPERATOR_KUBE_WORKQUEUE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "common/base/clock.h"
#include "common/base/mutex.h"
#include "operator/kube/rate_limiter.h"

namespace clusterprof::kube {

// A snapshot of a queue's counters, for exporting as metrics (client-go's workqueue metrics).
struct WorkQueueStats {
  // Items added and not yet handed to a worker, counting those re-added while being processed.
  int64_t depth = 0;
  // Adds that queued an item (an add of an item already waiting is not counted).
  int64_t adds = 0;
  // AddAfter and AddRateLimited calls (RateLimitingQueue only).
  int64_t retries = 0;
  // Items waiting for their delay to pass (RateLimitingQueue only).
  int64_t waiting = 0;
  // Items handed to workers and not yet Done.
  int64_t processing = 0;
  // Get calls blocked for want of an item (idle workers).
  int64_t blocked_gets = 0;
  // The time the items being processed have spent so far, summed, and the longest of them: a
  // stuck worker shows as a growing longest_running_processor_ns.
  int64_t unfinished_work_ns = 0;
  int64_t longest_running_processor_ns = 0;
};

// Receives a queue's events, for latency and duration histograms. Every method has a no-op
// default. Calls are made with the queue's lock held, from whichever thread called the queue:
// implementations must be thread-safe and quick, and must not call back into the queue.
class WorkQueueMetrics {
 public:
  virtual ~WorkQueueMetrics() = default;
  // `item` was queued (counted in adds and depth).
  virtual void OnAdd(const std::string& item) {}
  // A worker got `item`, `queued_ns` after it was added.
  virtual void OnGet(const std::string& item, int64_t queued_ns) {}
  // A worker finished `item` after `work_ns`.
  virtual void OnDone(const std::string& item, int64_t work_ns) {}
  // An AddAfter or AddRateLimited call.
  virtual void OnRetry(const std::string& item) {}
};

// A de-duplicating FIFO work queue (client-go's workqueue.Type). An item waiting in the queue is
// there once however often it is added. An item handed out by Get is "processing" until Done:
// adding it meanwhile marks it dirty, and Done puts it back in the queue, so it is never handed
// to two workers at once and every add is followed by a Get that starts after it.
//
// Thread-safe. After ShutDown, adds are ignored and Get hands out what is still queued (items
// re-queued by Done included), then returns nullopt. Done for an item that is not processing is
// a bug in the caller: CHECK fails. `clock` (for durations) and `metrics` (may be null) must
// outlive the queue.
class WorkQueue {
 public:
  explicit WorkQueue(Clock* clock, WorkQueueMetrics* metrics = nullptr);
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  void Add(const std::string& item);
  // Blocks until an item is queued, and hands it out (it is processing until Done). Returns
  // nullopt once the queue is shut down and empty.
  std::optional<std::string> Get();
  // Ends processing of `item`; re-queues it when it was added meanwhile.
  void Done(const std::string& item);
  // Items queued for Get (not those processing).
  int Len();

  // Ignores adds from now on; Gets blocked on the empty queue return nullopt.
  void ShutDown();
  // As ShutDown, then blocks until no item is processing (every worker called Done), or until
  // ShutDown is called.
  void ShutDownWithDrain();
  bool ShuttingDown();

  WorkQueueStats Stats();
  // Blocks until at least `count` Get calls are blocked waiting for an item: how tests (and
  // orderly startups) know the workers are idle, without sleeping.
  void WaitForBlockedGets(int count);

 private:
  Clock* const clock_;
  WorkQueueMetrics* const metrics_;
  Mutex mu_;
  // Items waiting for Get, in order; each is also in `dirty_`.
  std::deque<std::string> queue_ ABSL_GUARDED_BY(mu_);
  // Items that need processing: those in `queue_`, and processing items added again.
  std::unordered_set<std::string> dirty_ ABSL_GUARDED_BY(mu_);
  // Items handed out and not yet Done, with when they were handed out.
  std::unordered_map<std::string, int64_t> processing_ ABSL_GUARDED_BY(mu_);
  // When each dirty item was added, for OnGet's queued_ns.
  std::unordered_map<std::string, int64_t> added_ns_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  // ShutDownWithDrain is waiting; ShutDown clears it to end the wait.
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  int64_t adds_ ABSL_GUARDED_BY(mu_) = 0;
  int blocked_gets_ ABSL_GUARDED_BY(mu_) = 0;
};

// A WorkQueue with delayed and rate-limited adds (client-go's RateLimitingInterface, which
// includes DelayingInterface): what a controller's workers consume.
//
// AddAfter(item, delay) adds the item once `delay` has passed on the clock's monotonic time (at
// once for delay <= 0). An item waits once: a second AddAfter keeps the earlier deadline.
// AddRateLimited asks the RateLimiter for the delay; Forget and NumRequeues go to it as well.
//
// A thread of its own (the waiting loop) sleeps on the clock until the earliest deadline and then
// queues what is due; AddAfter with an earlier deadline wakes it through Clock::Wake(). Get, Len
// and Stats also queue what is due before answering, so with a SimulatedClock an item is
// available as soon as the clock reaches its deadline. While the queue runs the waiting loop is
// one sleeper on the clock (SimulatedClock::WaitForSleepers counts it).
//
// Thread-safe. ShutDown (or destruction) drops the items still waiting, stops the waiting loop
// and shuts the WorkQueue down; destroy the queue only once its workers have returned from Get.
// `clock` and `metrics` (may be null) must outlive the queue.
class RateLimitingQueue {
 public:
  // As client-go's heartbeat: the longest the waiting loop sleeps without looking again, a
  // safety net (AddAfter wakes it for an earlier deadline).
  static constexpr int64_t kMaxWaitNs = 10 * kNanosPerSecond;

  RateLimitingQueue(Clock* clock, std::unique_ptr<RateLimiter> limiter,
                    WorkQueueMetrics* metrics = nullptr);
  ~RateLimitingQueue();
  RateLimitingQueue(const RateLimitingQueue&) = delete;
  RateLimitingQueue& operator=(const RateLimitingQueue&) = delete;

  void Add(const std::string& item) { queue_.Add(item); }
  void AddAfter(const std::string& item, int64_t delay_ns);
  // AddAfter(item, limiter.WhenNs(item)).
  void AddRateLimited(const std::string& item);
  // The item succeeded: its rate limiting starts over. It does not remove the item from the
  // queue or from the waiting items.
  void Forget(const std::string& item) { limiter_->Forget(item); }
  int NumRequeues(const std::string& item) { return limiter_->NumRequeues(item); }

  std::optional<std::string> Get();
  void Done(const std::string& item) { queue_.Done(item); }
  // Items queued for Get; items still waiting for their delay are not counted.
  int Len();

  void ShutDown();
  void ShutDownWithDrain();
  bool ShuttingDown() { return queue_.ShuttingDown(); }

  WorkQueueStats Stats();
  void WaitForBlockedGets(int count) { queue_.WaitForBlockedGets(count); }

 private:
  // Order of waiting items: deadline, then order of arrival.
  using WaitKey = std::pair<int64_t, uint64_t>;

  void WaitingLoop();
  // Queues the waiting items whose deadline is at or before `now_ns`.
  void QueueDueLocked(int64_t now_ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void QueueDue();
  void StopWaiting();

  Clock* const clock_;
  const std::unique_ptr<RateLimiter> limiter_;
  WorkQueueMetrics* const metrics_;
  WorkQueue queue_;
  // Taken before queue_'s lock, never after.
  Mutex mu_;
  std::map<WaitKey, std::string> waiting_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<std::string, WaitKey> waiting_keys_ ABSL_GUARDED_BY(mu_);
  uint64_t next_arrival_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t retries_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  // When the waiting loop will next look; an earlier deadline must wake it.
  int64_t loop_wakes_at_ns_ ABSL_GUARDED_BY(mu_) = 0;
  // Set (under mu_, then Clock::Wake()) to make the waiting loop look again.
  std::atomic<bool> news_{false};
  // Last: it starts once everything it uses is built.
  std::thread waiting_loop_;
};

}  // namespace clusterprof::kube

#endif  // CLUSTERPROF_OPERATOR_KUBE_WORKQUEUE_H_
