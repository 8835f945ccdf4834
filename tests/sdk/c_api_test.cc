// The C ABI (clusterprof_annotate.h) over the SDK, drained as the sidecar drains it. Linked with
// the ABI's code directly so that each test can point the SDK at a fresh directory.
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/annotate.h"
#include "sdk/clusterprof_annotate.h"
#include "sdk/control_page.h"
#include "tests/sdk/drained_event.h"
#include "tests/support/temp_dir.h"

namespace clusterprof {
namespace {

using testing::DrainedEvent;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

int Record(std::string_view name, int64_t start_ns, int64_t end_ns, int level) {
  return clusterprof_record_complete(name.data(), name.size(), start_ns, end_ns, level);
}

class CApiTest : public ::testing::Test {
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

  std::vector<DrainedEvent> Drain() { return testing::DrainEvents(dir_.path()); }

  testing::TempDir dir_;
  std::unique_ptr<shm::ControlWriter> control_;
};

TEST_F(CApiTest, AbiVersionIsTheHeaders) {
  EXPECT_EQ(clusterprof_abi_version(), CLUSTERPROF_ABI_VERSION);
  EXPECT_EQ(sizeof(clusterprof_trace_t), 128u) << "part of the ABI: never changes";
}

TEST_F(CApiTest, NothingIsRecordedWithoutASidecar) {
  // The first call already knows: no control page, so tracing is off.
  EXPECT_EQ(clusterprof_tracing_enabled(CLUSTERPROF_LEVEL_CRITICAL), 0);
  EXPECT_EQ(Record("train", 1, 2, CLUSTERPROF_LEVEL_CRITICAL), 0);
  clusterprof_trace_t trace;
  EXPECT_EQ(clusterprof_trace_begin(&trace, "t", 1, CLUSTERPROF_LEVEL_CRITICAL), 0);
  EXPECT_EQ(clusterprof_trace_end(&trace), 0);
  EXPECT_EQ(clusterprof_async_begin("a", 1, 1, CLUSTERPROF_LEVEL_CRITICAL), 0);
  EXPECT_EQ(clusterprof_async_end(1, CLUSTERPROF_LEVEL_CRITICAL), 0);
  EXPECT_EQ(clusterprof_attached(), 0);
  char path[8] = "x";
  EXPECT_EQ(clusterprof_ring_path(path, sizeof(path)), 0u);
  EXPECT_STREQ(path, "");
  EXPECT_TRUE(testing::ListFilesRecursively(dir_.path()).empty()) << "no ring file is created";
}

TEST_F(CApiTest, NothingIsRecordedWhileDisarmed) {
  Arm(kAnnotationLevelInfo);
  EXPECT_EQ(Record("warm", 1, 2, CLUSTERPROF_LEVEL_INFO), 1);
  Drain();
  control_->Disarm();
  EXPECT_EQ(clusterprof_tracing_enabled(CLUSTERPROF_LEVEL_CRITICAL), 0);
  EXPECT_EQ(Record("train", 1, 2, CLUSTERPROF_LEVEL_CRITICAL), 0);
  clusterprof_trace_t trace;
  EXPECT_EQ(clusterprof_trace_begin(&trace, "t", 1, CLUSTERPROF_LEVEL_CRITICAL), 0);
  EXPECT_EQ(clusterprof_trace_end(&trace), 0);
  EXPECT_EQ(clusterprof_async_begin("a", 1, 1, CLUSTERPROF_LEVEL_CRITICAL), 0);
  EXPECT_EQ(clusterprof_async_end(1, CLUSTERPROF_LEVEL_CRITICAL), 0);
  EXPECT_EQ(clusterprof_attached(), 1);
  EXPECT_THAT(Drain(), IsEmpty());
}

TEST_F(CApiTest, RecordCompleteKeepsTheCallersTimes) {
  Arm(kAnnotationLevelInfo);
  EXPECT_EQ(clusterprof_tracing_enabled(CLUSTERPROF_LEVEL_INFO), 1);
  const int64_t start = clusterprof_now_ns();
  EXPECT_EQ(Record("train#step_num=7,_r=1#", start, start + 1234, CLUSTERPROF_LEVEL_CRITICAL), 1);
  const auto seen = Drain();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].kind, shm::RecordKind::kComplete);
  EXPECT_EQ(seen[0].start_ns, start);
  EXPECT_EQ(seen[0].end_ns, start + 1234);
  // Integer pairs travel inline, as the C++ Trace's args do: the name stays one string.
  EXPECT_EQ(seen[0].name, "train");
  EXPECT_THAT(seen[0].args, ElementsAre("step_num=i:7", "_r=i:1"));
}

// How names are split, and that the sidecar decodes the same stats either way.
TEST_F(CApiTest, IntegerPairsMoveInlineWithoutChangingWhatIsDecoded) {
  Arm(kAnnotationLevelInfo);
  struct Case {
    std::string encoded;
    std::string name;               // as recorded
    std::vector<std::string> args;  // inline
  };
  const std::vector<Case> cases = {
      {"plain", "plain", {}},
      {"train#step_num=7#", "train", {"step_num=i:7"}},
      {"train#a=1,b=2,c=3#", "train#c=3#", {"a=i:1", "b=i:2"}},
      {"train#a=-5,b=18446744073709551615#", "train#b=18446744073709551615#", {"a=i:-5"}},
      {"train#a=007,b=x,c=2#", "train#b=x,c=2#", {"a=i:7"}},
      {"train#a=1,#", "train", {"a=i:1"}},
      {"train#a=1,b=\"x,y\",c=[1,2]#", "train#b=\"x,y\",c=[1,2]#", {"a=i:1"}},
      // Left whole: the first pair is not a plain integer, or the shape is not `base#pairs#`.
      {"train#a=x,b=2#", "train#a=x,b=2#", {}},
      {"train#a=1.5#", "train#a=1.5#", {}},
      {"train#a=+1#", "train#a=+1#", {}},
      {"train#a= 1#", "train#a= 1#", {}},
      {"train#a =1#", "train#a =1#", {}},
      {"train#=1#", "train#=1#", {}},
      {"train#a=#", "train#a=#", {}},
      {"train#a=-#", "train#a=-#", {}},
      {"train#a=99999999999999999999#", "train#a=99999999999999999999#", {}},
      {"#a=1#", "#a=1#", {}},
      {"train#a=1#b#", "train#a=1#b#", {}},
      {"train#a=1", "train#a=1", {}},
      {"train#", "train#", {}},
      {"a#b", "a#b", {}},
  };
  for (const Case& c : cases) {
    ASSERT_EQ(Record(c.encoded, 10, 20, CLUSTERPROF_LEVEL_INFO), 1) << c.encoded;
  }
  const auto seen = Drain();
  ASSERT_EQ(seen.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].encoded);
    EXPECT_EQ(seen[i].name, cases[i].name);
    EXPECT_EQ(seen[i].args, cases[i].args);
    const DrainedEvent original{.name = cases[i].encoded};
    EXPECT_EQ(seen[i].BaseName(), original.BaseName());
    EXPECT_EQ(seen[i].Stats(), original.Stats());
  }
}

TEST_F(CApiTest, ScopedTrace) {
  Arm(kAnnotationLevelInfo);
  const std::string name = "step#phase=warmup,k=1#";
  const int64_t before = clusterprof_now_ns();
  clusterprof_trace_t trace;
  ASSERT_EQ(clusterprof_trace_begin(&trace, name.data(), name.size(), CLUSTERPROF_LEVEL_INFO), 1);
  clusterprof_trace_t inner;
  ASSERT_EQ(clusterprof_trace_begin(&inner, "op#i=3,j=4,k=5#", 15, CLUSTERPROF_LEVEL_INFO), 1);
  EXPECT_EQ(clusterprof_trace_end(&inner), 1);
  EXPECT_EQ(clusterprof_trace_end(&trace), 1);
  EXPECT_EQ(clusterprof_trace_end(&trace), 0) << "a trace is recorded once";
  const int64_t after = clusterprof_now_ns();
  const auto seen = Drain();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].name, "op#k=5#");
  EXPECT_THAT(seen[0].args, ElementsAre("i=i:3", "j=i:4"));
  EXPECT_EQ(seen[1].name, "step#phase=warmup,k=1#");
  EXPECT_THAT(seen[1].args, IsEmpty());
  // Nested scopes: the outer one opens first and closes last, between the two clock reads.
  EXPECT_LE(before, seen[1].start_ns);
  EXPECT_LE(seen[1].start_ns, seen[0].start_ns);
  EXPECT_LE(seen[0].start_ns, seen[0].end_ns);
  EXPECT_LE(seen[0].end_ns, seen[1].end_ns);
  EXPECT_LE(seen[1].end_ns, after);
}

TEST_F(CApiTest, LevelsFilter) {
  Arm(kAnnotationLevelCritical);
  EXPECT_EQ(clusterprof_tracing_enabled(CLUSTERPROF_LEVEL_CRITICAL), 1);
  EXPECT_EQ(clusterprof_tracing_enabled(CLUSTERPROF_LEVEL_INFO), 0);
  EXPECT_EQ(clusterprof_tracing_enabled(0), 1) << "levels below 1 count as 1";
  EXPECT_EQ(Record("info", 1, 2, CLUSTERPROF_LEVEL_INFO), 0);
  EXPECT_EQ(Record("critical", 1, 2, CLUSTERPROF_LEVEL_CRITICAL), 1);
  EXPECT_EQ(Record("zero", 1, 2, 0), 1);
  control_->Disarm();
  EXPECT_EQ(clusterprof_tracing_enabled(0), 0) << "level 0 is not recorded while disarmed";
  EXPECT_EQ(Record("zero_off", 1, 2, 0), 0);
  EXPECT_EQ(Record("negative_off", 1, 2, -1), 0);
  const auto seen = Drain();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].name, "critical");
  EXPECT_EQ(seen[1].name, "zero");
}

TEST_F(CApiTest, ThreadNamesAndAsyncEventsAcrossThreads) {
  Arm(kAnnotationLevelInfo);
  clusterprof_set_thread_name("trainer", 7);
  std::thread loader([] {
    clusterprof_set_thread_name("data_loader", 11);
    EXPECT_EQ(clusterprof_record_complete("fetch#batch=3#", 14, 100, 200, CLUSTERPROF_LEVEL_INFO),
              1);
    EXPECT_EQ(clusterprof_async_begin("prefetch", 8, 99, CLUSTERPROF_LEVEL_INFO), 1);
  });
  loader.join();
  EXPECT_EQ(clusterprof_async_end(99, CLUSTERPROF_LEVEL_INFO), 1);
  const auto seen = Drain();
  ASSERT_EQ(seen.size(), 3u);
  int matched = 0;
  for (const DrainedEvent& e : seen) {
    if (e.kind == shm::RecordKind::kComplete) {
      EXPECT_EQ(e.name, "fetch");
      EXPECT_THAT(e.args, ElementsAre("batch=i:3"));
      EXPECT_EQ(e.thread, "data_loader");
      ++matched;
    } else if (e.kind == shm::RecordKind::kAsyncBegin) {
      EXPECT_EQ(e.name, "prefetch");
      EXPECT_EQ(e.async_id, 99u);
      EXPECT_EQ(e.thread, "data_loader");
      EXPECT_EQ(e.start_ns, e.end_ns);
      ++matched;
    } else if (e.kind == shm::RecordKind::kAsyncEnd) {
      EXPECT_EQ(e.async_id, 99u);
      EXPECT_EQ(e.thread, "trainer") << "named before the thread's ring existed";
      ++matched;
    }
  }
  EXPECT_EQ(matched, 3);
}

TEST_F(CApiTest, Stats) {
  Arm(kAnnotationLevelInfo);
  EXPECT_EQ(Record("x", 1, 2, CLUSTERPROF_LEVEL_INFO), 1);
  EXPECT_EQ(clusterprof_attached(), 1);
  EXPECT_EQ(clusterprof_dropped_strings(), 0u);
  const size_t size = clusterprof_ring_path(nullptr, 0);
  std::string path(size, '\0');
  ASSERT_EQ(clusterprof_ring_path(path.data(), size + 1), size);
  EXPECT_EQ(path, GetAnnotationStats().ring_path);
  EXPECT_TRUE(testing::FileExists(path));
  char truncated[5];
  EXPECT_EQ(clusterprof_ring_path(truncated, sizeof(truncated)), size);
  EXPECT_EQ(std::string(truncated), path.substr(0, 4));
}

TEST_F(CApiTest, NullAndEmptyArgumentsAreHarmless) {
  Arm(kAnnotationLevelInfo);
  EXPECT_EQ(clusterprof_record_complete(nullptr, 0, 1, 2, CLUSTERPROF_LEVEL_INFO), 1);
  EXPECT_EQ(clusterprof_trace_begin(nullptr, "x", 1, CLUSTERPROF_LEVEL_INFO), 0);
  EXPECT_EQ(clusterprof_trace_end(nullptr), 0);
  clusterprof_set_thread_name(nullptr, 0);
  EXPECT_EQ(clusterprof_async_begin(nullptr, 0, 5, CLUSTERPROF_LEVEL_INFO), 1);
  const auto seen = Drain();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].name, "");
  EXPECT_EQ(seen[1].async_id, 5u);
}

}  // namespace
}  // namespace clusterprof
