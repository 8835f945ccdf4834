#include "sdk/annotate.h"

#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <bit>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/control_page.h"
#include "sidecar/tracers/ring_reader.h"
#include "tests/support/temp_dir.h"

namespace clusterprof {
namespace {

using ::testing::ElementsAre;

struct Seen {
  std::string name;
  std::string thread;
  shm::RecordKind kind;
  uint64_t async_id;
  std::vector<std::string> args;  // "key=type:value"
  int64_t start_ns;
  int64_t end_ns;
};

int64_t WallNs() {
  timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  return now.tv_sec * 1'000'000'000LL + now.tv_nsec;
}

// Waits until the SDK's poller has calibrated the TSC, which the inline path needs to take its
// timestamps from it; false where the kernel's clocksource is not the TSC (it never is then).
bool WaitForTscCalibration() {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (annotate_internal::g_tsc.ns_per_tick_q32.load() == 0) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

class AnnotateTest : public ::testing::Test {
 protected:
  void SetUp() override { annotate_internal::ResetForTesting(dir_.path()); }

  void Arm(uint32_t level) {
    if (control_ == nullptr) {
      std::string error;
      control_ = shm::ControlWriter::Create(dir_.path(), &error);
      ASSERT_NE(control_, nullptr) << error;
    }
    control_->ArmHost(level, 0, 0);
  }

  std::vector<Seen> Drain() { return Drain(dir_.path()); }
  std::vector<Seen> Drain(const std::string& dir) {
    std::vector<Seen> seen;
    auto files = shm::ListRingFiles(dir);
    if (!files.ok()) return seen;
    for (const std::string& file : *files) {
      auto reader = shm::RingReader::Open(file);
      EXPECT_TRUE(reader.ok()) << reader.status();
      if (!reader.ok()) continue;
      (*reader)->Drain([&](const shm::ThreadInfo& thread, const shm::Record& r) {
        Seen s{std::string((*reader)->String(r.name_id)),
               std::string(thread.name),
               r.kind,
               r.async_id,
               {},
               r.start_ns,
               r.end_ns};
        for (int i = 0; i < r.num_args; ++i) {
          const shm::Arg& a = r.args[i];
          std::string value;
          switch (a.type) {
            case shm::ArgType::kInt64:
              value = "i:" + std::to_string(static_cast<int64_t>(a.value));
              break;
            case shm::ArgType::kUint64:
              value = "u:" + std::to_string(a.value);
              break;
            case shm::ArgType::kDouble:
              value = "d:" + std::to_string(std::bit_cast<double>(a.value));
              break;
            case shm::ArgType::kString:
              value = "s:" + std::string((*reader)->String(static_cast<uint32_t>(a.value)));
              break;
            default:
              value = "?";
          }
          s.args.push_back(std::string((*reader)->String(a.key_id)) + "=" + value);
        }
        seen.push_back(std::move(s));
      });
    }
    return seen;
  }

  testing::TempDir dir_;
  std::unique_ptr<shm::ControlWriter> control_;
};

TEST_F(AnnotateTest, NothingIsRecordedWithoutASidecar) {
  { Trace trace("train"); }
  { Trace trace("train"); }
  EXPECT_FALSE(TracingEnabled());
  EXPECT_TRUE(testing::ListFilesRecursively(dir_.path()).empty()) << "no ring file is created";
}

TEST_F(AnnotateTest, NothingIsRecordedWhileDisarmed) {
  Arm(0);
  { Trace trace("train"); }
  EXPECT_TRUE(Drain().empty());
}

TEST_F(AnnotateTest, ScopedEventWithInlineArgs) {
  Arm(kAnnotationLevelInfo);
  const int64_t before = annotate_internal::NowNs();
  { Trace trace("train", {{"step_num", 7}, {"loss", 0.5}}); }
  const auto seen = Drain();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].name, "train");
  EXPECT_EQ(seen[0].kind, shm::RecordKind::kComplete);
  EXPECT_THAT(seen[0].args, ElementsAre("step_num=i:7", "loss=d:0.500000"));
  EXPECT_TRUE(GetAnnotationStats().attached);
  EXPECT_FALSE(GetAnnotationStats().ring_path.empty());
  (void)before;
}

TEST_F(AnnotateTest, LevelsFilter) {
  Arm(kAnnotationLevelCritical);
  { Trace info("info_level"); }
  { Trace critical("critical_level", kAnnotationLevelCritical); }
  const auto seen = Drain();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].name, "critical_level");
}

TEST_F(AnnotateTest, ExtraMetadataRidesInTheName) {
  Arm(kAnnotationLevelInfo);
  {
    Trace trace("train", {{"a", 1}, {"b", 2u}, {"c", "x#y"}});
    trace.SetMetadata({{"in_cache", true}});
  }
  {
    Trace trace("step");
    trace.SetMetadata({{"k", 1}});
    trace.SetMetadata({{"j", 2}});
  }
  const auto seen = Drain();
  ASSERT_EQ(seen.size(), 2u);
  // The first two args travel inline; the rest, and set_metadata's, ride in the name. The
  // sidecar's annotation tracer decodes both into the event's stats.
  EXPECT_EQ(seen[0].name, "train#c=x_y,in_cache=1#");
  EXPECT_THAT(seen[0].args, ElementsAre("a=i:1", "b=u:2"));
  EXPECT_EQ(seen[1].name, "step#k=1,j=2#");
}

TEST_F(AnnotateTest, ThreadNamesAndAsyncEventsAcrossThreads) {
  Arm(kAnnotationLevelInfo);
  std::thread producer([] {
    SetThreadName("data_loader");
    Trace trace("fetch", {{"batch", "images"}});
    AsyncBegin("prefetch", 99);
  });
  producer.join();
  AsyncEnd(99);
  const auto seen = Drain();
  ASSERT_EQ(seen.size(), 3u);
  int matched = 0;
  for (const Seen& s : seen) {
    if (s.name == "fetch") {
      EXPECT_EQ(s.thread, "data_loader");
      EXPECT_THAT(s.args, ElementsAre("batch=s:images"));
      ++matched;
    }
    if (s.kind == shm::RecordKind::kAsyncBegin) {
      EXPECT_EQ(s.name, "prefetch");
      EXPECT_EQ(s.async_id, 99u);
      ++matched;
    }
    if (s.kind == shm::RecordKind::kAsyncEnd) {
      EXPECT_EQ(s.async_id, 99u);
      ++matched;
    }
  }
  EXPECT_EQ(matched, 3);
}

TEST_F(AnnotateTest, ManyThreadsRecordConcurrently) {
  Arm(kAnnotationLevelInfo);
  constexpr int kThreads = 8;
  constexpr int kEvents = 1000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([] {
      for (int i = 0; i < kEvents; ++i) Trace trace("op", {{"i", i}});
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(Drain().size(), size_t{kThreads} * kEvents);
}

TEST_F(AnnotateTest, RemovedControlFileTurnsRecordingOff) {
  Arm(kAnnotationLevelInfo);
  { Trace trace("armed"); }
  ASSERT_EQ(Drain().size(), 1u);
  // The sidecar went away while armed: its control file is gone. After the SDK's next look
  // (it polls every 200 ms), nothing is recorded.
  ASSERT_EQ(unlink((dir_.path() + "/control").c_str()), 0);
  while (TracingEnabled()) std::this_thread::yield();
  { Trace trace("after"); }
  EXPECT_TRUE(Drain().empty());
}

TEST_F(AnnotateTest, AForkedChildWritesARingOfItsOwn) {
  Arm(2);
  { Trace parent("parent_before_fork"); }
  std::optional<Trace> spanning;
  spanning.emplace("spans_the_fork");
  const pid_t child = fork();
  if (child == 0) {
    spanning.reset();  // begun in the parent: not written into the parent's ring from here
    { Trace trace("child_event"); }
    _exit(GetAnnotationStats().ring_path.empty() ? 1 : 0);
  }
  ASSERT_GT(child, 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child had a ring";
  spanning.reset();

  auto files = shm::ListRingFiles(dir_.path());
  ASSERT_TRUE(files.ok());
  ASSERT_EQ(files->size(), 2u) << "one ring per process";
  std::map<uint32_t, std::vector<std::string>> by_pid;
  for (const std::string& file : *files) {
    auto reader = shm::RingReader::Open(file);
    ASSERT_TRUE(reader.ok());
    (*reader)->Drain([&](const shm::ThreadInfo&, const shm::Record& r) {
      by_pid[(*reader)->pid()].push_back(std::string((*reader)->String(r.name_id)));
    });
  }
  EXPECT_THAT(by_pid[getpid()], ElementsAre("parent_before_fork", "spans_the_fork"));
  EXPECT_THAT(by_pid[child], ElementsAre("child_event"));
}

TEST_F(AnnotateTest, TimestampsFollowTheWallClock) {
  Arm(2);
  { Trace warm("warm_up"); }  // sets the SDK up (ring file and all) before the timed events
  // Long enough for the poller to calibrate the TSC where it is used.
  std::vector<int64_t> wall_starts;
  for (int i = 0; i < 3; ++i) {
    timespec before;
    clock_gettime(CLOCK_REALTIME, &before);
    wall_starts.push_back(before.tv_sec * 1'000'000'000LL + before.tv_nsec);
    { Trace trace("timed"); }
    timespec after;
    clock_gettime(CLOCK_REALTIME, &after);
    const int64_t before_ns = before.tv_sec * 1'000'000'000LL + before.tv_nsec;
    const int64_t after_ns = after.tv_sec * 1'000'000'000LL + after.tv_nsec;
    const int64_t now = annotate_internal::NowNs();
    // Generous bounds: the point is the clock and its scale, not precision.
    EXPECT_GT(now, after_ns - 1'000'000);
    EXPECT_LT(now, after_ns + 1'000'000'000);
    EXPECT_GE(after_ns, before_ns);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  std::vector<int64_t> starts;
  auto files = shm::ListRingFiles(dir_.path());
  ASSERT_TRUE(files.ok());
  for (const std::string& file : *files) {
    auto reader = shm::RingReader::Open(file);
    ASSERT_TRUE(reader.ok());
    (*reader)->Drain([&](const shm::ThreadInfo&, const shm::Record& r) {
      EXPECT_LE(r.start_ns, r.end_ns);
      if ((*reader)->String(r.name_id) == "timed") starts.push_back(r.start_ns);
    });
  }
  ASSERT_EQ(starts.size(), 3u);
  // The intervals between events, on the SDK's clock (TSC-derived after the first calibration),
  // agree with the system clock's: the scale is right, not only the offset.
  for (size_t i = 1; i < starts.size(); ++i) {
    const int64_t sdk = starts[i] - starts[i - 1];
    const int64_t wall = wall_starts[i] - wall_starts[i - 1];
    EXPECT_NEAR(static_cast<double>(sdk), static_cast<double>(wall), 5e6 + 0.01 * wall)
        << "event " << i;
  }
}

std::vector<std::string> NamesOf(const std::vector<Seen>& seen) {
  std::vector<std::string> names;
  for (const Seen& s : seen) names.push_back(s.name);
  return names;
}

// The name cache is keyed by where a name's text lives; a buffer reused for other text of the
// same size must not be recorded under the name it held before. Both ways in: a std::string
// (looked up out of line) and a view of a known size (looked up inline), short and long.
TEST_F(AnnotateTest, AReusedBufferIsRecordedWithTheTextItHoldsNow) {
  Arm(kAnnotationLevelInfo);
  std::string name = "first_name";
  { Trace trace(name); }
  name.replace(0, name.size(), "other_name");
  { Trace trace(name); }
  char buffer[] = "aaaa";
  { Trace trace(std::string_view(buffer, 4)); }
  std::memcpy(buffer, "bbbb", 4);
  { Trace trace(std::string_view(buffer, 4)); }
  std::string long_name(80, 'x');
  { Trace trace(long_name); }
  long_name.replace(0, long_name.size(), std::string(80, 'y'));
  { Trace trace(long_name); }
  std::string value = "value_one";
  { Trace trace("with_value", {{"v", value}}); }
  value.replace(0, value.size(), "value_two");
  { Trace trace("with_value", {{"v", value}}); }
  const auto seen = Drain();
  EXPECT_THAT(NamesOf(seen),
              ElementsAre("first_name", "other_name", "aaaa", "bbbb", std::string(80, 'x'),
                          std::string(80, 'y'), "with_value", "with_value"));
  ASSERT_EQ(seen.size(), 8u);
  EXPECT_THAT(seen[6].args, ElementsAre("v=s:value_one"));
  EXPECT_THAT(seen[7].args, ElementsAre("v=s:value_two"));
}

// Events on the inline path (TSC readings converted at the end) carry wall-clock times and
// their real durations, with args, metadata, or neither.
TEST_F(AnnotateTest, InlineEventsKeepWallClockTimesAndDurations) {
  Arm(kAnnotationLevelInfo);
  { Trace warm("warm_up"); }  // sets the thread's ring up; starts the poller
  const bool tsc = WaitForTscCalibration();
  if (!tsc) std::printf("the clocksource is not the TSC: clock_gettime timestamps tested\n");
  constexpr auto kSleep = std::chrono::milliseconds(20);
  const int64_t before = WallNs();
  {
    Trace trace("plain");
    std::this_thread::sleep_for(kSleep);
  }
  {
    Trace trace("with_args", {{"step_num", 3}, {"_r", 1}});
    std::this_thread::sleep_for(kSleep);
  }
  {
    Trace trace("with_metadata");
    std::this_thread::sleep_for(kSleep);
    trace.SetMetadata({{"loss", 2}});
  }
  const int64_t after = WallNs();
  const auto seen = Drain();
  EXPECT_THAT(NamesOf(seen), ElementsAre("warm_up", "plain", "with_args", "with_metadata#loss=2#"));
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_THAT(seen[2].args, ElementsAre("step_num=i:3", "_r=i:1"));
  int64_t previous_end = before - 1'000'000;
  for (size_t i = 1; i < seen.size(); ++i) {
    const Seen& s = seen[i];
    // 1 ms of slack either way for the calibration; the durations are the point.
    EXPECT_GE(s.start_ns, previous_end - 1'000'000) << s.name;
    EXPECT_LE(s.end_ns, after + 1'000'000) << s.name;
    EXPECT_GE(s.end_ns - s.start_ns, 19'000'000) << s.name;
    EXPECT_LT(s.end_ns - s.start_ns, 1'000'000'000) << s.name;
    previous_end = s.end_ns;
  }
}

// Records appended inline (scoped events) and out of line (async events) go into one ring, in
// the order they were written.
TEST_F(AnnotateTest, InlineAndOutOfLineRecordsShareTheThreadsRing) {
  Arm(kAnnotationLevelInfo);
  {
    Trace outer("outer");
    AsyncBegin("async", 5);
    { Trace inner("inner"); }
    AsyncEnd(5);
  }
  { Trace after("after"); }
  const auto seen = Drain();
  ASSERT_EQ(seen.size(), 5u);
  EXPECT_EQ(seen[0].kind, shm::RecordKind::kAsyncBegin);
  EXPECT_EQ(seen[1].name, "inner");
  EXPECT_EQ(seen[2].kind, shm::RecordKind::kAsyncEnd);
  EXPECT_EQ(seen[3].name, "outer");
  EXPECT_EQ(seen[4].name, "after");
}

// A forked child's ring file has a string table of its own: the names its thread had cached in
// the parent are interned again there, not taken from the copy of the parent's cache.
TEST_F(AnnotateTest, AForkedChildInternsItsNamesInItsOwnRing) {
  Arm(kAnnotationLevelInfo);
  { Trace trace("cached_in_parent", {{"key", 1}}); }
  const pid_t child = fork();
  if (child == 0) {
    { Trace trace("child_first"); }
    { Trace trace("cached_in_parent", {{"key", 2}}); }
    _exit(0);
  }
  ASSERT_GT(child, 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  std::map<uint32_t, std::vector<std::string>> by_pid;
  auto files = shm::ListRingFiles(dir_.path());
  ASSERT_TRUE(files.ok());
  for (const std::string& file : *files) {
    auto reader = shm::RingReader::Open(file);
    ASSERT_TRUE(reader.ok());
    (*reader)->Drain([&](const shm::ThreadInfo&, const shm::Record& r) {
      std::string event((*reader)->String(r.name_id));
      for (int i = 0; i < r.num_args; ++i) {
        event += " " + std::string((*reader)->String(r.args[i].key_id)) + "=" +
                 std::to_string(static_cast<int64_t>(r.args[i].value));
      }
      by_pid[(*reader)->pid()].push_back(event);
    });
  }
  EXPECT_THAT(by_pid[getpid()], ElementsAre("cached_in_parent key=1"));
  EXPECT_THAT(by_pid[child], ElementsAre("child_first", "cached_in_parent key=2"));
}

// Threads beyond the ring's slots record nothing, and do not disturb the others.
TEST_F(AnnotateTest, ThreadsBeyondTheSlotsRecordNothing) {
  Arm(kAnnotationLevelInfo);
  { Trace trace("main"); }
  constexpr int kThreads = static_cast<int>(shm::kDefaultMaxThreads) + 6;
  for (int i = 0; i < kThreads; ++i) {
    std::thread([] {
      for (int j = 0; j < 3; ++j) Trace trace("op");
    }).join();
  }
  { Trace trace("main_again"); }
  const auto seen = Drain();
  EXPECT_EQ(seen.size(), size_t{3} * (shm::kDefaultMaxThreads - 1) + 2);
  auto files = shm::ListRingFiles(dir_.path());
  ASSERT_TRUE(files.ok() && files->size() == 1u);
  auto reader = shm::RingReader::Open(files->front());
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->dropped_threads(), 7u);
}

// A full ring drops the records that do not fit and counts them; once the sidecar has drained
// it, the thread's records are kept again.
TEST_F(AnnotateTest, AFullRingDropsAndCountsThenRecordsAgainOnceDrained) {
  ASSERT_EQ(setenv(shm::kRingEventsEnv, "1024", 1), 0);
  Arm(kAnnotationLevelInfo);
  for (int i = 0; i < 1030; ++i) Trace trace("op");
  ASSERT_EQ(unsetenv(shm::kRingEventsEnv), 0);
  auto files = shm::ListRingFiles(dir_.path());
  ASSERT_TRUE(files.ok() && files->size() == 1u);
  auto reader = shm::RingReader::Open(files->front());
  ASSERT_TRUE(reader.ok());
  uint64_t drained = 0;
  auto count = [&](const shm::ThreadInfo&, const shm::Record&) { ++drained; };
  shm::DrainStats stats = (*reader)->Drain(count);
  EXPECT_EQ(drained, 1024u);
  EXPECT_EQ(stats.dropped, 6u);
  for (int i = 0; i < 1000; ++i) Trace trace("op");
  drained = 0;
  stats = (*reader)->Drain(count);
  EXPECT_EQ(drained, 1000u);
  EXPECT_EQ(stats.dropped, 0u);
}

}  // namespace
}  // namespace clusterprof
