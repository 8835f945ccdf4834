#include "proto/profile_options.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace clusterprof::proto {
namespace {

using Value = tensorflow::ProfileOptions::AdvancedConfigValue;

TEST(ProfileOptionsTest, DefaultsAreUpstreams) {
  const tensorflow::ProfileOptions options = DefaultProfileOptions();
  EXPECT_EQ(options.version(), 1u);
  EXPECT_EQ(options.host_tracer_level(), 2u);
  EXPECT_EQ(options.device_tracer_level(), 1u);
  EXPECT_EQ(options.python_tracer_level(), 0u);
  EXPECT_TRUE(options.enable_hlo_proto());
  EXPECT_TRUE(options.include_dataset_ops());
  EXPECT_TRUE(options.advanced_configuration().empty());
}

TEST(ProfileOptionsTest, AdvancedOptionsAreTypedFromTheirText) {
  tensorflow::ProfileOptions options;
  ASSERT_TRUE(SetAdvancedOption("gpu_enable_nvtx_tracking=true", &options).ok());
  ASSERT_TRUE(SetAdvancedOption("gpu_max_activity_api_events=4194304", &options).ok());
  ASSERT_TRUE(SetAdvancedOption("tpu_trace_mode=TRACE_ONLY_XLA", &options).ok());
  ASSERT_TRUE(SetAdvancedOption("clusterprof_gpu_api_tracing=runtime,driver", &options).ok());
  ASSERT_TRUE(SetAdvancedOption("empty=", &options).ok());
  ASSERT_TRUE(SetAdvancedOption("negative=-3", &options).ok());
  const auto& config = options.advanced_configuration();
  EXPECT_EQ(config.at("gpu_enable_nvtx_tracking").value_case(), Value::kBoolValue);
  EXPECT_TRUE(config.at("gpu_enable_nvtx_tracking").bool_value());
  EXPECT_EQ(config.at("gpu_max_activity_api_events").value_case(), Value::kInt64Value);
  EXPECT_EQ(config.at("gpu_max_activity_api_events").int64_value(), 4194304);
  EXPECT_EQ(config.at("tpu_trace_mode").string_value(), "TRACE_ONLY_XLA");
  EXPECT_EQ(config.at("clusterprof_gpu_api_tracing").string_value(), "runtime,driver")
      << "only the first '=' splits";
  EXPECT_EQ(config.at("empty").value_case(), Value::kStringValue);
  EXPECT_EQ(config.at("negative").int64_value(), -3);

  ASSERT_TRUE(SetAdvancedOption("gpu_enable_nvtx_tracking=false", &options).ok());
  EXPECT_FALSE(options.advanced_configuration().at("gpu_enable_nvtx_tracking").bool_value())
      << "a later value replaces an earlier one";
}

TEST(ProfileOptionsTest, TextThatIsNotKeyEqualsValueIsRefused) {
  tensorflow::ProfileOptions options;
  for (const char* bad : {"no_equals_sign", "=value", ""}) {
    const absl::Status status = SetAdvancedOption(bad, &options);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("KEY=VALUE")) << bad;
  }
  EXPECT_TRUE(options.advanced_configuration().empty()) << "nothing half-set";
}

}  // namespace
}  // namespace clusterprof::proto
