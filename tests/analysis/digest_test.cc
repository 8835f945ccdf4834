#include "analysis/digest.h"

#include "common/xspace/builder.h"
#include "common/xspace/schema.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/analysis/synthetic_run.h"

namespace clusterprof::analysis {
namespace {

using ::testing::HasSubstr;

TEST(DigestTest, StepsComeFromStepNumAndTimeIsSplitByKind) {
  testing::RunSpec spec;
  spec.hosts = {{}, {}};
  spec.steps = 3;
  spec.jitter = 0;
  const std::vector<tensorflow::profiler::XSpace> run = testing::MakeRun(spec);
  absl::StatusOr<HostDigest> digest = DigestXSpace(run[0], "host-0");
  ASSERT_TRUE(digest.ok()) << digest.status();
  EXPECT_EQ(digest->host, "host-0");
  EXPECT_THAT(digest->step_source, HasSubstr("step_num"));
  ASSERT_EQ(digest->steps.size(), 3u);
  const StepDigest& step = digest->steps[0];
  EXPECT_EQ(step.step, 100);
  EXPECT_EQ(digest->steps[2].step, 102);
  // input 2 ms, compute 20 ms (host ops), a kernel over its last 15 ms, all-reduce 5 ms.
  EXPECT_EQ(step.duration_ns(), 27'000'000);
  EXPECT_EQ(step.input_ns, 2'000'000);
  EXPECT_EQ(step.host_busy_ns, 20'000'000);
  EXPECT_EQ(step.device_busy_ns, 15'000'000);
  EXPECT_EQ(step.collective_ns, 5'000'000) << "host annotation and NCCL kernel overlap: once";
  EXPECT_EQ(step.collective_entry_ns - step.start_ns, 22'000'000);
  EXPECT_GT(digest->events, 0);
}

TEST(DigestTest, HostWorkCountsOnTheStepThreadsOnly) {
  testing::RunSpec spec;
  spec.hosts = {{}};
  spec.steps = 2;
  spec.jitter = 0;
  std::vector<tensorflow::profiler::XSpace> run = testing::MakeRun(spec);
  // An async lane (a batch's wait in a queue) and a loader thread over the whole run: neither is
  // the trainer's work; the loader's input is still input.
  xspace::XPlaneBuilder plane(
      xspace::FindOrAddMutablePlaneWithName(&run[0], xspace::kHostThreadsPlaneName));
  const int64_t t0 = 1'767'225'600'000'000'000;
  xspace::XLineBuilder lane = plane.GetOrCreateLine(int64_t{1} << 40);
  lane.SetTimestampNs(t0);
  xspace::XEventBuilder wait = lane.AddEvent(*plane.GetOrCreateEventMetadata("batch_in_queue"));
  wait.SetTimestampNs(t0 + 1'000'000);
  wait.SetDurationNs(60'000'000);
  xspace::XLineBuilder loader = plane.GetOrCreateLine(2);
  loader.SetTimestampNs(t0);
  xspace::XEventBuilder load = loader.AddEvent(*plane.GetOrCreateEventMetadata("load_batch"));
  load.SetTimestampNs(t0 + 1'000'000 + 10'000'000);
  load.SetDurationNs(1'000'000);
  absl::StatusOr<HostDigest> digest = DigestXSpace(run[0], "host-0");
  ASSERT_TRUE(digest.ok()) << digest.status();
  ASSERT_EQ(digest->steps.size(), 2u);
  EXPECT_EQ(digest->steps[0].host_busy_ns, 20'000'000) << "the trainer's forward and backward";
  EXPECT_EQ(digest->steps[0].input_ns, 3'000'000) << "its data_load and the loader's load_batch";
}

TEST(DigestTest, AStepPatternMarksStepsWithoutStepNum) {
  tensorflow::profiler::XSpace space;
  xspace::XPlaneBuilder plane(
      xspace::FindOrAddMutablePlaneWithName(&space, xspace::kHostThreadsPlaneName));
  xspace::XLineBuilder line = plane.GetOrCreateLine(1);
  line.SetTimestampNs(1'000'000'000);
  for (int i = 0; i < 4; ++i) {
    xspace::XEventBuilder event = line.AddEvent(*plane.GetOrCreateEventMetadata("TrainStep"));
    event.SetTimestampNs(1'000'000'000 + i * 10'000'000);
    event.SetDurationNs(9'000'000);
  }
  absl::StatusOr<HostDigest> none = DigestXSpace(space, "h");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->steps.empty()) << "no step_num stat";
  absl::StatusOr<HostDigest> named = DigestXSpace(space, "h", {.step_pattern = "^trainstep$"});
  ASSERT_TRUE(named.ok()) << named.status();
  ASSERT_EQ(named->steps.size(), 4u);
  EXPECT_EQ(named->steps[3].step, 3) << "numbered in time order";
  EXPECT_THAT(named->step_source, HasSubstr("^trainstep$"));
}

TEST(DigestTest, ABadPatternIsNamed) {
  tensorflow::profiler::XSpace space;
  absl::StatusOr<HostDigest> digest = DigestXSpace(space, "h", {.step_pattern = "step("});
  ASSERT_FALSE(digest.ok());
  EXPECT_EQ(digest.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(digest.status().message()), HasSubstr("step pattern 'step('"));
}

// The names frameworks give their collectives, host annotations and kernels, each the only
// collective of a step: the default pattern finds every one, and a step's compute is not one.
TEST(DigestTest, TheDefaultPatternFindsEachFrameworksCollectiveNames) {
  for (const char* name :
       {"ncclDevKernel_AllReduce_Sum_f32_RING_LL", "ncclKernel_AllGather_RING_LL_Sum_int8_t",
        "all-reduce.3", "all-to-all.1", "reduce-scatter", "collective-permute-start",
        "torch.distributed.all_reduce", "torch.distributed.all_to_all_single",
        "torch.distributed.all_gather_into_tensor", "ddp_all_reduce#bucket=0#",
        "torch.distributed.reduce_scatter_tensor", "AllToAll", "hvd.allreduce"}) {
    tensorflow::profiler::XSpace space;
    xspace::XPlaneBuilder plane(
        xspace::FindOrAddMutablePlaneWithName(&space, xspace::kHostThreadsPlaneName));
    xspace::XLineBuilder line = plane.GetOrCreateLine(1);
    line.SetTimestampNs(1'000'000'000);
    xspace::XEventBuilder step = line.AddEvent(*plane.GetOrCreateEventMetadata("train"));
    step.SetTimestampNs(1'000'000'000);
    step.SetDurationNs(10'000'000);
    step.AddStatValue(*plane.GetOrCreateStatMetadata("step_num"), int64_t{7});
    xspace::XEventBuilder matmul = line.AddEvent(*plane.GetOrCreateEventMetadata("matmul"));
    matmul.SetTimestampNs(1'001'000'000);
    matmul.SetDurationNs(3'000'000);
    xspace::XEventBuilder collective = line.AddEvent(*plane.GetOrCreateEventMetadata(name));
    collective.SetTimestampNs(1'006'000'000);
    collective.SetDurationNs(2'000'000);
    absl::StatusOr<HostDigest> digest = DigestXSpace(space, "h");
    ASSERT_TRUE(digest.ok()) << digest.status();
    ASSERT_EQ(digest->steps.size(), 1u) << name;
    EXPECT_EQ(digest->steps[0].collective_entry_ns, 1'006'000'000) << name;
    EXPECT_EQ(digest->steps[0].collective_ns, 2'000'000) << name;
  }
}

TEST(DigestTest, AnEmptySpaceHasNoSteps) {
  absl::StatusOr<HostDigest> digest = DigestXSpace(tensorflow::profiler::XSpace(), "h");
  ASSERT_TRUE(digest.ok());
  EXPECT_TRUE(digest->steps.empty());
  EXPECT_EQ(digest->events, 0);
}

}  // namespace
}  // namespace clusterprof::analysis
