#include "sidecar/sdk/annotate.h"

#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <bit>
#include <chrono>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sidecar/sdk/control_page.h"
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
};

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

  std::vector<Seen> Drain() {
    std::vector<Seen> seen;
    auto files = shm::ListRingFiles(dir_.path());
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
               {}};
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

}  // namespace
}  // namespace clusterprof
