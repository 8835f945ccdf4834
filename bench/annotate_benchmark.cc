// Cost of a scoped annotation (begin + end) with capture off and on, by thread count, and of the
// same scoped event as LTTng-UST tracepoints and NVTX ranges when those are built in
// (annotate_lttng_cases.cc, annotate_nvtx_cases.cc). Then the parts of the capture-on path: the
// clocks it could read and the ring append, alone and in a sketch of the path with cheaper
// timestamps. Figures and commands in bench/RESULTS.md.
//
// The annotation cases run with 1, 2, 4 and 8 threads, the parts with one. The CPU column is CPU
// time per scoped event on each thread; the Time column is wall time divided by the events of all
// threads together (the process's throughput). With more threads than cores, the extra threads
// measure contention and oversubscription, not parallel scaling.
#include <benchmark/benchmark.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "sdk/annotate.h"
#include "sdk/control_page.h"
#include "sdk/ring_writer.h"
#include "sdk/shm_format.h"
#include "sidecar/tracers/ring_reader.h"

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace clusterprof {
namespace {

// How often the drainer empties the rings. A thread ring holds 16384 records, which take at least
// 1.5 ms to fill at 100 ns per event.
constexpr auto kDrainInterval = std::chrono::microseconds(200);

// On a shared VM the drainer's CPU can be taken away for tens of milliseconds (steal), long enough
// for a ring to fill however often the drainer means to run. So every benchmark thread also
// drains, with its timer paused, once every kBackstopEvents events: no ring ever holds more than
// half its records, and every event is written, not dropped (the "dropped" counter shows it).
constexpr uint64_t kBackstopEvents = 8192;
static_assert(kBackstopEvents <= shm::kDefaultSlotsPerThread / 2);

// A fresh directory for the run, removed with its contents when the object dies. On /dev/shm when
// there is one: memory-backed, like the pod volume the rings live on in production.
class BenchDir {
 public:
  BenchDir() {
    struct stat st;
    std::string base = "/dev/shm";
    if (stat(base.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || access(base.c_str(), W_OK) != 0) {
      const char* tmp = std::getenv("TMPDIR");
      base = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
    }
    std::string pattern = base + "/clusterprof-bench-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      std::perror(("annotate_benchmark: cannot create " + pattern).c_str());
      std::abort();
    }
    path_ = pattern;
  }
  ~BenchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  BenchDir(const BenchDir&) = delete;
  BenchDir& operator=(const BenchDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct DrainTotals {
  uint64_t records = 0;
  uint64_t dropped = 0;
};

// Drains one process ring on a background thread, as the sidecar does, so that the writers never
// find their rings full; counts what it drained and what the writers dropped anyway. Thread-safe.
class Drainer {
 public:
  explicit Drainer(std::unique_ptr<shm::RingReader> reader)
      : reader_(std::move(reader)), thread_([this] { Loop(); }) {}
  ~Drainer() {
    stop_.store(true, std::memory_order_relaxed);
    thread_.join();
  }
  Drainer(const Drainer&) = delete;
  Drainer& operator=(const Drainer&) = delete;

  // Drains on the calling thread; returns the totals since the drainer started.
  DrainTotals DrainNow() {
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t visited = 0;
    const shm::DrainStats stats =
        reader_->Drain([&](const shm::ThreadInfo&, const shm::Record& record) {
          benchmark::DoNotOptimize(record.end_ns);
          ++visited;
        });
    totals_.records += visited;
    totals_.dropped += stats.dropped;
    return totals_;
  }

 private:
  void Loop() {
    while (!stop_.load(std::memory_order_relaxed)) {
      DrainNow();
      std::this_thread::sleep_for(kDrainInterval);
    }
  }

  std::mutex mu_;
  std::unique_ptr<shm::RingReader> reader_;  // guarded by mu_
  DrainTotals totals_;                       // guarded by mu_
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// The SDK's surroundings for the whole run: a directory without a control page (no sidecar), and
// one with a control page and, while armed, a drainer. Only thread 0 of a benchmark calls these,
// before its timed loop, while the other threads wait at the loop's start.
class Environment {
 public:
  Environment()
      : no_sidecar_dir_(dir_.path() + "/no-sidecar"), sidecar_dir_(dir_.path() + "/sidecar") {
    std::filesystem::create_directories(no_sidecar_dir_);
    std::filesystem::create_directories(sidecar_dir_);
    std::string error;
    control_ = shm::ControlWriter::Create(sidecar_dir_, &error);
    if (control_ == nullptr) {
      std::fprintf(stderr, "annotate_benchmark: %s\n", error.c_str());
      std::abort();
    }
  }

  // No control page: the state of a process in a pod without a sidecar.
  void UseNoSidecar() {
    drainer_.reset();
    if (mode_ != Mode::kNoSidecar) {
      annotate_internal::ResetForTesting(no_sidecar_dir_);
      mode_ = Mode::kNoSidecar;
    }
    { Trace warm("warm"); }  // the first annotation sets the SDK up
  }

  // A control page, disarmed: a sidecar that is not capturing.
  void UseDisarmed() {
    drainer_.reset();
    control_->Disarm();
    if (mode_ != Mode::kSidecar) Reset();
    { Trace warm("warm"); }
  }

  // Armed, with a drainer. Returns false when the ring could not be set up. Thread ring slots
  // are never reused and every benchmark run brings new threads, so the SDK starts a new ring
  // before `threads` more would not fit.
  bool UseArmed(int threads) {
    if (mode_ != Mode::kSidecar ||
        slots_used_ + threads > static_cast<int>(shm::kDefaultMaxThreads)) {
      drainer_.reset();
      Reset();
    }
    control_->ArmHost(kAnnotationLevelInfo, 0, 0);
    { Trace warm("warm"); }  // creates the ring and claims thread 0's slot
    slots_used_ += threads;
    if (drainer_ == nullptr) {
      const std::string path = GetAnnotationStats().ring_path;
      if (path.empty()) return false;
      auto reader = shm::RingReader::Open(path);
      if (!reader.ok()) return false;
      drainer_ = std::make_unique<Drainer>(*std::move(reader));
    }
    return true;
  }

  DrainTotals DrainNow() { return drainer_ == nullptr ? DrainTotals{} : drainer_->DrainNow(); }

 private:
  enum class Mode { kUnset, kNoSidecar, kSidecar };

  void Reset() {
    annotate_internal::ResetForTesting(sidecar_dir_);
    mode_ = Mode::kSidecar;
    slots_used_ = 0;
  }

  BenchDir dir_;
  std::string no_sidecar_dir_;
  std::string sidecar_dir_;
  std::unique_ptr<shm::ControlWriter> control_;
  std::unique_ptr<Drainer> drainer_;
  Mode mode_ = Mode::kUnset;
  int slots_used_ = 0;
};

Environment& Env() {
  static Environment env;
  return env;
}

// Reports what the drainer saw during the timed loop: the share of events the writers dropped
// (0 when the drainer kept up) and of events drained.
void ReportDrops(benchmark::State& state, const DrainTotals& before) {
  const DrainTotals after = Env().DrainNow();
  const double events = static_cast<double>(state.iterations()) * state.threads();
  state.counters["dropped"] = static_cast<double>(after.dropped - before.dropped) / events;
  state.counters["drained"] = static_cast<double>(after.records - before.records) / events;
}

void BM_Clusterprof_Off_NoSidecar(benchmark::State& state) {
  if (state.thread_index() == 0) Env().UseNoSidecar();
  for (auto _ : state) {
    Trace trace("train_step");
    benchmark::DoNotOptimize(trace);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Clusterprof_Off_NoSidecar)->ThreadRange(1, 8);

void BM_Clusterprof_Off_Disarmed(benchmark::State& state) {
  if (state.thread_index() == 0) Env().UseDisarmed();
  for (auto _ : state) {
    Trace trace("train_step");
    benchmark::DoNotOptimize(trace);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Clusterprof_Off_Disarmed)->ThreadRange(1, 8);

void BM_Clusterprof_Off_Disarmed_2Args(benchmark::State& state) {
  if (state.thread_index() == 0) Env().UseDisarmed();
  int64_t step = 0;
  for (auto _ : state) {
    Trace trace("train_step", {{"step_num", ++step}, {"_r", 1}});
    benchmark::DoNotOptimize(trace);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Clusterprof_Off_Disarmed_2Args)->ThreadRange(1, 8);

// Drains on the calling thread without counting the time.
void DrainUntimed(benchmark::State& state) {
  state.PauseTiming();
  Env().DrainNow();
  state.ResumeTiming();
}

void BM_Clusterprof_On(benchmark::State& state) {
  DrainTotals before;
  if (state.thread_index() == 0) {
    if (!Env().UseArmed(state.threads())) state.SkipWithError("no ring: see stderr");
    before = Env().DrainNow();
  }
  uint64_t events = 0;
  for (auto _ : state) {
    {
      Trace trace("train_step");
      benchmark::DoNotOptimize(trace);
    }
    if (++events % kBackstopEvents == 0) DrainUntimed(state);
  }
  state.SetItemsProcessed(state.iterations());
  if (state.thread_index() == 0 && !state.error_occurred()) ReportDrops(state, before);
}
BENCHMARK(BM_Clusterprof_On)->ThreadRange(1, 8);

void BM_Clusterprof_On_2Args(benchmark::State& state) {
  DrainTotals before;
  if (state.thread_index() == 0) {
    if (!Env().UseArmed(state.threads())) state.SkipWithError("no ring: see stderr");
    before = Env().DrainNow();
  }
  int64_t step = 0;
  for (auto _ : state) {
    {
      Trace trace("train_step", {{"step_num", ++step}, {"_r", 1}});
      benchmark::DoNotOptimize(trace);
    }
    if (static_cast<uint64_t>(step) % kBackstopEvents == 0) DrainUntimed(state);
  }
  state.SetItemsProcessed(state.iterations());
  if (state.thread_index() == 0 && !state.error_occurred()) ReportDrops(state, before);
}
BENCHMARK(BM_Clusterprof_On_2Args)->ThreadRange(1, 8);

// A name that is not a literal (a std::string, as a framework's op name would be): the SDK cannot
// take it for the text it held before at the same address, so it looks it up out of line
// (annotate_internal::Intern: a direct-mapped cache checked against a copy of the text).
void BM_Clusterprof_On_StringName(benchmark::State& state) {
  DrainTotals before;
  if (state.thread_index() == 0) {
    if (!Env().UseArmed(state.threads())) state.SkipWithError("no ring: see stderr");
    before = Env().DrainNow();
  }
  const std::string name = "train_step";
  uint64_t events = 0;
  for (auto _ : state) {
    {
      Trace trace(name);
      benchmark::DoNotOptimize(trace);
    }
    if (++events % kBackstopEvents == 0) DrainUntimed(state);
  }
  state.SetItemsProcessed(state.iterations());
  if (state.thread_index() == 0 && !state.error_occurred()) ReportDrops(state, before);
}
BENCHMARK(BM_Clusterprof_On_StringName)->ThreadRange(1, 8);

// Eight scoped events per iteration, each under a literal name of its own, as the phases of a
// training step would be: the names share the thread's name cache. The "per_event" counter is
// the CPU time of one event.
void BM_Clusterprof_On_EightNames(benchmark::State& state) {
  DrainTotals before;
  if (state.thread_index() == 0) {
    if (!Env().UseArmed(state.threads())) state.SkipWithError("no ring: see stderr");
    before = Env().DrainNow();
  }
  constexpr int kEvents = 8;
  uint64_t events = 0;
  for (auto _ : state) {
    // clang-format off
    { Trace trace("data_load"); benchmark::DoNotOptimize(trace); }
    { Trace trace("forward"); benchmark::DoNotOptimize(trace); }
    { Trace trace("backward"); benchmark::DoNotOptimize(trace); }
    { Trace trace("allreduce"); benchmark::DoNotOptimize(trace); }
    { Trace trace("optimizer"); benchmark::DoNotOptimize(trace); }
    { Trace trace("zero_grad"); benchmark::DoNotOptimize(trace); }
    { Trace trace("checkpoint"); benchmark::DoNotOptimize(trace); }
    { Trace trace("log_metrics"); benchmark::DoNotOptimize(trace); }
    // clang-format on
    events += kEvents;
    if (events % kBackstopEvents == 0) DrainUntimed(state);
  }
  state.SetItemsProcessed(state.iterations() * kEvents);
  state.counters["per_event"] = benchmark::Counter(
      kEvents, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kAvgThreads |
                   benchmark::Counter::kInvert);
  if (state.thread_index() == 0 && !state.error_occurred()) {
    const DrainTotals after = Env().DrainNow();
    const double total = static_cast<double>(state.iterations()) * state.threads() * kEvents;
    state.counters["dropped"] = static_cast<double>(after.dropped - before.dropped) / total;
    state.counters["drained"] = static_cast<double>(after.records - before.records) / total;
  }
}
BENCHMARK(BM_Clusterprof_On_EightNames)->ThreadRange(1, 8);

// The floor of the capture-off check: TracingEnabled(), the same two loads and branch a Trace
// starts with, without constructing or destroying a Trace.
void BM_TracingEnabledCheck(benchmark::State& state) {
  Env().UseDisarmed();
  for (auto _ : state) {
    bool enabled = TracingEnabled();
    benchmark::DoNotOptimize(enabled);
  }
}
BENCHMARK(BM_TracingEnabledCheck);

// The parts of the capture-on path, one thread each.

void BM_Clock(benchmark::State& state, clockid_t clock) {
  timespec ts;
  for (auto _ : state) {
    clock_gettime(clock, &ts);
    benchmark::DoNotOptimize(ts);
  }
}
BENCHMARK_CAPTURE(BM_Clock, realtime, CLOCK_REALTIME);
BENCHMARK_CAPTURE(BM_Clock, monotonic, CLOCK_MONOTONIC);
BENCHMARK_CAPTURE(BM_Clock, realtime_coarse, CLOCK_REALTIME_COARSE);

#if defined(__x86_64__)
void BM_Rdtsc(benchmark::State& state) {
  for (auto _ : state) {
    uint64_t tsc = __rdtsc();
    benchmark::DoNotOptimize(tsc);
  }
}
BENCHMARK(BM_Rdtsc);

void BM_Rdtscp(benchmark::State& state) {
  unsigned aux;
  for (auto _ : state) {
    uint64_t tsc = __rdtscp(&aux);
    benchmark::DoNotOptimize(tsc);
  }
}
BENCHMARK(BM_Rdtscp);

// Wall-clock ns from the TSC, as the SDK could compute them without calling clock_gettime: one
// (TSC, CLOCK_REALTIME) pair and a scale factor, then a multiply and a shift per timestamp. The
// record keeps wall-clock ns, so the format does not change. Here the pair is taken once; in the
// SDK a background thread (the control page poller wakes every 200 ms already) would refresh it
// so that the clock follows NTP. Plain rdtsc, not ordered against earlier instructions.
class TscClock {
 public:
  TscClock() {
    timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const uint64_t c0 = __rdtsc();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const uint64_t c1 = __rdtsc();
    const double ns = (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec);
    mult_ = static_cast<uint64_t>(ns / static_cast<double>(c1 - c0) * (1ull << kShift));
    timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    base_tsc_ = __rdtsc();
    base_ns_ = static_cast<int64_t>(now.tv_sec) * 1'000'000'000 + now.tv_nsec;
  }
  int64_t NowNs() const {
    const uint64_t delta = __rdtsc() - base_tsc_;
    return base_ns_ +
           static_cast<int64_t>((static_cast<unsigned __int128>(delta) * mult_) >> kShift);
  }

 private:
  static constexpr int kShift = 32;
  uint64_t base_tsc_ = 0;
  int64_t base_ns_ = 0;
  uint64_t mult_ = 0;
};

const TscClock& GetTscClock() {
  static const TscClock* clock = new TscClock();
  return *clock;
}

void BM_TscWallNs(benchmark::State& state) {
  const TscClock& clock = GetTscClock();
  for (auto _ : state) {
    int64_t ns = clock.NowNs();
    benchmark::DoNotOptimize(ns);
  }
}
BENCHMARK(BM_TscWallNs);
#endif  // defined(__x86_64__)

int64_t RealtimeNs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// One thread ring in ordinary memory, with the layout of the ring file's (a ThreadSlot and its
// records) and a consumer thread that drains it every kDrainInterval as RingReader does. For
// measuring the producer's side without the rest of the SDK. DrainNow is thread-safe.
class LocalRing {
 public:
  static constexpr uint32_t kSlots = shm::kDefaultSlotsPerThread;

  LocalRing() : records_(new shm::Record[kSlots]), consumer_([this] { Consume(); }) {}
  ~LocalRing() {
    stop_.store(true, std::memory_order_relaxed);
    consumer_.join();
  }
  LocalRing(const LocalRing&) = delete;
  LocalRing& operator=(const LocalRing&) = delete;

  shm::ThreadSlot* slot() { return &slot_; }
  shm::Record* records() { return records_.get(); }
  uint64_t dropped() const { return slot_.dropped.load(std::memory_order_relaxed); }

  void DrainNow() {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t write = slot_.write_index.load(std::memory_order_acquire);
    uint64_t read = slot_.read_index.load(std::memory_order_relaxed);
    for (; read < write; ++read) {
      const shm::Record record = records_[read & (kSlots - 1)];
      benchmark::DoNotOptimize(record.end_ns);
    }
    slot_.read_index.store(write, std::memory_order_release);
  }

 private:
  void Consume() {
    while (!stop_.load(std::memory_order_relaxed)) {
      DrainNow();
      std::this_thread::sleep_for(kDrainInterval);
    }
  }

  std::mutex mu_;  // one drain at a time: the consumer thread's or the producer's backstop
  shm::ThreadSlot slot_{};
  std::unique_ptr<shm::Record[]> records_;
  std::atomic<bool> stop_{false};
  std::thread consumer_;
};

// The same single-producer append as shm::ThreadRing::Append, except that the producer keeps the
// last read_index it saw and only loads the consumer's (a cache line the consumer writes) when
// the ring looks full. The shared-memory layout and protocol stay the same.
class CachedIndexRing {
 public:
  CachedIndexRing(shm::ThreadSlot* slot, shm::Record* records, uint32_t slots)
      : slot_(slot), records_(records), mask_(slots - 1) {}

  bool Append(const shm::Record& record) {
    const uint64_t write = slot_->write_index.load(std::memory_order_relaxed);
    if (write - cached_read_ > mask_) {
      cached_read_ = slot_->read_index.load(std::memory_order_acquire);
      if (write - cached_read_ > mask_) {
        slot_->dropped.fetch_add(1, std::memory_order_relaxed);
        return false;
      }
    }
    records_[write & mask_] = record;
    slot_->write_index.store(write + 1, std::memory_order_release);
    return true;
  }

 private:
  shm::ThreadSlot* slot_;
  shm::Record* records_;
  uint64_t mask_;
  uint64_t cached_read_ = 0;
};

shm::Record SampleRecord() {
  shm::Record record{};
  record.kind = shm::RecordKind::kComplete;
  record.name_id = 1;
  record.start_ns = RealtimeNs();
  record.end_ns = record.start_ns + 1000;
  return record;
}

void ReportLocalDrops(benchmark::State& state, const LocalRing& ring) {
  state.counters["dropped"] =
      static_cast<double>(ring.dropped()) / static_cast<double>(state.iterations());
}

// Appends `record` once per iteration, with the same backstop drain as the SDK cases.
template <typename Ring>
void RunAppend(benchmark::State& state, LocalRing& local, Ring& ring) {
  const shm::Record record = SampleRecord();
  uint64_t events = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(ring.Append(record));
    if (++events % kBackstopEvents == 0) {
      state.PauseTiming();
      local.DrainNow();
      state.ResumeTiming();
    }
  }
  ReportLocalDrops(state, local);
}

// The ring append alone: shm::ThreadRing::Append, then the cached-read-index variant.
void BM_RingAppend(benchmark::State& state) {
  LocalRing local;
  shm::ThreadRing ring(local.slot(), local.records(), LocalRing::kSlots);
  RunAppend(state, local, ring);
}
BENCHMARK(BM_RingAppend);

void BM_RingAppend_CachedReadIndex(benchmark::State& state) {
  LocalRing local;
  CachedIndexRing ring(local.slot(), local.records(), LocalRing::kSlots);
  RunAppend(state, local, ring);
}
BENCHMARK(BM_RingAppend_CachedReadIndex);

// A sketch of the capture-on scoped event with the SDK's record and ring, where only the clock
// and the append vary: the level check, the ring at hand, a name id already known, the record
// filled at begin, a timestamp at each end, one append. What the SDK adds beyond this (finding the
// thread's ring, its name cache, the calls into annotate.cc, the second level check) is the
// difference from BM_Clusterprof_On.
template <typename Ring, typename Clock>
void RunScopedEventSketch(benchmark::State& state, LocalRing& local, Ring& ring, const Clock& now) {
  std::atomic<uint32_t> level{kAnnotationLevelInfo};
  uint64_t events = 0;
  for (auto _ : state) {
    if (kAnnotationLevelInfo <= level.load(std::memory_order_relaxed)) {
      shm::Record record{};
      record.kind = shm::RecordKind::kComplete;
      record.name_id = 1;
      record.start_ns = now();
      benchmark::DoNotOptimize(record);  // the annotated work
      record.end_ns = now();
      benchmark::DoNotOptimize(ring.Append(record));
    }
    if (++events % kBackstopEvents == 0) {
      state.PauseTiming();
      local.DrainNow();
      state.ResumeTiming();
    }
  }
  ReportLocalDrops(state, local);
}

void BM_ScopedEventSketch_Realtime(benchmark::State& state) {
  LocalRing local;
  shm::ThreadRing ring(local.slot(), local.records(), LocalRing::kSlots);
  RunScopedEventSketch(state, local, ring, RealtimeNs);
}
BENCHMARK(BM_ScopedEventSketch_Realtime);

#if defined(__x86_64__)
void BM_ScopedEventSketch_Tsc(benchmark::State& state) {
  LocalRing local;
  shm::ThreadRing ring(local.slot(), local.records(), LocalRing::kSlots);
  const TscClock& clock = GetTscClock();
  RunScopedEventSketch(state, local, ring, [&clock] { return clock.NowNs(); });
}
BENCHMARK(BM_ScopedEventSketch_Tsc);

void BM_ScopedEventSketch_Tsc_CachedReadIndex(benchmark::State& state) {
  LocalRing local;
  CachedIndexRing ring(local.slot(), local.records(), LocalRing::kSlots);
  const TscClock& clock = GetTscClock();
  RunScopedEventSketch(state, local, ring, [&clock] { return clock.NowNs(); });
}
BENCHMARK(BM_ScopedEventSketch_Tsc_CachedReadIndex);
#endif  // defined(__x86_64__)

}  // namespace
}  // namespace clusterprof

BENCHMARK_MAIN();
