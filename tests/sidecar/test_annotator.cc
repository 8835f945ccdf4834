// A workload for integration tests: annotates steps with clusterprof::Trace while a capture is
// armed, and can crash on purpose after a number of recorded events.
//
//   test_annotator [--seconds S] [--threads T] [--crash-after N] [--heartbeat FILE]
//
// --heartbeat FILE: every 50 ms, FILE holds the number of loop iterations so far (rewritten in
// place), so a test can see that the workload neither blocked nor crashed.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "sdk/annotate.h"

namespace {

std::atomic<long> g_recorded{0};
std::atomic<long> g_iterations{0};

void Burn(std::chrono::microseconds how_long) {
  const auto end = std::chrono::steady_clock::now() + how_long;
  volatile unsigned x = 0;
  while (std::chrono::steady_clock::now() < end) x = x * 31 + 7;
}

void Work(int thread, double seconds, long crash_after) {
  clusterprof::SetThreadName("worker-" + std::to_string(thread));
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (long step = 0; std::chrono::steady_clock::now() < end; ++step) {
    g_iterations.fetch_add(1, std::memory_order_relaxed);
    if (!clusterprof::TracingEnabled()) {
      // Keep the first annotation cheap to reach: it sets the SDK up.
      clusterprof::Trace probe("idle");
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      continue;
    }
    bool active;
    {
      clusterprof::Trace trace("step", {{"step_num", step}, {"_r", 1}});
      active = trace.active();
      clusterprof::Trace inner("work", {{"thread", thread}});
      Burn(std::chrono::microseconds(200));
    }
    if (!active) continue;
    const long recorded = g_recorded.fetch_add(2) + 2;
    if (crash_after > 0 && recorded >= crash_after) {
      std::fprintf(stdout, "crashing after %ld events\n", recorded);
      std::fflush(stdout);
      raise(SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
}

// Rewrites `path` with the iteration count until `done`.
void Heartbeat(const std::string& path, const std::atomic<bool>& done) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::perror(("test_annotator: " + path).c_str());
    return;
  }
  while (!done.load()) {
    char line[32];
    const int n = std::snprintf(line, sizeof(line), "%20ld\n", g_iterations.load());
    if (pwrite(fd, line, n, 0) != n) std::perror("test_annotator: heartbeat");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  close(fd);
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 30;
  int threads = 2;
  long crash_after = 0;
  std::string heartbeat;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--seconds") == 0) seconds = std::atof(argv[i + 1]);
    if (std::strcmp(argv[i], "--threads") == 0) threads = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--crash-after") == 0) crash_after = std::atol(argv[i + 1]);
    if (std::strcmp(argv[i], "--heartbeat") == 0) heartbeat = argv[i + 1];
  }
  std::printf("test_annotator %d ready\n", getpid());
  std::fflush(stdout);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) workers.emplace_back(Work, t, seconds, crash_after);
  std::atomic<bool> done{false};
  std::thread beat;
  if (!heartbeat.empty()) beat = std::thread(Heartbeat, heartbeat, std::cref(done));
  for (std::thread& worker : workers) worker.join();
  done = true;
  if (beat.joinable()) beat.join();
  return 0;
}
