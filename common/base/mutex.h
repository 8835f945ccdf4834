// Mutex and MutexLock with absl::Mutex's shape (Await on a condition, thread-safety annotations)
// built on std::mutex and std::condition_variable.
//
// Why not absl::Mutex: Debian ships abseil as prebuilt shared libraries, not built with
// ThreadSanitizer, so TSan cannot see absl::Mutex's synchronization and reports false races
// wherever it is used. std::mutex goes through pthreads, which TSan intercepts. The
// annotations (ABSL_GUARDED_BY and friends) still work with clang's -Wthread-safety.
#ifndef CLUSTERPROF_COMMON_BASE_MUTEX_H_
#define CLUSTERPROF_COMMON_BASE_MUTEX_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"

namespace clusterprof {

// Every release of the mutex (Unlock, or Await starting to wait) wakes the threads blocked in
// Await, which re-check their conditions: state guarded by the mutex changes only while it is
// held, so a condition can only become true when it is released.
class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    // Notify while still holding the mutex: a woken waiter may destroy this object as soon as it
    // can lock it, so nothing may touch `cv_` after the unlock.
    if (waiters_ > 0) cv_.notify_all();
    mu_.unlock();
  }

  // Blocks until `condition()` is true. The mutex must be held; it is released while waiting.
  template <typename Condition>
  void Await(Condition condition) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    std::unique_lock<std::mutex> lock(mu_, std::adopt_lock);
    // Waiting releases the mutex, like an Unlock: others may be waiting for what this thread
    // changed while holding it.
    if (waiters_ > 0 && !condition()) cv_.notify_all();
    ++waiters_;
    cv_.wait(lock, condition);
    --waiters_;
    lock.release();
  }

  // As Await, giving up at `deadline` (steady clock). Returns the condition's final value.
  template <typename Condition>
  bool AwaitWithDeadline(Condition condition, std::chrono::steady_clock::time_point deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    std::unique_lock<std::mutex> lock(mu_, std::adopt_lock);
    if (waiters_ > 0 && !condition()) cv_.notify_all();
    ++waiters_;
    const bool result = cv_.wait_until(lock, deadline, condition);
    --waiters_;
    lock.release();
    return result;
  }

  // As Await, giving up after `timeout` of real time. Returns the condition's final value. For
  // bounded waits ("news, or look again in a second"); deadlines that tests drive come from a
  // Clock instead (Clock::SleepUntilMonotonicNsUnless).
  template <typename Condition>
  bool AwaitWithTimeout(Condition condition, std::chrono::nanoseconds timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    std::unique_lock<std::mutex> lock(mu_, std::adopt_lock);
    if (waiters_ > 0 && !condition()) cv_.notify_all();
    ++waiters_;
    const bool result = cv_.wait_for(lock, timeout, condition);
    --waiters_;
    lock.release();
    return result;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int waiters_ = 0;  // guarded by mu_
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// A one-shot event: Notify once, wait any number of times.
class Notification {
 public:
  void Notify() {
    MutexLock lock(&mu_);
    notified_ = true;
  }
  bool HasBeenNotified() {
    MutexLock lock(&mu_);
    return notified_;
  }
  void WaitForNotification() {
    MutexLock lock(&mu_);
    mu_.Await([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return notified_; });
  }

 private:
  Mutex mu_;
  bool notified_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace clusterprof

#endif  // CLUSTERPROF_COMMON_BASE_MUTEX_H_
