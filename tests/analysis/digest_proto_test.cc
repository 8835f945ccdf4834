// The digest on the wire: what a sidecar sends is what the coordinator reads, within the size the
// design allows, and a digest no sidecar makes is refused saying what is wrong.
#include "analysis/digest_proto.h"

#include "clusterprof/v1alpha1/sidecar.pb.h"
#include "common/base/strings.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/analysis/synthetic_run.h"
#include "tsl/profiler/protos/profiler_options.pb.h"

namespace clusterprof::analysis {
namespace {

using ::testing::HasSubstr;

HostDigest ThousandSteps() {
  testing::RunSpec spec;
  spec.hosts = {{}, {}};
  spec.steps = 1000;
  std::vector<tensorflow::profiler::XSpace> spaces = testing::MakeRun(spec);
  absl::StatusOr<HostDigest> digest = DigestXSpace(spaces[0], "host-0");
  EXPECT_TRUE(digest.ok()) << digest.status();
  return *digest;
}

TEST(DigestProtoTest, ADigestCrossesTheWireUnchangedAndA1000StepOneFitsIn64KiB) {
  const HostDigest digest = ThousandSteps();
  ASSERT_EQ(digest.steps.size(), 1000u);
  ASSERT_FALSE(digest.top_ops.empty());
  v1alpha1::HostDigest proto;
  DigestToProto(digest, &proto);
  EXPECT_LE(proto.ByteSizeLong(), 64u * 1024) << "the design's budget per host";

  v1alpha1::HostDigest parsed;
  ASSERT_TRUE(parsed.ParseFromString(proto.SerializeAsString()));
  absl::StatusOr<HostDigest> back = DigestFromProto(parsed);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->host, "host-0");
  EXPECT_EQ(back->events, digest.events);
  EXPECT_EQ(back->step_source, digest.step_source);
  ASSERT_EQ(back->steps.size(), digest.steps.size());
  for (size_t i = 0; i < digest.steps.size(); ++i) {
    const StepDigest& a = digest.steps[i];
    const StepDigest& b = back->steps[i];
    EXPECT_EQ(b.step, a.step);
    EXPECT_EQ(b.start_ns, a.start_ns);
    EXPECT_EQ(b.end_ns, a.end_ns);
    EXPECT_EQ(b.collective_entry_ns, a.collective_entry_ns);
    EXPECT_EQ(b.collective_ns, a.collective_ns);
    EXPECT_EQ(b.device_busy_ns, a.device_busy_ns);
    EXPECT_EQ(b.host_busy_ns, a.host_busy_ns);
    EXPECT_EQ(b.input_ns, a.input_ns);
  }
  ASSERT_EQ(back->top_ops.size(), digest.top_ops.size());
  EXPECT_EQ(back->top_ops[0].name, digest.top_ops[0].name);
  EXPECT_EQ(back->top_ops[0].total_ns, digest.top_ops[0].total_ns);
}

TEST(DigestProtoTest, AStepWithoutACollectiveStaysWithoutOne) {
  HostDigest digest;
  digest.host = "h";
  digest.steps = {{.step = 1, .start_ns = 1000, .end_ns = 2000}};
  v1alpha1::HostDigest proto;
  DigestToProto(digest, &proto);
  EXPECT_EQ(proto.steps(0).collective_entry_offset_ns(), -1);
  absl::StatusOr<HostDigest> back = DigestFromProto(proto);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->steps[0].collective_entry_ns, 0);
}

TEST(DigestProtoTest, WhatNoSidecarMakesIsRefusedSayingWhat) {
  v1alpha1::HostDigest good;
  good.set_host("worker-3");
  good.set_base_ns(1'000'000);
  for (int i = 0; i < 3; ++i) {
    v1alpha1::StepDigest* step = good.add_steps();
    step->set_step(10 + i);
    step->set_start_offset_ns(i * 100);
    step->set_duration_ns(100);
    step->set_collective_entry_offset_ns(50);
  }
  ASSERT_TRUE(DigestFromProto(good).ok());

  auto refused = [&](const std::function<void(v1alpha1::HostDigest&)>& corrupt) {
    v1alpha1::HostDigest bad = good;
    corrupt(bad);
    absl::StatusOr<HostDigest> digest = DigestFromProto(bad);
    EXPECT_EQ(digest.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(digest.status().message());
  };
  EXPECT_THAT(refused([](auto& d) { d.mutable_steps(2)->set_step(11); }),
              HasSubstr("the digest of worker-3 is corrupted: step 11 comes after step 11"));
  EXPECT_THAT(refused([](auto& d) { d.mutable_steps(1)->set_duration_ns(-1); }),
              HasSubstr("step 11 has a negative time"));
  EXPECT_THAT(refused([](auto& d) { d.mutable_steps(0)->set_collective_entry_offset_ns(100); }),
              HasSubstr("step 10 enters its collective after it ends"));
  EXPECT_THAT(refused([](auto& d) { d.set_base_ns(INT64_MAX - 150); }),
              HasSubstr("ends past the end of time"));
  EXPECT_THAT(refused([](auto& d) { d.add_top_ops()->set_count(-2); }),
              HasSubstr("negative count"));
}

TEST(DigestProtoTest, AHugeDigestIsRefusedByNameBeforeItIsCopied) {
  auto digest_of = [](int steps, int ops) {
    v1alpha1::HostDigest proto;
    proto.set_host("worker-7");
    proto.set_base_ns(1'000'000);
    for (int i = 0; i < steps; ++i) {
      v1alpha1::StepDigest* step = proto.add_steps();
      step->set_step(i);
      step->set_start_offset_ns(int64_t{i} * 1000);
      step->set_duration_ns(900);
      step->set_collective_entry_offset_ns(-1);
    }
    for (int i = 0; i < ops; ++i) proto.add_top_ops()->set_name(StrCat("op-", i));
    return proto;
  };
  EXPECT_TRUE(DigestFromProto(digest_of(kMaxDigestSteps, 40)).ok()) << "at the bound: accepted";
  EXPECT_THAT(std::string(DigestFromProto(digest_of(kMaxDigestSteps + 1, 0)).status().message()),
              HasSubstr("the digest of worker-7 is corrupted: 100001 steps, more than the 100000"));
  EXPECT_THAT(std::string(DigestFromProto(digest_of(1, kMaxDigestOps + 1)).status().message()),
              HasSubstr("the digest of worker-7 is corrupted: 1001 ops"));
  v1alpha1::HostDigest bytes = digest_of(1, 0);
  bytes.set_step_source(std::string(kMaxDigestBytes, 'x'));
  EXPECT_THAT(
      std::string(DigestFromProto(bytes).status().message()),
      ::testing::ContainsRegex("the digest of worker-7 is corrupted: 83886[0-9][0-9] bytes, "
                               "more than the 8 MiB"));
  v1alpha1::HostDigest name = digest_of(1, 1);
  name.mutable_top_ops(0)->set_name(std::string(kMaxDigestNameBytes + 1, 'k'));
  EXPECT_THAT(std::string(DigestFromProto(name).status().message()),
              HasSubstr("worker-7 is corrupted: an op name of 4097 bytes"));
  v1alpha1::HostDigest host = digest_of(1, 0);
  host.set_host(std::string(100'000, 'h'));
  EXPECT_THAT(std::string(DigestFromProto(host).status().message()),
              HasSubstr("a host name of 100000 bytes"));
}

TEST(DigestProtoTest, PatternsComeFromTheCapturesOptionsWithDefaultsForTheRest) {
  tensorflow::ProfileOptions options;
  absl::StatusOr<DigestOptions> defaults = DigestOptionsFromProfile(options);
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->step_pattern, "");
  EXPECT_EQ(defaults->collective_pattern, kDefaultCollectivePattern);
  (*options.mutable_advanced_configuration())["clusterprof_input_pattern"].set_string_value("(");
  EXPECT_THAT(std::string(DigestOptionsFromProfile(options).status().message()),
              HasSubstr("the input pattern '(' is not a regular expression"));
}

}  // namespace
}  // namespace clusterprof::analysis
