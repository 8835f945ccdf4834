#include "sidecar/tracers/annotation_tracer.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <map>
#include <thread>

#include "common/base/strings.h"
#include "common/xspace/builder.h"
#include "common/xspace/schema.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/ring_writer.h"
#include "tests/support/temp_dir.h"
#include "tsl/profiler/protos/xplane.pb.h"

namespace clusterprof::sidecar {
namespace {

using clusterprof::testing::FileExists;
using clusterprof::testing::TempDir;
using clusterprof::testing::WriteFileOrDie;
using tensorflow::profiler::XEvent;
using tensorflow::profiler::XLine;
using tensorflow::profiler::XPlane;
using tensorflow::profiler::XSpace;
using tensorflow::profiler::XStat;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int64_t kStart = 1'000'000'000'000;  // ns; the capture window in these tests
constexpr int64_t kStop = kStart + 1'000'000'000;

// Writes records into a ring file as a workload process would.
class FakeProcess {
 public:
  explicit FakeProcess(const std::string& dir, uint32_t slots = 1024) {
    shm::RingOptions options;
    options.process_name = "trainer";
    options.slots_per_thread = slots;
    options.max_threads = 4;
    std::string error;
    writer_ = shm::RingWriter::Create(dir, options, &error);
    EXPECT_NE(writer_, nullptr) << error;
  }
  shm::ThreadRing* Thread(uint32_t tid, std::string_view name = "") {
    shm::ThreadRing* ring = writer_->ClaimThread(tid);
    if (!name.empty()) ring->SetName(writer_->Intern(name));
    return ring;
  }
  shm::Record Complete(std::string_view name, int64_t start, int64_t end) {
    shm::Record record{};
    record.kind = shm::RecordKind::kComplete;
    record.name_id = writer_->Intern(name);
    record.start_ns = start;
    record.end_ns = end;
    return record;
  }
  shm::Record Async(bool begin, std::string_view name, uint64_t id, int64_t at) {
    shm::Record record{};
    record.kind = begin ? shm::RecordKind::kAsyncBegin : shm::RecordKind::kAsyncEnd;
    if (begin) record.name_id = writer_->Intern(name);
    record.async_id = id;
    record.start_ns = record.end_ns = at;
    return record;
  }
  uint32_t Intern(std::string_view text) { return writer_->Intern(text); }
  const std::string& path() const { return writer_->path(); }

 private:
  std::unique_ptr<shm::RingWriter> writer_;
};

CaptureWindow Window() { return {kStart, kStop}; }

CaptureConfig Config() {
  CaptureConfig config;
  config.options.set_host_tracer_level(2);
  return config;
}

std::string EventName(const XPlane& plane, const XEvent& event) {
  return plane.event_metadata().at(event.metadata_id()).name();
}

std::map<std::string, const XStat*> Stats(const XPlane& plane, const XEvent& event) {
  std::map<std::string, const XStat*> stats;
  for (const XStat& stat : event.stats()) {
    stats[plane.stat_metadata().at(stat.metadata_id()).name()] = &stat;
  }
  return stats;
}

const XLine* LineNamed(const XPlane& plane, std::string_view name) {
  for (const XLine& line : plane.lines()) {
    if (line.name() == name) return &line;
  }
  return nullptr;
}

class AnnotationTracerTest : public ::testing::Test {
 protected:
  // Without the flight recorder: the capture path alone (RecorderTest below has it on).
  std::unique_ptr<AnnotationTracer> NewTracer(std::string proc_root = "/proc",
                                              uint64_t max_events = 1000,
                                              int64_t drain_interval_ms = 1) {
    AnnotationTracer::Options options;
    options.default_max_events = max_events;
    options.drain_interval_ms = drain_interval_ms;
    options.recorder_level = 0;
    return NewTracerWith(options, std::move(proc_root));
  }
  std::unique_ptr<AnnotationTracer> NewTracerWith(const AnnotationTracer::Options& options,
                                                  std::string proc_root = "/proc") {
    auto shm = ShmTransport::Create({.dir = dir_.path(), .proc_root = std::move(proc_root)});
    EXPECT_TRUE(shm.ok()) << shm.status();
    transports_.push_back(std::move(*shm));
    auto tracer = AnnotationTracer::Create(transports_.back().get(), options);
    EXPECT_TRUE(tracer.ok()) << tracer.status();
    return std::move(*tracer);
  }
  XSpace Capture(AnnotationTracer& tracer, const std::function<void()>& during,
                 TracerStats* stats) {
    EXPECT_TRUE(tracer.Start(Window(), Config()).ok());
    during();
    EXPECT_TRUE(tracer.Stop(kStop).ok());
    XSpace space;
    EXPECT_TRUE(tracer.CollectInto(&space, stats).ok());
    return space;
  }

  TempDir dir_;
  std::vector<std::unique_ptr<ShmTransport>> transports_;
};

TEST_F(AnnotationTracerTest, ArmsTheControlPageOnlyWhileCapturing) {
  auto tracer = NewTracer();
  shm::ControlReader reader;
  ASSERT_TRUE(reader.TryAttach(dir_.path()));
  EXPECT_EQ(reader.page().host_level.load(), 0u);
  ASSERT_TRUE(tracer->Start(Window(), Config()).ok());
  EXPECT_EQ(reader.page().host_level.load(), 2u);
  EXPECT_EQ(reader.page().start_ns.load(), kStart);
  ASSERT_TRUE(tracer->Stop(kStop).ok());
  EXPECT_EQ(reader.page().host_level.load(), 0u);
}

TEST_F(AnnotationTracerTest, OneLinePerThreadWithDecodedStats) {
  auto tracer = NewTracer();
  FakeProcess process(dir_.path());
  shm::ThreadRing* main = process.Thread(101, "main");
  shm::ThreadRing* worker = process.Thread(102);
  // Written before the capture: discarded at Start.
  main->Append(process.Complete("stale", kStart - 500, kStart - 400));

  TracerStats stats;
  XSpace space = Capture(
      *tracer,
      [&] {
        shm::Record step =
            process.Complete("train#step_num=7,_r=1,shape=[1,2]#", kStart + 100, kStart + 900);
        step.num_args = 2;
        step.args[0] = {process.Intern("loss"), shm::ArgType::kDouble,
                        std::bit_cast<uint64_t>(0.25)};
        step.args[1] = {process.Intern("phase"), shm::ArgType::kString, process.Intern("warmup")};
        main->Append(process.Complete("forward", kStart + 200, kStart + 300));
        main->Append(step);
        worker->Append(process.Complete("load", kStart + 150, kStart + 250));
      },
      &stats);

  EXPECT_EQ(stats.events, 3u);
  EXPECT_EQ(stats.dropped_events, 0u);
  const XPlane* plane = xspace::FindPlaneWithName(space, xspace::kHostThreadsPlaneName);
  ASSERT_NE(plane, nullptr);
  ASSERT_EQ(plane->lines_size(), 2);
  const XLine* main_line = LineNamed(*plane, "main");
  ASSERT_NE(main_line, nullptr);
  EXPECT_EQ(main_line->id(), 101);
  ASSERT_EQ(main_line->events_size(), 2);
  const XLine* worker_line = LineNamed(*plane, "trainer/102");
  ASSERT_NE(worker_line, nullptr) << "an unnamed thread is named after its process and tid";
  EXPECT_EQ(worker_line->events_size(), 1);

  const XEvent* step = nullptr;
  for (const XEvent& event : main_line->events()) {
    if (EventName(*plane, event) == "train") step = &event;
  }
  ASSERT_NE(step, nullptr) << "the TraceMe name is decoded: 'train', not the encoded text";
  EXPECT_EQ(main_line->timestamp_ns() * 1000 + step->offset_ps(), (kStart + 100) * 1000);
  EXPECT_EQ(step->duration_ps(), 800'000);
  auto event_stats = Stats(*plane, *step);
  ASSERT_TRUE(event_stats.count("step_num"));
  EXPECT_EQ(event_stats["step_num"]->int64_value(), 7);
  EXPECT_EQ(event_stats["_r"]->int64_value(), 1);
  ASSERT_TRUE(event_stats.count("shape"));
  EXPECT_EQ(plane->stat_metadata().at(event_stats["shape"]->ref_value()).name(), "[1,2]");
  EXPECT_DOUBLE_EQ(event_stats["loss"]->double_value(), 0.25);
  EXPECT_EQ(plane->stat_metadata().at(event_stats["phase"]->ref_value()).name(), "warmup");
}

TEST_F(AnnotationTracerTest, AnEmptyCaptureSaysNoProcessAttachedNamingTheDirectory) {
  auto tracer = NewTracer();
  TracerStats stats;
  XSpace space = Capture(
      *tracer, [] {}, &stats);
  EXPECT_EQ(stats.events, 0u);
  ASSERT_EQ(space.warnings_size(), 1);
  EXPECT_THAT(space.warnings(0),
              AllOf(HasSubstr("no process attached to " + dir_.path()),
                    HasSubstr("CLUSTERPROF_DIR=" + dir_.path()), HasSubstr("import clusterprof"),
                    HasSubstr("clusterprof::Trace")));
}

TEST_F(AnnotationTracerTest, AnEmptyCaptureNamesTheProcessesThatAttachedButRecordedNothing) {
  auto tracer = NewTracer();
  FakeProcess process(dir_.path());
  shm::ThreadRing* thread = process.Thread(7, "t");
  TracerStats stats;
  // Only outside the window.
  XSpace space = Capture(
      *tracer, [&] { thread->Append(process.Complete("after", kStop + 100, kStop + 200)); },
      &stats);
  EXPECT_EQ(stats.events, 0u);
  ASSERT_EQ(space.warnings_size(), 1);
  EXPECT_THAT(space.warnings(0), AllOf(HasSubstr("1 process(es) attached to " + dir_.path()),
                                       HasSubstr(StrCat("pid ", getpid(), " (trainer)")),
                                       HasSubstr("recorded nothing in the window")));
}

TEST_F(AnnotationTracerTest, EventsOutsideTheWindowAreLeftOut) {
  auto tracer = NewTracer();
  FakeProcess process(dir_.path());
  shm::ThreadRing* thread = process.Thread(7, "t");
  TracerStats stats;
  XSpace space = Capture(
      *tracer,
      [&] {
        thread->Append(process.Complete("before", kStart - 300, kStart - 200));
        thread->Append(process.Complete("straddles", kStart - 100, kStart + 100));
        thread->Append(process.Complete("after", kStop + 100, kStop + 200));
      },
      &stats);
  EXPECT_EQ(stats.events, 1u);
  const XPlane* plane = xspace::FindPlaneWithName(space, xspace::kHostThreadsPlaneName);
  ASSERT_EQ(plane->lines_size(), 1);
  EXPECT_EQ(EventName(*plane, plane->lines(0).events(0)), "straddles");
  EXPECT_LE(plane->lines(0).timestamp_ns(), kStart - 100) << "no negative offsets";
}

TEST_F(AnnotationTracerTest, OverlappingAsyncEventsGetLanesOfTheirOwn) {
  auto tracer = NewTracer();
  FakeProcess process(dir_.path());
  shm::ThreadRing* a = process.Thread(1, "producer");
  shm::ThreadRing* b = process.Thread(2, "consumer");
  TracerStats stats;
  XSpace space = Capture(
      *tracer,
      [&] {
        a->Append(process.Async(true, "fetch", 1, kStart + 100));
        a->Append(process.Async(true, "fetch", 2, kStart + 200));  // overlaps fetch 1
        b->Append(process.Async(false, "", 1, kStart + 500));
        b->Append(process.Async(false, "", 2, kStart + 600));
        a->Append(process.Async(true, "never_ends", 3, kStart + 700));
        b->Append(process.Async(false, "", 99, kStart + 800));  // no begin: ignored
      },
      &stats);
  EXPECT_EQ(stats.events, 3u);
  const XPlane* plane = xspace::FindPlaneWithName(space, xspace::kHostThreadsPlaneName);
  const XLine* lane0 = LineNamed(*plane, "trainer async");
  const XLine* lane1 = LineNamed(*plane, "trainer async 1");
  ASSERT_NE(lane0, nullptr);
  ASSERT_NE(lane1, nullptr);
  EXPECT_EQ(lane0->events_size() + lane1->events_size(), 3);
  for (const XLine* lane : {lane0, lane1}) {
    for (int i = 1; i < lane->events_size(); ++i) {
      const XEvent& prev = lane->events(i - 1);
      EXPECT_LE(prev.offset_ps() + prev.duration_ps(), lane->events(i).offset_ps())
          << "events on one line must not overlap";
    }
  }
  // The one that never ended is shown up to the stop.
  bool found = false;
  for (const XLine* lane : {lane0, lane1}) {
    for (const XEvent& event : lane->events()) {
      if (EventName(*plane, event) != "never_ends") continue;
      found = true;
      EXPECT_EQ(lane->timestamp_ns() * 1000 + event.offset_ps() + event.duration_ps(),
                kStop * 1000);
    }
  }
  EXPECT_TRUE(found);
}

TEST_F(AnnotationTracerTest, AsyncEndsOnAThreadReadBeforeTheBeginsStillMatch) {
  auto tracer = NewTracer();
  FakeProcess process(dir_.path());
  // The consumer claims its slot first, so its records (the ends) are read first.
  shm::ThreadRing* consumer = process.Thread(1, "trainer");
  shm::ThreadRing* producer = process.Thread(2, "loader");
  TracerStats stats;
  XSpace space = Capture(
      *tracer,
      [&] {
        for (uint64_t batch = 0; batch < 3; ++batch) {
          const int64_t t = kStart + 1000 * static_cast<int64_t>(batch);
          producer->Append(process.Async(true, "batch_in_queue", batch, t));
          consumer->Append(process.Async(false, "", batch, t + 100));
        }
      },
      &stats);
  EXPECT_EQ(stats.events, 3u);
  const XPlane* plane = xspace::FindPlaneWithName(space, xspace::kHostThreadsPlaneName);
  const XLine* lane = LineNamed(*plane, "trainer async");
  ASSERT_NE(lane, nullptr);
  ASSERT_EQ(lane->events_size(), 3) << "non-overlapping spans share one lane";
  for (const XEvent& event : lane->events()) {
    EXPECT_EQ(event.duration_ps(), 100'000) << "each batch ends 100 ns after it begins";
  }
  EXPECT_EQ(LineNamed(*plane, "trainer async 1"), nullptr);
}

TEST_F(AnnotationTracerTest, FullRingsAndTheEventCapAreCountedAndReported) {
  // No drain between Start and Stop: the 8-slot ring takes 8 of 12 records and drops 4; the
  // cap keeps 5 of those 8.
  auto tracer = NewTracer("/proc", /*max_events=*/5, /*drain_interval_ms=*/3'600'000);
  FakeProcess process(dir_.path(), /*slots=*/8);
  shm::ThreadRing* thread = process.Thread(3, "busy");
  TracerStats stats;
  XSpace space = Capture(
      *tracer,
      [&] {
        for (int i = 0; i < 12; ++i)
          thread->Append(process.Complete("e", kStart + i, kStart + i + 1));
      },
      &stats);
  EXPECT_EQ(stats.events, 5u);
  EXPECT_EQ(stats.dropped_events, 7u) << "4 by the full ring, 3 by the cap";
  bool cap_warning = false;
  bool ring_warning = false;
  for (const std::string& warning : space.warnings()) {
    cap_warning = cap_warning || warning.find("cap of 5") != std::string::npos;
    ring_warning = ring_warning || warning.find("4 events of trainer") != std::string::npos;
  }
  EXPECT_TRUE(cap_warning);
  EXPECT_TRUE(ring_warning);
}

TEST_F(AnnotationTracerTest, RingsOfExitedProcessesAreDrainedThenRemoved) {
  // A proc root without our pid, and a writer that ends (its ring's lock released) before the
  // stop: a process that has exited.
  TempDir empty_proc;
  auto tracer = NewTracer(empty_proc.path());
  auto process = std::make_unique<FakeProcess>(dir_.path());
  shm::ThreadRing* thread = process->Thread(5, "doomed");
  const std::string path = process->path();
  TracerStats stats;
  XSpace space = Capture(
      *tracer,
      [&] {
        thread->Append(process->Complete("last_words", kStart + 10, kStart + 20));
        process.reset();
      },
      &stats);
  EXPECT_EQ(stats.events, 1u) << "the dead process's events are kept";
  EXPECT_FALSE(FileExists(path)) << "and its ring is removed after the drain";
}

TEST_F(AnnotationTracerTest, RingsOfLiveProcessesStay) {
  // Whether or not the writer's pid is visible (another container of the pod sees none).
  TempDir empty_proc;
  auto tracer = NewTracer(empty_proc.path());
  FakeProcess process(dir_.path());
  process.Thread(5, "alive")->Append(process.Complete("x", kStart + 1, kStart + 2));
  TracerStats stats;
  Capture(
      *tracer, [] {}, &stats);
  EXPECT_TRUE(FileExists(process.path()));
}

TEST_F(AnnotationTracerTest, ACorruptRingIsAWarningNotAFailure) {
  auto tracer = NewTracer();
  WriteFileOrDie(dir_.Join("ring-1-1.shm"), std::string(4096, 'x'));
  FakeProcess process(dir_.path());
  shm::ThreadRing* thread = process.Thread(9, "ok");
  TracerStats stats;
  XSpace space = Capture(
      *tracer, [&] { thread->Append(process.Complete("fine", kStart + 1, kStart + 2)); }, &stats);
  EXPECT_EQ(stats.events, 1u);
  ASSERT_GE(space.warnings_size(), 1);
  EXPECT_NE(space.warnings(0).find("ring-1-1.shm"), std::string::npos) << space.warnings(0);
}

TEST_F(AnnotationTracerTest, ProcessesThatStartDuringTheCaptureAreFound) {
  auto tracer = NewTracer();
  ASSERT_TRUE(tracer->Start(Window(), Config()).ok());
  FakeProcess late(dir_.path());
  late.Thread(11, "late")->Append(late.Complete("hello", kStart + 5, kStart + 6));
  ASSERT_TRUE(tracer->Stop(kStop).ok());
  XSpace space;
  TracerStats stats;
  ASSERT_TRUE(tracer->CollectInto(&space, &stats).ok());
  EXPECT_EQ(stats.events, 1u);
}

// The flight recorder: the tracer drains between captures, keeps a window of annotations for a
// capture's lookback, and feeds the live step telemetry. Time is a fake wall clock.
class RecorderTest : public AnnotationTracerTest {
 protected:
  AnnotationTracer::Options RecorderOptions() {
    AnnotationTracer::Options options;
    options.recorder_level = 2;
    options.recorder_window_ms = 10'000;
    options.recorder_drain_interval_ms = 3'600'000;  // the test drains (DrainOnce)
    options.drain_interval_ms = 3'600'000;
    options.now_ns = [this] { return now_.load(); };
    return options;
  }
  CaptureConfig LookbackConfig(int64_t lookback_ms) {
    CaptureConfig config = Config();
    (*config.options.mutable_advanced_configuration())["clusterprof_lookback_ms"].set_int64_value(
        lookback_ms);
    return config;
  }
  XSpace CaptureWith(AnnotationTracer& tracer, const CaptureConfig& config,
                     const std::function<void()>& during, TracerStats* stats,
                     const CaptureWindow& window = Window()) {
    EXPECT_TRUE(tracer.Prepare(window, config).ok());
    EXPECT_TRUE(tracer.Start(window, config).ok());
    during();
    EXPECT_TRUE(tracer.Stop(kStop).ok());
    XSpace space;
    EXPECT_TRUE(tracer.CollectInto(&space, stats).ok());
    return space;
  }
  static std::vector<std::string> Names(const XSpace& space) {
    std::vector<std::string> names;
    for (const XPlane& plane : space.planes()) {
      for (const XLine& line : plane.lines()) {
        for (const XEvent& event : line.events()) names.push_back(EventName(plane, event));
      }
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  std::atomic<int64_t> now_{kStart - 20'000'000'000};
};

TEST_F(RecorderTest, ArmsTheRecorderLevelBetweenCapturesAndTheCapturesLevelDuringThem) {
  auto tracer = NewTracerWith(RecorderOptions());
  shm::ControlReader reader;
  ASSERT_TRUE(reader.TryAttach(dir_.path()));
  EXPECT_EQ(reader.page().host_level.load(), 2u) << "armed from the start, no capture needed";
  CaptureConfig verbose = Config();
  verbose.options.set_host_tracer_level(3);
  ASSERT_TRUE(tracer->Start(Window(), verbose).ok());
  EXPECT_EQ(reader.page().host_level.load(), 3u);
  ASSERT_TRUE(tracer->Stop(kStop).ok());
  EXPECT_EQ(reader.page().host_level.load(), 2u) << "back to the recorder's level";
  tracer.reset();
  EXPECT_EQ(reader.page().host_level.load(), 0u) << "and off when the sidecar goes";
}

TEST_F(RecorderTest, ALookbackHoldsTheEventsBeforeTheStartAndNothingOlder) {
  auto tracer = NewTracerWith(RecorderOptions());
  FakeProcess process(dir_.path());
  shm::ThreadRing* thread = process.Thread(7, "trainer");
  // Written and drained before the capture, as the recorder does between captures.
  thread->Append(process.Complete("too_old", kStart - 5'000'000'000, kStart - 4'000'000'000));
  thread->Append(process.Complete("before", kStart - 2'000'000'000, kStart - 1'000'000'000));
  now_ = kStart - 900'000'000;
  tracer->DrainOnce();
  // Written before the start but drained only once the capture runs.
  thread->Append(process.Complete("just_before", kStart - 500'000'000, kStart - 100'000'000));
  now_ = kStart;
  TracerStats stats;
  XSpace space = CaptureWith(
      *tracer, LookbackConfig(3'000),
      [&] { thread->Append(process.Complete("during", kStart + 10, kStart + 20)); }, &stats);
  EXPECT_THAT(Names(space), ::testing::ElementsAre("before", "during", "just_before"));
  EXPECT_EQ(stats.lookback_ns, 3'000'000'000);
  EXPECT_EQ(stats.events, 3u);
  for (const std::string& warning : space.warnings()) ADD_FAILURE() << warning;

  // The next capture without a lookback starts at its start instant.
  TracerStats second;
  XSpace next = CaptureWith(
      *tracer, Config(),
      [&] { thread->Append(process.Complete("again", kStart + 30, kStart + 40)); }, &second);
  EXPECT_THAT(Names(next), ::testing::ElementsAre("again"));
  EXPECT_EQ(second.lookback_ns, 0);
}

// A sidecar that wakes 5 ms after the requested instant (a busy node, no SCHED_FIFO).
constexpr int64_t kWakeDelay = 5'000'000;
CaptureWindow LateWindow() { return {kStart + kWakeDelay, kStop + kWakeDelay, kStart}; }

// Records on both sides of the requested instant, as the workload writes them before the late
// wake-up: the older ones drained by the recorder between captures, the last ones still in the
// ring when the capture starts.
void WriteAroundTheInstant(FakeProcess& process, shm::ThreadRing* thread, AnnotationTracer& tracer,
                           std::atomic<int64_t>& now) {
  thread->Append(process.Complete("before_instant", kStart - 3'000'000, kStart - 1'000'000));
  thread->Append(process.Complete("after_instant", kStart + 1'000'000, kStart + 2'000'000));
  now = kStart + 3'000'000;
  tracer.DrainOnce();
  thread->Append(process.Complete("in_ring", kStart + 3'500'000, kStart + 4'000'000));
  now = kStart + kWakeDelay;
}

TEST_F(RecorderTest, ALateStartTakesItsWindowFromTheRequestedInstant) {
  now_ = kStart - 1'000'000'000;
  auto tracer = NewTracerWith(RecorderOptions());
  FakeProcess process(dir_.path());
  shm::ThreadRing* thread = process.Thread(7, "trainer");
  WriteAroundTheInstant(process, thread, *tracer, now_);

  ASSERT_TRUE(tracer->Prepare(LateWindow(), Config()).ok());
  ASSERT_TRUE(tracer->Start(LateWindow(), Config()).ok());
  EXPECT_EQ(tracer->DataStartNs(LateWindow()), kStart);
  thread->Append(process.Complete("during", kStart + 6'000'000, kStart + 7'000'000));
  ASSERT_TRUE(tracer->Stop(kStop).ok());
  XSpace space;
  TracerStats stats;
  ASSERT_TRUE(tracer->CollectInto(&space, &stats).ok());
  EXPECT_THAT(Names(space), ::testing::ElementsAre("after_instant", "during", "in_ring"));
  EXPECT_EQ(stats.lookback_ns, 0);
  for (const std::string& warning : space.warnings()) ADD_FAILURE() << warning;
}

TEST_F(RecorderTest, ALateStartsLookbackIsMeasuredFromTheRequestedInstant) {
  now_ = kStart - 2'000'000'000;
  auto tracer = NewTracerWith(RecorderOptions());
  FakeProcess process(dir_.path());
  shm::ThreadRing* thread = process.Thread(7, "trainer");
  thread->Append(process.Complete("too_old", kStart - 1'200'000'000, kStart - 1'100'000'000));
  thread->Append(process.Complete("looked_back", kStart - 900'000'000, kStart - 800'000'000));
  WriteAroundTheInstant(process, thread, *tracer, now_);
  TracerStats stats;
  XSpace space;
  ASSERT_TRUE(tracer->Prepare(LateWindow(), LookbackConfig(1'000)).ok());
  ASSERT_TRUE(tracer->Start(LateWindow(), LookbackConfig(1'000)).ok());
  EXPECT_EQ(tracer->DataStartNs(LateWindow()), kStart);
  ASSERT_TRUE(tracer->Stop(kStop).ok());
  ASSERT_TRUE(tracer->CollectInto(&space, &stats).ok());
  EXPECT_THAT(Names(space),
              ::testing::ElementsAre("after_instant", "before_instant", "in_ring", "looked_back"));
  EXPECT_EQ(stats.lookback_ns, 1'000'000'000);
  for (const std::string& warning : space.warnings()) ADD_FAILURE() << warning;
}

TEST_F(RecorderTest, ARecorderStartedAfterTheInstantStartsAtTheWakeUp) {
  now_ = kStart + 500'000;  // the sidecar started just after the requested instant
  auto tracer = NewTracerWith(RecorderOptions());
  FakeProcess process(dir_.path());
  shm::ThreadRing* thread = process.Thread(7, "trainer");
  WriteAroundTheInstant(process, thread, *tracer, now_);
  TracerStats stats;
  XSpace space = CaptureWith(
      *tracer, Config(),
      [&] {
        EXPECT_EQ(tracer->DataStartNs(LateWindow()), kStart + kWakeDelay);
        thread->Append(process.Complete("during", kStart + 6'000'000, kStart + 7'000'000));
      },
      &stats, LateWindow());
  EXPECT_THAT(Names(space), ::testing::ElementsAre("during"));
  for (const std::string& warning : space.warnings()) ADD_FAILURE() << warning;
}

TEST_F(RecorderTest, ACaptureAboveTheRecordersLevelStartsAtTheWakeUp) {
  now_ = kStart - 1'000'000'000;
  auto tracer = NewTracerWith(RecorderOptions());
  FakeProcess process(dir_.path());
  shm::ThreadRing* thread = process.Thread(7, "trainer");
  WriteAroundTheInstant(process, thread, *tracer, now_);
  CaptureConfig verbose = Config();
  verbose.options.set_host_tracer_level(3);  // the recorder kept level 2 only
  TracerStats stats;
  XSpace space = CaptureWith(
      *tracer, verbose, [&] { EXPECT_EQ(tracer->DataStartNs(LateWindow()), kStart + kWakeDelay); },
      &stats, LateWindow());
  EXPECT_THAT(Names(space), ::testing::IsEmpty());
}

TEST_F(RecorderTest, WithoutTheRecorderALateStartBeginsAtTheWakeUp) {
  auto tracer = NewTracer();
  FakeProcess process(dir_.path());
  shm::ThreadRing* thread = process.Thread(7, "trainer");
  thread->Append(process.Complete("after_instant", kStart + 1'000'000, kStart + 2'000'000));
  ASSERT_TRUE(tracer->Start(LateWindow(), Config()).ok());
  EXPECT_EQ(tracer->DataStartNs(LateWindow()), kStart + kWakeDelay);
  thread->Append(process.Complete("during", kStart + 6'000'000, kStart + 7'000'000));
  ASSERT_TRUE(tracer->Stop(kStop).ok());
  XSpace space;
  TracerStats stats;
  ASSERT_TRUE(tracer->CollectInto(&space, &stats).ok());
  EXPECT_THAT(Names(space), ::testing::ElementsAre("during"));
}

TEST_F(RecorderTest, ALookbackReachesOnlyAsFarAsTheRecorderRanAndSaysSo) {
  now_ = kStart - 1'000'000'000;  // the sidecar started one second before the capture
  auto tracer = NewTracerWith(RecorderOptions());
  FakeProcess process(dir_.path());
  process.Thread(7)->Append(process.Complete("early", kStart - 800'000'000, kStart - 700'000'000));
  now_ = kStart;
  TracerStats stats;
  XSpace space = CaptureWith(
      *tracer, LookbackConfig(5'000), [] {}, &stats);
  EXPECT_EQ(stats.lookback_ns, 1'000'000'000);
  EXPECT_THAT(Names(space), ::testing::ElementsAre("early"));
  ASSERT_EQ(space.warnings_size(), 1);
  EXPECT_THAT(space.warnings(0), AllOf(HasSubstr("reaches back 1.0 s"), HasSubstr("5.0 s asked"),
                                       HasSubstr("since the sidecar started")));
}

TEST_F(RecorderTest, TheWindowAndTheMemoryBoundLetTheOldestGo) {
  AnnotationTracer::Options options = RecorderOptions();
  options.recorder_max_bytes = 2 * RecordWindow::kBlockRecords * sizeof(shm::Record);
  auto tracer = NewTracerWith(options);
  FakeProcess process(dir_.path(), /*slots=*/4096);
  shm::ThreadRing* thread = process.Thread(7);
  // 1000 records, one a millisecond, ending at kStart - 1 s.
  for (int i = 0; i < 1000; ++i) {
    const int64_t end = kStart - 2'000'000'000 + int64_t{i} * 1'000'000;
    thread->Append(process.Complete("e", end - 10, end));
  }
  now_ = kStart;
  tracer->DrainOnce();
  AnnotationTracer::RecorderStatus status = tracer->Recorder();
  EXPECT_LE(status.records, 2 * RecordWindow::kBlockRecords) << "the memory bound";
  EXPECT_GT(status.records, 0u);
  EXPECT_GT(status.covered_since_ns, kStart - 2'000'000'000) << "older ones are gone";

  TracerStats stats;
  XSpace space = CaptureWith(
      *tracer, LookbackConfig(10'000), [] {}, &stats);
  EXPECT_EQ(stats.events, status.records);
  EXPECT_LT(stats.lookback_ns, 2'000'000'000);
  ASSERT_EQ(space.warnings_size(), 1);
  EXPECT_THAT(space.warnings(0), HasSubstr("memory bound"));

  // Past the window everything goes.
  now_ = kStart + 60'000'000'000;
  tracer->DrainOnce();
  EXPECT_EQ(tracer->Recorder().records, 0u);
}

TEST_F(RecorderTest, LookbacksTheRecorderCannotServeAreRefusedNamingTheKey) {
  auto tracer = NewTracerWith(RecorderOptions());
  EXPECT_TRUE(tracer->Validate(LookbackConfig(10'000).options).ok());
  absl::Status longer = tracer->Validate(LookbackConfig(10'001).options);
  EXPECT_EQ(longer.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(longer.message(),
              AllOf(HasSubstr("clusterprof_lookback_ms"), HasSubstr("--recorder-window-ms 10000")));
  EXPECT_FALSE(tracer->Validate(LookbackConfig(-1).options).ok());

  auto off = NewTracer();
  absl::Status refused = off->Validate(LookbackConfig(1'000).options);
  EXPECT_THAT(refused.message(), HasSubstr("flight recorder is off"));
  EXPECT_TRUE(off->Validate(LookbackConfig(0).options).ok());
}

TEST_F(RecorderTest, DrainedRecordsFeedTheLiveStepTelemetry) {
  auto telemetry = StepTelemetry::Create({});
  ASSERT_TRUE(telemetry.ok()) << telemetry.status();
  AnnotationTracer::Options options = RecorderOptions();
  options.telemetry = telemetry->get();
  auto tracer = NewTracerWith(options);
  FakeProcess process(dir_.path());
  shm::ThreadRing* thread = process.Thread(7);
  for (int step = 0; step < 3; ++step) {
    const int64_t start = kStart + step * 100'000'000;
    thread->Append(process.Complete("all-reduce", start + 60'000'000, start + 90'000'000));
    thread->Append(
        process.Complete(StrCat("train#step_num=", step, ",_r=1#"), start, start + 100'000'000));
  }
  tracer->DrainOnce();
  StepTelemetry::Snapshot snapshot = (*telemetry)->Get();
  ASSERT_EQ(snapshot.steps.size(), 3u);
  EXPECT_EQ(snapshot.steps[2].step, 2);
  EXPECT_EQ(snapshot.steps[2].duration_ns(), 100'000'000);
  EXPECT_EQ(snapshot.steps[2].collective_entry_ns, kStart + 260'000'000);
  EXPECT_EQ(snapshot.processes, 1);
  EXPECT_EQ(snapshot.processes_with_steps, 1);
}

TEST_F(RecorderTest, RingsOfEndedProcessesStayWhileTheirEventsAreInTheWindow) {
  TempDir empty_proc;
  AnnotationTracer::Options options = RecorderOptions();
  options.recorder_drain_interval_ms = 5;  // the drainer runs here, and closes rings
  auto tracer = NewTracerWith(options, empty_proc.path());
  auto process = std::make_unique<FakeProcess>(dir_.path());
  process->Thread(5)->Append(process->Complete("last_words", kStart - 100, kStart - 50));
  const std::string path = process->path();
  process.reset();
  now_ = kStart;
  for (int i = 0; i < 100; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_TRUE(FileExists(path)) << "its last seconds may still be asked for";
  TracerStats stats;
  XSpace space = CaptureWith(
      *tracer, LookbackConfig(1'000), [] {}, &stats);
  EXPECT_THAT(Names(space), ::testing::ElementsAre("last_words"));
  now_ = kStart + 60'000'000'000;  // past the window
  for (int i = 0; i < 1000 && FileExists(path); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(FileExists(path));
}

}  // namespace
}  // namespace clusterprof::sidecar
