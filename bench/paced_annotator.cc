// A workload that annotates at a steady rate, for measuring what the sidecar's flight recorder
// costs (bench/recorder_cost.sh): one thread, steps of `--events-per-step` events (the step
// marker included, a collective among them), paced to `--rate` events per second.
//
//   CLUSTERPROF_DIR=/dev/shm/x paced_annotator --rate 10000 --seconds 40
#include <chrono>
#include <cstdio>
#include <thread>

#include "CLI/CLI.hpp"
#include "sdk/annotate.h"

int main(int argc, char** argv) {
  CLI::App app("Annotates at a steady rate");
  int64_t rate = 10'000;
  double seconds = 40;
  int events_per_step = 50;
  app.add_option("--rate", rate, "events per second")
      ->check(CLI::Range(int64_t{1}, int64_t{10'000'000}));
  app.add_option("--seconds", seconds, "how long")->check(CLI::PositiveNumber);
  app.add_option("--events-per-step", events_per_step, "events per step, its marker included")
      ->check(CLI::Range(3, 100'000));
  CLI11_PARSE(app, argc, argv);
  clusterprof::SetThreadName("trainer");
  using Clock = std::chrono::steady_clock;
  const Clock::time_point begin = Clock::now();
  const auto per_event = std::chrono::duration<double>(1.0 / static_cast<double>(rate));
  int64_t written = 0;
  for (int64_t step = 0; Clock::now() - begin < std::chrono::duration<double>(seconds); ++step) {
    clusterprof::Trace marker("train", {{"step_num", step}}, clusterprof::kAnnotationLevelCritical);
    for (int i = 0; i < events_per_step - 2; ++i) {
      clusterprof::Trace op("op", {{"i", i}});
    }
    { clusterprof::Trace collective("all-reduce"); }
    written += events_per_step;
    // Paced: sleep until the next step is due.
    std::this_thread::sleep_until(begin +
                                  std::chrono::duration_cast<Clock::duration>(per_event * written));
  }
  std::printf("paced_annotator: %lld events in %.1f s\n", static_cast<long long>(written),
              std::chrono::duration<double>(Clock::now() - begin).count());
  return 0;
}
