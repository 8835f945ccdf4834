#include "sidecar/tracers/step_telemetry.h"

#include <memory>
#include <string>

#include "common/base/strings.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/ring_writer.h"
#include "sidecar/tracers/ring_reader.h"
#include "tests/support/temp_dir.h"

namespace clusterprof::sidecar {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kT0 = 1'700'000'000'000'000'000;

// One workload process: a ring it writes and the sidecar's reader of it.
class Process {
 public:
  Process(const std::string& dir, std::string_view name) {
    shm::RingOptions options;
    options.process_name = std::string(name);
    options.slots_per_thread = 1024;
    options.max_threads = 4;
    std::string error;
    writer_ = shm::RingWriter::Create(dir, options, &error);
    EXPECT_NE(writer_, nullptr) << error;
    thread_ = writer_->ClaimThread(1);
    auto reader = shm::RingReader::Open(writer_->path());
    EXPECT_TRUE(reader.ok()) << reader.status();
    reader_ = std::move(*reader);
  }
  void Event(std::string_view name, int64_t start, int64_t end) {
    shm::Record record{};
    record.kind = shm::RecordKind::kComplete;
    record.name_id = writer_->Intern(name);
    record.start_ns = start;
    record.end_ns = end;
    thread_->Append(record);
  }
  // A step marked as clusterprof::Trace("train", {{"step_num", n}}) marks it: an inline arg.
  void StepWithArg(int64_t step, int64_t start, int64_t end) {
    shm::Record record{};
    record.kind = shm::RecordKind::kComplete;
    record.name_id = writer_->Intern("train");
    record.num_args = 1;
    record.args[0].key_id = writer_->Intern("step_num");
    record.args[0].type = shm::ArgType::kInt64;
    record.args[0].value = static_cast<uint64_t>(step);
    record.start_ns = start;
    record.end_ns = end;
    thread_->Append(record);
  }
  // Drains into `telemetry`, as the annotation tracer's drainer does.
  void DrainInto(StepTelemetry& telemetry) {
    reader_->DrainSpans([&](const shm::ThreadInfo&, std::span<const shm::Record> records) {
      telemetry.Observe(names_, *reader_, records);
    });
  }
  bool saw_step() const { return names_.saw_step; }

 private:
  std::unique_ptr<shm::RingWriter> writer_;
  shm::ThreadRing* thread_ = nullptr;
  std::unique_ptr<shm::RingReader> reader_;
  StepTelemetry::RingNames names_;
};

std::unique_ptr<StepTelemetry> NewTelemetry(StepTelemetry::Options options = {}) {
  auto telemetry = StepTelemetry::Create(std::move(options));
  EXPECT_TRUE(telemetry.ok()) << telemetry.status();
  return std::move(*telemetry);
}

TEST(StepTelemetryTest, StepsFromTraceMeNamesAndInlineArgsWithTheirFirstCollective) {
  clusterprof::testing::TempDir dir;
  auto telemetry = NewTelemetry();
  Process process(dir.path(), "trainer");
  // Step 0 by name, step 1 by inline arg; each with a collective inside, and one outside.
  process.Event("forward", kT0, kT0 + 40 * kMs);
  process.Event("ncclDevKernel_AllReduce", kT0 + 50 * kMs, kT0 + 90 * kMs);
  process.Event("train#step_num=0,_r=1#", kT0, kT0 + 100 * kMs);
  process.Event("all_reduce_grads", kT0 + 170 * kMs, kT0 + 190 * kMs);
  process.Event("all-gather", kT0 + 180 * kMs, kT0 + 195 * kMs);
  process.StepWithArg(1, kT0 + 100 * kMs, kT0 + 200 * kMs);
  process.Event("all-reduce", kT0 + 250 * kMs, kT0 + 260 * kMs);  // between steps: no step
  process.DrainInto(*telemetry);
  telemetry->EndDrain(1, process.saw_step() ? 1 : 0);

  StepTelemetry::Snapshot snapshot = telemetry->Get();
  ASSERT_EQ(snapshot.steps.size(), 2u);
  EXPECT_EQ(snapshot.steps[0].step, 0);
  EXPECT_EQ(snapshot.steps[0].start_ns, kT0);
  EXPECT_EQ(snapshot.steps[0].end_ns, kT0 + 100 * kMs);
  EXPECT_EQ(snapshot.steps[0].collective_entry_ns, kT0 + 50 * kMs);
  EXPECT_EQ(snapshot.steps[1].step, 1);
  EXPECT_EQ(snapshot.steps[1].collective_entry_ns, kT0 + 170 * kMs);
  EXPECT_EQ(snapshot.steps_total, 2u);
  EXPECT_EQ(snapshot.last_step_end_ns, kT0 + 200 * kMs);
  EXPECT_EQ(snapshot.processes_with_steps, 1);
  EXPECT_THAT(snapshot.step_source, HasSubstr("step_num"));
  // Readers ask for what they have not seen.
  EXPECT_EQ(telemetry->Get(0).steps.size(), 1u);
  EXPECT_EQ(telemetry->Get(-1, 1).steps.at(0).step, 1);
}

TEST(StepTelemetryTest, ACollectiveDrainedBeforeItsStepMarkerStillCounts) {
  clusterprof::testing::TempDir dir;
  auto telemetry = NewTelemetry();
  Process process(dir.path(), "trainer");
  process.Event("allreduce", kT0 + 70 * kMs, kT0 + 90 * kMs);
  process.DrainInto(*telemetry);
  telemetry->EndDrain(1, 0);
  EXPECT_TRUE(telemetry->Get().steps.empty());
  process.StepWithArg(5, kT0, kT0 + 100 * kMs);
  process.DrainInto(*telemetry);
  telemetry->EndDrain(1, 1);
  ASSERT_EQ(telemetry->Get().steps.size(), 1u);
  EXPECT_EQ(telemetry->Get().steps[0].collective_entry_ns, kT0 + 70 * kMs);
}

TEST(StepTelemetryTest, TheSameStepOfSeveralProcessesIsOneStepOfThePod) {
  clusterprof::testing::TempDir dir;
  auto telemetry = NewTelemetry();
  Process rank0(dir.path(), "rank0");
  Process rank1(dir.path(), "rank1");
  rank0.Event("all-reduce", kT0 + 60 * kMs, kT0 + 95 * kMs);
  rank0.StepWithArg(7, kT0, kT0 + 100 * kMs);
  rank1.Event("all-reduce", kT0 + 80 * kMs, kT0 + 99 * kMs);
  rank1.StepWithArg(7, kT0 + 2 * kMs, kT0 + 101 * kMs);
  rank0.DrainInto(*telemetry);
  telemetry->EndDrain(2, 1);
  rank1.DrainInto(*telemetry);  // a later drain
  telemetry->EndDrain(2, 2);
  StepTelemetry::Snapshot snapshot = telemetry->Get();
  ASSERT_EQ(snapshot.steps.size(), 1u);
  EXPECT_EQ(snapshot.steps[0].start_ns, kT0);
  EXPECT_EQ(snapshot.steps[0].end_ns, kT0 + 101 * kMs);
  EXPECT_EQ(snapshot.steps[0].collective_entry_ns, kT0 + 60 * kMs) << "the earliest entry";
  EXPECT_EQ(snapshot.steps_total, 1u);
  EXPECT_EQ(snapshot.processes, 2);
  EXPECT_EQ(snapshot.processes_with_steps, 2);
}

TEST(StepTelemetryTest, KeepsTheLatestStepsAndTellsEachToTheObserverOnce) {
  clusterprof::testing::TempDir dir;
  auto telemetry = NewTelemetry({.max_steps = 10});
  std::vector<int64_t> observed;
  telemetry->SetStepObserver([&](const LiveStep& step) { observed.push_back(step.step); });
  Process process(dir.path(), "trainer");
  for (int64_t step = 0; step < 25; ++step) {
    process.StepWithArg(step, kT0 + step * 10 * kMs, kT0 + (step + 1) * 10 * kMs);
    if (step % 5 == 4) {
      process.DrainInto(*telemetry);
      telemetry->EndDrain(1, 1);
    }
  }
  StepTelemetry::Snapshot snapshot = telemetry->Get();
  ASSERT_EQ(snapshot.steps.size(), 10u);
  EXPECT_EQ(snapshot.steps.front().step, 15);
  EXPECT_EQ(snapshot.steps.back().step, 24);
  EXPECT_EQ(snapshot.steps_total, 25u);
  EXPECT_EQ(observed.size(), 25u);
}

TEST(StepTelemetryTest, AStepPatternMarksStepsByNameAndNumbersThoseWithoutStepNum) {
  clusterprof::testing::TempDir dir;
  auto telemetry = NewTelemetry({.step_pattern = "^iteration$"});
  Process process(dir.path(), "trainer");
  process.Event("iteration", kT0, kT0 + 10 * kMs);
  process.Event("iteration", kT0 + 10 * kMs, kT0 + 20 * kMs);
  process.Event("train#step_num=9#", kT0 + 20 * kMs, kT0 + 30 * kMs);  // not a step here
  process.DrainInto(*telemetry);
  telemetry->EndDrain(1, 1);
  StepTelemetry::Snapshot snapshot = telemetry->Get();
  ASSERT_EQ(snapshot.steps.size(), 2u);
  EXPECT_EQ(snapshot.steps[0].step, 0);
  EXPECT_EQ(snapshot.steps[1].step, 1);
  EXPECT_THAT(snapshot.step_source, HasSubstr("^iteration$"));
}

TEST(StepTelemetryTest, APatternThatIsNotARegularExpressionIsRefusedNamingIt) {
  auto bad = StepTelemetry::Create({.step_pattern = "(unclosed"});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("step pattern '(unclosed'"));
  auto bad_collective = StepTelemetry::Create({.collective_pattern = "[x"});
  EXPECT_THAT(bad_collective.status().message(), HasSubstr("collective pattern"));
}

TEST(StepTelemetryTest, WaitForChangeReturnsOnANewStepOrAfterTheTimeout) {
  clusterprof::testing::TempDir dir;
  auto telemetry = NewTelemetry();
  const uint64_t before = telemetry->Get().sequence;
  EXPECT_EQ(telemetry->WaitForChange(before, absl::Milliseconds(10)), before);
  Process process(dir.path(), "trainer");
  std::thread writer([&] {
    process.StepWithArg(1, kT0, kT0 + kMs);
    process.DrainInto(*telemetry);
    telemetry->EndDrain(1, 1);
  });
  uint64_t now = before;
  while (now == before) now = telemetry->WaitForChange(before, absl::Seconds(60));
  writer.join();
  EXPECT_GT(now, before);
}

}  // namespace
}  // namespace clusterprof::sidecar
