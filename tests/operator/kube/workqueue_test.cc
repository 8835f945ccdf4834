#include "operator/kube/workqueue.h"

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/base/clock.h"
#include "common/base/mutex.h"
#include "gtest/gtest.h"
#include "operator/kube/rate_limiter.h"

namespace clusterprof::kube {
namespace {

constexpr int64_t kMs = kNanosPerMilli;

TEST(WorkQueueTest, AnItemIsQueuedOnceHoweverOftenAdded) {
  SimulatedClock clock;
  WorkQueue queue(&clock);
  queue.Add("ns/a");
  queue.Add("ns/b");
  queue.Add("ns/a");
  queue.Add("ns/a");
  ASSERT_EQ(queue.Len(), 2);
  EXPECT_EQ(queue.Get(), "ns/a");
  EXPECT_EQ(queue.Get(), "ns/b");
  EXPECT_EQ(queue.Len(), 0);
  const WorkQueueStats stats = queue.Stats();
  EXPECT_EQ(stats.adds, 2);
  EXPECT_EQ(stats.depth, 0);
  EXPECT_EQ(stats.processing, 2);
}

TEST(WorkQueueTest, HandsItemsOutInTheOrderAdded) {
  SimulatedClock clock;
  WorkQueue queue(&clock);
  for (const char* item : {"c", "a", "b"}) queue.Add(item);
  EXPECT_EQ(queue.Get(), "c");
  EXPECT_EQ(queue.Get(), "a");
  EXPECT_EQ(queue.Get(), "b");
}

TEST(WorkQueueTest, AnItemAddedWhileProcessingComesBackAfterDone) {
  SimulatedClock clock;
  WorkQueue queue(&clock);
  queue.Add("ns/a");
  ASSERT_EQ(queue.Get(), "ns/a");
  queue.Add("ns/a");
  queue.Add("ns/a");
  // Dirty, not queued: no other worker may have it while this one works on it.
  EXPECT_EQ(queue.Len(), 0);
  EXPECT_EQ(queue.Stats().depth, 1);
  queue.Done("ns/a");
  ASSERT_EQ(queue.Len(), 1);
  EXPECT_EQ(queue.Get(), "ns/a");
  queue.Done("ns/a");
  EXPECT_EQ(queue.Len(), 0);
  EXPECT_EQ(queue.Stats().depth, 0);
  EXPECT_EQ(queue.Stats().adds, 2);
}

TEST(WorkQueueTest, AProcessingItemIsNotHandedToASecondWorker) {
  SimulatedClock clock;
  WorkQueue queue(&clock);
  queue.Add("ns/a");
  ASSERT_EQ(queue.Get(), "ns/a");
  queue.Add("ns/a");
  ASSERT_EQ(queue.Len(), 0);
  std::optional<std::string> second;
  std::thread worker([&] { second = queue.Get(); });
  // The second worker has to wait although the item was added again.
  queue.WaitForBlockedGets(1);
  queue.Done("ns/a");
  worker.join();
  EXPECT_EQ(second, "ns/a");
}

TEST(WorkQueueTest, GetBlocksUntilAnAdd) {
  SimulatedClock clock;
  WorkQueue queue(&clock);
  std::atomic<bool> returned{false};
  std::optional<std::string> got;
  std::thread worker([&] {
    got = queue.Get();
    returned = true;
  });
  queue.WaitForBlockedGets(1);
  EXPECT_FALSE(returned);
  EXPECT_EQ(queue.Stats().blocked_gets, 1);
  queue.Add("ns/a");
  worker.join();
  EXPECT_EQ(got, "ns/a");
  EXPECT_EQ(queue.Stats().blocked_gets, 0);
}

TEST(WorkQueueTest, ShutDownWakesBlockedGetsAndIgnoresAdds) {
  SimulatedClock clock;
  WorkQueue queue(&clock);
  std::optional<std::string> got[2] = {"unset", "unset"};
  std::thread first([&] { got[0] = queue.Get(); });
  std::thread second([&] { got[1] = queue.Get(); });
  queue.WaitForBlockedGets(2);
  EXPECT_FALSE(queue.ShuttingDown());
  queue.ShutDown();
  first.join();
  second.join();
  EXPECT_EQ(got[0], std::nullopt);
  EXPECT_EQ(got[1], std::nullopt);
  EXPECT_TRUE(queue.ShuttingDown());
  queue.Add("ns/a");
  EXPECT_EQ(queue.Len(), 0);
  EXPECT_EQ(queue.Get(), std::nullopt);
}

TEST(WorkQueueTest, AfterShutDownGetHandsOutWhatIsLeft) {
  SimulatedClock clock;
  WorkQueue queue(&clock);
  queue.Add("ns/a");
  queue.Add("ns/b");
  ASSERT_EQ(queue.Get(), "ns/a");
  queue.Add("ns/a");
  queue.ShutDown();
  EXPECT_EQ(queue.Get(), "ns/b");
  // Added before the shut down while processing: re-queued by Done, not lost.
  queue.Done("ns/a");
  EXPECT_EQ(queue.Get(), "ns/a");
  EXPECT_EQ(queue.Get(), std::nullopt);
}

TEST(WorkQueueTest, ShutDownWithDrainWaitsForProcessingItems) {
  SimulatedClock clock;
  WorkQueue queue(&clock);
  queue.Add("ns/a");
  ASSERT_EQ(queue.Get(), "ns/a");
  std::atomic<bool> drained{false};
  std::thread drainer([&] {
    queue.ShutDownWithDrain();
    drained = true;
  });
  while (!queue.ShuttingDown()) std::this_thread::yield();
  // "ns/a" is not Done, so the drain cannot have ended.
  EXPECT_FALSE(drained);
  queue.Add("ns/b");  // ignored: shutting down
  EXPECT_EQ(queue.Len(), 0);
  queue.Done("ns/a");
  drainer.join();
  EXPECT_TRUE(drained);
}

TEST(WorkQueueTest, ShutDownEndsADrain) {
  SimulatedClock clock;
  WorkQueue queue(&clock);
  queue.Add("ns/a");
  ASSERT_EQ(queue.Get(), "ns/a");
  std::thread drainer([&] { queue.ShutDownWithDrain(); });
  while (!queue.ShuttingDown()) std::this_thread::yield();
  queue.ShutDown();
  drainer.join();
  EXPECT_EQ(queue.Stats().processing, 1);
}

// Records the queue's events.
class RecordingMetrics final : public WorkQueueMetrics {
 public:
  void OnAdd(const std::string& item) override {
    MutexLock lock(&mu_);
    events_.push_back("add " + item);
  }
  void OnGet(const std::string& item, int64_t queued_ns) override {
    MutexLock lock(&mu_);
    events_.push_back("get " + item + " " + std::to_string(queued_ns));
  }
  void OnDone(const std::string& item, int64_t work_ns) override {
    MutexLock lock(&mu_);
    events_.push_back("done " + item + " " + std::to_string(work_ns));
  }
  void OnRetry(const std::string& item) override {
    MutexLock lock(&mu_);
    events_.push_back("retry " + item);
  }
  std::vector<std::string> events() {
    MutexLock lock(&mu_);
    return events_;
  }

 private:
  Mutex mu_;
  std::vector<std::string> events_ ABSL_GUARDED_BY(mu_);
};

TEST(WorkQueueTest, ReportsQueueTimeWorkTimeAndTheLongestRunningProcessor) {
  SimulatedClock clock(SimulatedClock::kDefaultWallNs, 0);
  RecordingMetrics metrics;
  WorkQueue queue(&clock, &metrics);
  queue.Add("a");
  queue.Add("b");
  clock.AdvanceNs(2);
  ASSERT_EQ(queue.Get(), "a");
  clock.AdvanceNs(5);
  ASSERT_EQ(queue.Get(), "b");
  clock.AdvanceNs(3);
  WorkQueueStats stats = queue.Stats();
  EXPECT_EQ(stats.processing, 2);
  EXPECT_EQ(stats.longest_running_processor_ns, 8);
  EXPECT_EQ(stats.unfinished_work_ns, 8 + 3);
  queue.Done("a");
  stats = queue.Stats();
  EXPECT_EQ(stats.longest_running_processor_ns, 3);
  EXPECT_EQ(stats.unfinished_work_ns, 3);
  queue.Add("a");  // de-duplicated adds are not reported
  queue.Add("a");
  EXPECT_EQ(metrics.events(), (std::vector<std::string>{"add a", "add b", "get a 2", "get b 7",
                                                        "done a 8", "add a"}));
}

TEST(WorkQueueDeathTest, DoneForAnItemNotProcessingIsABug) {
  SimulatedClock clock;
  WorkQueue queue(&clock);
  queue.Add("ns/a");
  EXPECT_DEATH(queue.Done("ns/a"), "not being processed");
}

// Workers and producers race on few keys. Whatever the interleaving: no key is ever with two
// workers at once, and every add is followed by processing that starts after it (each key's
// last processing saw its last add).
TEST(WorkQueueTest, ConcurrentWorkersNeverShareAnItemAndMissNoAdd) {
  constexpr int kKeys = 8;
  constexpr int kProducers = 2;
  constexpr int kAddsPerProducer = 2000;
  constexpr int kWorkers = 4;
  SimulatedClock clock;
  WorkQueue queue(&clock);

  Mutex mu;
  std::vector<int> version(kKeys, 0);    // adds so far, per key
  std::vector<int> last_seen(kKeys, 0);  // version when processing last started
  std::vector<int> in_flight(kKeys, 0);  // workers holding the key
  int shared = 0;                        // times a key was with two workers
  int regressions = 0;                   // times processing saw an older version
  int processed = 0;

  std::vector<std::thread> workers;
  workers.reserve(kWorkers);
  for (int w = 0; w < kWorkers; ++w) {
    workers.emplace_back([&] {
      while (std::optional<std::string> item = queue.Get()) {
        const int key = std::stoi(*item);
        {
          MutexLock lock(&mu);
          if (++in_flight[key] > 1) ++shared;
          if (version[key] < last_seen[key]) ++regressions;
          last_seen[key] = version[key];
          ++processed;
        }
        // Hold the item a little, so others get the chance to misbehave.
        for (int i = 0; i < 3; ++i) std::this_thread::yield();
        {
          MutexLock lock(&mu);
          --in_flight[key];
        }
        queue.Done(*item);
      }
    });
  }
  std::vector<std::thread> producers;
  producers.reserve(kProducers);
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      for (int i = 0; i < kAddsPerProducer; ++i) {
        const int key = (i * 3 + p) % kKeys;
        {
          MutexLock lock(&mu);
          ++version[key];
        }
        queue.Add(std::to_string(key));
      }
    });
  }
  for (std::thread& producer : producers) producer.join();
  queue.ShutDown();
  for (std::thread& worker : workers) worker.join();

  MutexLock lock(&mu);
  EXPECT_EQ(shared, 0);
  EXPECT_EQ(regressions, 0);
  for (int key = 0; key < kKeys; ++key) {
    EXPECT_EQ(last_seen[key], version[key]) << "key " << key << " missed its last add";
  }
  EXPECT_GE(processed, kKeys);
  EXPECT_LE(processed, kProducers * kAddsPerProducer);
  const WorkQueueStats stats = queue.Stats();
  EXPECT_EQ(stats.depth, 0);
  EXPECT_EQ(stats.processing, 0);
  EXPECT_EQ(stats.adds, processed);
}

std::unique_ptr<RateLimiter> Exponential(int64_t base_ns, int64_t max_ns) {
  return std::make_unique<ItemExponentialFailureRateLimiter>(base_ns, max_ns);
}

TEST(RateLimitingQueueTest, AddAfterMakesTheItemAvailableAtTheDeadline) {
  SimulatedClock clock;
  RateLimitingQueue queue(&clock, DefaultControllerRateLimiter(&clock));
  queue.AddAfter("ns/a", 100 * kMs);
  EXPECT_EQ(queue.Len(), 0);
  EXPECT_EQ(queue.Stats().waiting, 1);
  clock.AdvanceNs(100 * kMs - 1);
  EXPECT_EQ(queue.Len(), 0);
  clock.AdvanceNs(1);
  ASSERT_EQ(queue.Len(), 1);
  EXPECT_EQ(queue.Stats().waiting, 0);
  EXPECT_EQ(queue.Get(), "ns/a");
}

TEST(RateLimitingQueueTest, TheEarlierDeadlineWins) {
  SimulatedClock clock;
  RateLimitingQueue queue(&clock, DefaultControllerRateLimiter(&clock));
  queue.AddAfter("ns/a", 100 * kMs);
  queue.AddAfter("ns/a", 50 * kMs);
  queue.AddAfter("ns/a", 200 * kMs);
  EXPECT_EQ(queue.Stats().waiting, 1);
  clock.AdvanceNs(50 * kMs - 1);
  EXPECT_EQ(queue.Len(), 0);
  clock.AdvanceNs(1);
  ASSERT_EQ(queue.Len(), 1);
  ASSERT_EQ(queue.Get(), "ns/a");
  queue.Done("ns/a");
  // It waited once: nothing comes back at the later deadlines.
  clock.AdvanceNs(1000 * kMs);
  EXPECT_EQ(queue.Len(), 0);
  EXPECT_EQ(queue.Stats().retries, 3);
}

TEST(RateLimitingQueueTest, DueItemsComeOutInDeadlineOrder) {
  SimulatedClock clock;
  RateLimitingQueue queue(&clock, DefaultControllerRateLimiter(&clock));
  queue.AddAfter("c", 30 * kMs);
  queue.AddAfter("a", 10 * kMs);
  queue.AddAfter("b", 20 * kMs);
  queue.AddAfter("d", 20 * kMs);
  clock.AdvanceNs(30 * kMs);
  ASSERT_EQ(queue.Len(), 4);
  EXPECT_EQ(queue.Get(), "a");
  EXPECT_EQ(queue.Get(), "b");
  EXPECT_EQ(queue.Get(), "d");
  EXPECT_EQ(queue.Get(), "c");
}

TEST(RateLimitingQueueTest, NonPositiveDelayAddsAtOnce) {
  SimulatedClock clock;
  RateLimitingQueue queue(&clock, DefaultControllerRateLimiter(&clock));
  queue.AddAfter("a", 0);
  queue.AddAfter("b", -5);
  EXPECT_EQ(queue.Len(), 2);
  EXPECT_EQ(queue.Stats().waiting, 0);
  EXPECT_EQ(queue.Stats().retries, 2);
}

TEST(RateLimitingQueueTest, ABlockedGetWakesWhenTheDeadlinePasses) {
  SimulatedClock clock;
  RateLimitingQueue queue(&clock, DefaultControllerRateLimiter(&clock));
  std::optional<std::string> got;
  std::thread worker([&] { got = queue.Get(); });
  queue.WaitForBlockedGets(1);
  queue.AddAfter("ns/a", 100 * kMs);
  clock.AdvanceNs(100 * kMs - 1);
  // Nothing is due, so nothing can have reached the worker.
  EXPECT_EQ(queue.Stats().blocked_gets, 1);
  // Only the waiting loop can hand it over now: the worker is blocked and this thread does not
  // touch the queue until the join.
  clock.AdvanceNs(1);
  worker.join();
  EXPECT_EQ(got, "ns/a");
}

TEST(RateLimitingQueueTest, AnEarlierDeadlineWakesTheSleepingWaitingLoop) {
  SimulatedClock clock;
  RateLimitingQueue queue(&clock, DefaultControllerRateLimiter(&clock));
  // The waiting loop is asleep until its heartbeat (nothing was waiting when it looked).
  clock.WaitForSleepers(1);
  std::optional<std::string> got;
  std::thread worker([&] { got = queue.Get(); });
  queue.WaitForBlockedGets(1);
  // Unless AddAfter wakes the loop to look again, it sleeps through this deadline.
  queue.AddAfter("ns/a", kMs);
  clock.AdvanceNs(kMs);
  worker.join();
  EXPECT_EQ(got, "ns/a");
}

TEST(RateLimitingQueueTest, AddRateLimitedBacksOffExponentiallyAndForgetResets) {
  SimulatedClock clock;
  RateLimitingQueue queue(&clock, DefaultControllerRateLimiter(&clock));
  int64_t expected = 5 * kMs;
  for (int failure = 0; failure < 22; ++failure) {
    queue.AddRateLimited("ns/a");
    EXPECT_EQ(queue.NumRequeues("ns/a"), failure + 1);
    clock.AdvanceNs(expected - 1);
    ASSERT_EQ(queue.Len(), 0) << "failure " << failure << ": early";
    clock.AdvanceNs(1);
    ASSERT_EQ(queue.Len(), 1) << "failure " << failure << ": not there at " << expected << " ns";
    ASSERT_EQ(queue.Get(), "ns/a");
    queue.Done("ns/a");
    expected = std::min(2 * expected, 1000 * kNanosPerSecond);
  }
  EXPECT_EQ(expected, 1000 * kNanosPerSecond);  // the cap was reached
  queue.Forget("ns/a");
  EXPECT_EQ(queue.NumRequeues("ns/a"), 0);
  queue.AddRateLimited("ns/a");
  clock.AdvanceNs(5 * kMs - 1);
  EXPECT_EQ(queue.Len(), 0);
  clock.AdvanceNs(1);
  EXPECT_EQ(queue.Len(), 1);
}

TEST(RateLimitingQueueTest, ShutDownDropsWaitingItems) {
  SimulatedClock clock;
  RecordingMetrics metrics;
  RateLimitingQueue queue(&clock, Exponential(kMs, kNanosPerSecond), &metrics);
  queue.AddRateLimited("ns/a");
  queue.ShutDown();
  EXPECT_TRUE(queue.ShuttingDown());
  EXPECT_EQ(queue.Stats().waiting, 0);
  clock.AdvanceNs(kNanosPerSecond);
  EXPECT_EQ(queue.Get(), std::nullopt);
  queue.AddAfter("ns/b", 0);
  queue.Add("ns/c");
  EXPECT_EQ(queue.Len(), 0);
  EXPECT_EQ(metrics.events(), std::vector<std::string>{"retry ns/a"});
}

TEST(RateLimitingQueueTest, ShutDownWithDrainWaitsForProcessingItems) {
  SimulatedClock clock;
  RateLimitingQueue queue(&clock, DefaultControllerRateLimiter(&clock));
  queue.Add("ns/a");
  ASSERT_EQ(queue.Get(), "ns/a");
  std::atomic<bool> drained{false};
  std::thread drainer([&] {
    queue.ShutDownWithDrain();
    drained = true;
  });
  while (!queue.ShuttingDown()) std::this_thread::yield();
  EXPECT_FALSE(drained);
  queue.Done("ns/a");
  drainer.join();
  EXPECT_TRUE(drained);
}

}  // namespace
}  // namespace clusterprof::kube
