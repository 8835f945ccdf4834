#include "common/xspace/merge.h"

#include <string>

#include "common/xspace/builder.h"
#include "common/xspace/schema.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace clusterprof::xspace {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// What a sidecar's own tracers built: host threads, a GPU, the task environment.
XSpace Ours() {
  XSpace space;
  space.add_hostnames("trainer-0");
  space.add_warnings("gpu: something of ours");
  XPlaneBuilder host(FindOrAddMutablePlaneWithName(&space, kHostThreadsPlaneName));
  XLineBuilder thread = host.GetOrCreateLine(1001);
  thread.SetName("main");
  thread.SetTimestampNs(1000);
  XEventBuilder step = thread.AddEvent(*host.GetOrCreateEventMetadata("train"));
  step.SetTimestampNs(1000);
  step.SetDurationNs(500);
  XPlaneBuilder gpu(FindOrAddMutablePlaneWithName(&space, "/device:GPU:0"));
  gpu.GetOrCreateLine(7).SetName("Stream #7(Kernel)");
  FindOrAddMutablePlaneWithName(&space, kTaskEnvPlaneName);
  return space;
}

// What a JAX server returned: its host threads (with the same thread id), a TPU, a GPU that our
// tracer also recorded, its task environment, its warnings and errors.
XSpace Framework() {
  XSpace space;
  space.add_hostnames("trainer-0");
  space.add_hostnames("framework");
  space.add_warnings("python tracer: 3 frames dropped");
  space.add_errors("tpu: chip 3 did not answer");
  XPlaneBuilder host(FindOrAddMutablePlaneWithName(&space, kHostThreadsPlaneName));
  XLineBuilder thread = host.GetOrCreateLine(1001);
  thread.SetName("python3");
  thread.SetTimestampNs(1000);
  XEventBuilder step = thread.AddEvent(*host.GetOrCreateEventMetadata("jit_train_step"));
  step.SetTimestampNs(1100);
  step.SetDurationNs(300);
  XPlaneBuilder tpu(FindOrAddMutablePlaneWithName(&space, "/device:TPU:0"));
  XLineBuilder ops = tpu.GetOrCreateLine(1);
  ops.SetName("XLA Ops");
  ops.SetTimestampNs(1000);
  for (int i = 0; i < 2; ++i) {
    XEventBuilder op = ops.AddEvent(*tpu.GetOrCreateEventMetadata("fusion.1"));
    op.SetTimestampNs(1100 + 100 * i);
    op.SetDurationNs(50);
  }
  FindOrAddMutablePlaneWithName(&space, "/device:GPU:0");
  FindOrAddMutablePlaneWithName(&space, kTaskEnvPlaneName);
  return space;
}

TEST(MergeXSpaceTest, MatchesGolden) {
  XSpace merged = Ours();
  const MergeStats stats = MergeXSpace(Framework(), &merged, "framework");
  EXPECT_EQ(stats.planes, 2);
  EXPECT_EQ(stats.events, 3);
  std::string actual;
  ASSERT_TRUE(google::protobuf::TextFormat::PrintToString(merged, &actual));
  const std::string golden_path =
      std::string(CLUSTERPROF_SOURCE_DIR) + "/tests/data/golden/framework_merge.txtpb";
  const std::string golden = testing::ReadFileOrDie(golden_path);
  if (actual != golden) {
    testing::WriteFileOrDie(std::string(CLUSTERPROF_BINARY_DIR) + "/framework_merge.txtpb", actual);
  }
  EXPECT_EQ(actual, golden) << "actual output written to " CLUSTERPROF_BINARY_DIR
                               "/framework_merge.txtpb";
}

TEST(MergeXSpaceTest, KeepsTheFrameworksHostThreadsApart) {
  XSpace merged = Ours();
  MergeXSpace(Framework(), &merged, "framework");
  std::vector<std::string> names;
  std::vector<int64_t> ids;
  for (const XPlane& plane : merged.planes()) {
    names.push_back(plane.name());
    ids.push_back(plane.id());
  }
  EXPECT_THAT(names, ElementsAre("/host:CPU", "/device:GPU:0", "Task Environment", "/host:CPU",
                                 "/device:TPU:0"));
  EXPECT_THAT(ids, ElementsAre(0, 1, 2, 3, 4)) << "added planes take fresh ids";
  EXPECT_EQ(merged.planes(3).lines(0).name(), "python3");
  EXPECT_THAT(merged.hostnames(), ElementsAre("trainer-0", "framework"));
  EXPECT_THAT(merged.warnings(),
              ElementsAre("gpu: something of ours",
                          HasSubstr("framework: left out its /device:GPU:0 plane"),
                          "framework: python tracer: 3 frames dropped"));
  EXPECT_THAT(merged.errors(), ElementsAre("framework: tpu: chip 3 did not answer"));
}

TEST(MergeXSpaceTest, AnEmptyFrameworkSpaceChangesNothing) {
  XSpace merged = Ours();
  const std::string before = merged.SerializeAsString();
  const MergeStats stats = MergeXSpace(XSpace(), &merged, "framework");
  EXPECT_EQ(stats.planes, 0);
  EXPECT_EQ(merged.SerializeAsString(), before);
}

}  // namespace
}  // namespace clusterprof::xspace
