// Moves a SimulatedClock on by `step_ns` whenever a thread sleeps on it, until destroyed: for
// tests of code that pauses (retry backoff, requeue delays) where the test does not care how
// long. Tests that check the pauses themselves drive the clock by hand.
#ifndef CLUSTERPROF_TESTS_SUPPORT_CLOCK_ADVANCER_H_
#define CLUSTERPROF_TESTS_SUPPORT_CLOCK_ADVANCER_H_

#include <atomic>
#include <cstdint>
#include <thread>

#include "common/base/clock.h"

namespace clusterprof::testing {

class ClockAdvancer {
 public:
  ClockAdvancer(SimulatedClock* clock, int64_t step_ns)
      : thread_([this, clock, step_ns] {
          while (!done_.load()) {
            if (clock->sleepers() > 0) {
              clock->AdvanceNs(step_ns);
            } else {
              std::this_thread::yield();
            }
          }
        }) {}
  ~ClockAdvancer() {
    done_ = true;
    thread_.join();
  }
  ClockAdvancer(const ClockAdvancer&) = delete;
  ClockAdvancer& operator=(const ClockAdvancer&) = delete;

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;
};

}  // namespace clusterprof::testing

#endif  // CLUSTERPROF_TESTS_SUPPORT_CLOCK_ADVANCER_H_
