// Cooperative cancellation: whoever owns a long operation holds a CancelToken and calls Cancel();
// the operation checks cancelled() between steps, sleeps with Clock::Sleep*Unless(flag()), and
// registers callbacks that end what cannot poll (calls in flight). As Go's context.Context or
// gRPC's TryCancel, without the deadline part: deadlines come from the Clock.
#ifndef CLUSTERPROF_COMMON_BASE_CANCEL_H_
#define CLUSTERPROF_COMMON_BASE_CANCEL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>

#include "absl/base/thread_annotations.h"
#include "common/base/mutex.h"

namespace clusterprof {

class CancelToken {
 public:
  CancelToken() = default;
  CancelToken(const CancelToken&) = delete;
  CancelToken& operator=(const CancelToken&) = delete;

  // Sets the flag and runs every registered callback once (in this thread). Idempotent.
  void Cancel();
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }
  // For Clock::SleepUntil*Unless (a callback that calls Clock::Wake() ends the sleep).
  const std::atomic<bool>& flag() const { return cancelled_; }

  // Keeps a callback registered while it lives; moving transfers it.
  class Registration {
   public:
    Registration() = default;
    Registration(Registration&& other) noexcept;
    Registration& operator=(Registration&& other) noexcept;
    ~Registration();

   private:
    friend class CancelToken;
    Registration(CancelToken* token, uint64_t id) : token_(token), id_(id) {}
    CancelToken* token_ = nullptr;
    uint64_t id_ = 0;
  };

  // Runs `fn` when Cancel() is called, or at once (in this thread) when it already was. The
  // callback must not register or unregister callbacks of this token. After the Registration
  // is destroyed `fn` is not called again, and is not running.
  [[nodiscard]] Registration OnCancel(std::function<void()> fn);

 private:
  void Unregister(uint64_t id);

  std::atomic<bool> cancelled_{false};
  Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, std::function<void()>> callbacks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace clusterprof

#endif  // CLUSTERPROF_COMMON_BASE_CANCEL_H_
