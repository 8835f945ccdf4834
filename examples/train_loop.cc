// A sample training loop annotated with the clusterprof C++ SDK, for demos: run it in a pod (or
// beside a local sidecar) and capture it.
//
//   CLUSTERPROF_DIR=/tmp/clusterprof train_loop --seconds 60
//
// The trainer thread records each step as Trace("train", step_num=N, _r=1) with the ops inside
// it (data_load, forward, backward, optimizer, allreduce); a data loader thread prepares batches
// (load_batch) and hands them over through a small queue, each batch's wait in the queue an
// async event (batch_in_queue) that begins on the loader and ends on the trainer. The ops burn
// CPU for their share of the step and allreduce sleeps the rest, so the process uses about
// --busy-percent of one core. Runs until --seconds have passed, or until SIGINT/SIGTERM.
//
// Several processes can train "together", as the workers of a data-parallel job do:
//   train_loop --sync-dir /tmp/sync --world 4 --rank R [--straggle-ms N]
// makes allreduce a barrier (every rank waits there for the last one to finish its compute, then
// all spend the rest of the step "communicating"), so their steps run in lockstep and a rank with
// --straggle-ms (extra compute each step) holds every other rank back: a straggler to find with
// `clusterprof report`. With --straggle-from-step N (or --straggle-after-seconds S) the rank
// slows down only from then on, a worker that degrades mid-run, for a ProfileTrigger to catch. The
// barrier is files: rank r writes the step it finished to <sync-dir>/rank-<r> (a rename, so readers
// see whole numbers) and waits until every rank's file says at least that step.
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "CLI/CLI.hpp"
#include "sdk/annotate.h"

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::microseconds;

volatile std::sig_atomic_t g_stop = 0;

void OnSignal(int) { g_stop = 1; }

// Keeps the CPU busy for `duration`; the caller keeps the result so the work stays.
uint64_t Burn(microseconds duration) {
  const Clock::time_point until = Clock::now() + duration;
  uint64_t x = 88172645463325252ull;
  while (Clock::now() < until) {
    for (int i = 0; i < 256; ++i) {  // xorshift: cheap work between clock reads
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
    }
  }
  return x;
}

// Batches from the loader to the trainer. Thread-safe; Pop returns false once closed.
class BatchQueue {
 public:
  explicit BatchQueue(size_t capacity) : capacity_(capacity) {}

  bool Push(uint64_t batch) {
    std::unique_lock<std::mutex> lock(mu_);
    not_full_.wait(lock, [&] { return closed_ || batches_.size() < capacity_; });
    if (closed_) return false;
    batches_.push_back(batch);
    not_empty_.notify_one();
    return true;
  }
  bool Pop(uint64_t* batch) {
    std::unique_lock<std::mutex> lock(mu_);
    not_empty_.wait(lock, [&] { return closed_ || !batches_.empty(); });
    if (batches_.empty()) return false;
    *batch = batches_.front();
    batches_.pop_front();
    not_full_.notify_one();
    return true;
  }
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    not_full_.notify_all();
    not_empty_.notify_all();
  }

 private:
  const size_t capacity_;
  std::mutex mu_;
  std::condition_variable not_full_;
  std::condition_variable not_empty_;
  std::deque<uint64_t> batches_;
  bool closed_ = false;
};

// The files barrier described at the top.
class FileBarrier {
 public:
  FileBarrier(std::string dir, int rank, int world)
      : dir_(std::move(dir)), rank_(rank), world_(world) {}

  // Makes the directory and says no step is done here yet; false, with why in `error`, when the
  // directory cannot be written.
  bool Open(std::string* error) {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec) {
      *error = "cannot create --sync-dir " + dir_ + ": " + ec.message();
      return false;
    }
    return Publish(-1, error);
  }

  // Says `step` is done here, then waits for every rank to say so; false when a rank has not
  // moved for `patience` (it ended, or never started), the process is stopping, or this rank's
  // file cannot be written.
  bool Arrive(int64_t step, std::chrono::seconds patience) {
    std::string error;
    if (!Publish(step, &error)) {
      std::fprintf(stderr, "train_loop: %s\n", error.c_str());
      return false;
    }
    const Clock::time_point give_up = Clock::now() + patience;
    while (g_stop == 0 && Clock::now() < give_up) {
      if (Slowest() >= step) return true;
      std::this_thread::sleep_for(microseconds(200));
    }
    return false;
  }

 private:
  // Writes `step` to this rank's file whole (write, then rename).
  bool Publish(int64_t step, std::string* error) {
    const std::string path = dir_ + "/rank-" + std::to_string(rank_);
    {
      std::ofstream out(path + ".tmp", std::ios::trunc);
      out << step << "\n";
      if (!out.flush()) {
        *error = "cannot write " + path + ".tmp: " + std::strerror(errno);
        return false;
      }
    }
    std::error_code ec;
    std::filesystem::rename(path + ".tmp", path, ec);
    if (ec) {
      *error = "cannot rename " + path + ".tmp: " + ec.message();
      return false;
    }
    return true;
  }

  int64_t Slowest() const {
    int64_t slowest = INT64_MAX;
    for (int r = 0; r < world_; ++r) {
      std::ifstream in(dir_ + "/rank-" + std::to_string(r));
      int64_t step = -1;
      if (!(in >> step)) return -1;
      slowest = std::min(slowest, step);
    }
    return slowest;
  }

  const std::string dir_;
  const int rank_;
  const int world_;
};

struct Timing {
  microseconds step;
  microseconds load;  // the loader's CPU per batch
  microseconds forward;
  microseconds backward;
  microseconds optimizer;
};

// The loader's share of the busy time, then the trainer's ops' shares of the rest.
Timing MakeTiming(int step_ms, int busy_percent) {
  const int64_t step_us = int64_t{step_ms} * 1000;
  const int64_t busy_us = step_us * busy_percent / 100;
  const int64_t load_us = busy_us * 15 / 100;
  const int64_t ops_us = busy_us - load_us;
  return Timing{microseconds(step_us), microseconds(load_us), microseconds(ops_us * 35 / 100),
                microseconds(ops_us * 50 / 100), microseconds(ops_us * 15 / 100)};
}

void LoaderLoop(const Timing& timing, BatchQueue& queue, std::atomic<uint64_t>& sink) {
  clusterprof::SetThreadName("data_loader");
  for (uint64_t batch = 0;; ++batch) {
    {
      clusterprof::Trace trace("load_batch", {{"batch", batch}});
      sink += Burn(timing.load);
    }
    clusterprof::AsyncBegin("batch_in_queue", batch);
    if (!queue.Push(batch)) return;
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("A sample training loop annotated with clusterprof");
  double seconds = 0;
  int step_ms = 30;
  int busy_percent = 50;
  std::string sync_dir;
  int rank = 0;
  int world = 1;
  int straggle_ms = 0;
  int64_t straggle_from_step = 0;
  double straggle_after_seconds = 0;
  app.add_option("--sync-dir", sync_dir,
                 "train in lockstep with the other ranks that share this directory");
  app.add_option("--rank", rank, "this process's rank, 0 to --world - 1")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--world", world, "how many ranks train together")->check(CLI::Range(1, 1024));
  app.add_option("--straggle-ms", straggle_ms, "extra compute in each step (a slow worker)")
      ->check(CLI::Range(0, 60000));
  app.add_option("--straggle-from-step", straggle_from_step,
                 "add --straggle-ms only from this step on (a worker that degrades mid-run)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--straggle-after-seconds", straggle_after_seconds,
                 "add --straggle-ms only once this long has passed since the start")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--seconds", seconds, "stop after this long (0: run until killed)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--step-ms", step_ms, "duration of one step")->check(CLI::Range(1, 60000));
  app.add_option("--busy-percent", busy_percent, "CPU busy share of each step, loader included")
      ->check(CLI::Range(0, 100));
  CLI11_PARSE(app, argc, argv);
  if (rank >= world) {
    std::fprintf(stderr, "train_loop: --rank %d is not below --world %d\n", rank, world);
    return 2;
  }

  std::signal(SIGINT, OnSignal);
  std::optional<FileBarrier> barrier;
  if (!sync_dir.empty()) {
    barrier.emplace(sync_dir, rank, world);
    std::string error;
    if (!barrier->Open(&error)) {
      std::fprintf(stderr, "train_loop: %s\n", error.c_str());
      return 1;
    }
  }
  std::signal(SIGTERM, OnSignal);
  const char* dir = std::getenv("CLUSTERPROF_DIR");
  std::printf("train_loop: pid %d, CLUSTERPROF_DIR=%s\n", static_cast<int>(getpid()),
              dir != nullptr && *dir != '\0' ? dir : "/var/run/clusterprof (default)");
  std::fflush(stdout);

  const Timing timing = MakeTiming(step_ms, busy_percent);
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = seconds > 0
                                         ? start + std::chrono::duration_cast<Clock::duration>(
                                                       std::chrono::duration<double>(seconds))
                                         : Clock::time_point::max();
  std::atomic<uint64_t> sink{0};
  BatchQueue queue(2);
  std::thread loader([&] { LoaderLoop(timing, queue, sink); });
  // In lockstep, what a step has left after the nominal compute is spent "communicating" once
  // every rank has arrived, so all ranks end the step together.
  const microseconds communicate =
      timing.step - timing.forward - timing.backward - timing.optimizer;

  clusterprof::SetThreadName("trainer");
  const Clock::time_point straggle_at =
      start + std::chrono::duration_cast<Clock::duration>(
                  std::chrono::duration<double>(straggle_after_seconds));
  bool straggling = false;
  int64_t step = 0;
  for (; g_stop == 0 && Clock::now() < deadline; ++step) {
    const Clock::time_point step_start = Clock::now();
    clusterprof::Trace trace("train", {{"step_num", step}, {"_r", 1}},
                             clusterprof::kAnnotationLevelCritical);
    uint64_t batch = 0;
    {
      clusterprof::Trace op("data_load");
      if (!queue.Pop(&batch)) break;
      clusterprof::AsyncEnd(batch);
    }
    const bool slow = straggle_ms > 0 && step >= straggle_from_step && Clock::now() >= straggle_at;
    if (slow && !straggling) {
      straggling = true;
      std::printf("train_loop: rank %d slows down by %d ms per step from step %lld\n", rank,
                  straggle_ms, static_cast<long long>(step));
      std::fflush(stdout);
    }
    {
      clusterprof::Trace op("forward", {{"batch", batch}});
      sink += Burn(timing.forward + std::chrono::milliseconds(slow ? straggle_ms : 0));
    }
    {
      clusterprof::Trace op("backward");
      sink += Burn(timing.backward);
    }
    {
      clusterprof::Trace op("optimizer");
      sink += Burn(timing.optimizer);
    }
    {
      // Waiting for the other workers' gradients: the rest of the step, idle.
      clusterprof::Trace op("allreduce");
      if (!barrier.has_value()) {
        std::this_thread::sleep_until(step_start + timing.step);
      } else if (barrier->Arrive(step, std::chrono::seconds(10))) {
        std::this_thread::sleep_for(communicate);
      } else if (g_stop == 0) {
        std::fprintf(stderr, "train_loop: the other ranks stopped; ending\n");
        break;
      }
    }
  }
  queue.Close();
  loader.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf("train_loop: %lld steps in %.1f s\n", static_cast<long long>(step), elapsed);
  return 0;
}
