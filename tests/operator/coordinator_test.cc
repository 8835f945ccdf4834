#include "operator/coordinator/coordinator.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

// cpprestsdk's U() macro collides with gtest's templates unless turned off.
#define _TURN_OFF_PLATFORM_STRING
#include <cpprest/json.h>

namespace clusterprof::coordinator {
namespace {

using ::testing::HasSubstr;

TEST(ParseServiceAddressesTest, StripsGrpcPrefixesAndSpaces) {
  auto targets = ParseServiceAddresses("grpc://10.0.0.2:8466, host-b:9000,[::1]:8466");
  ASSERT_TRUE(targets.ok()) << targets.status();
  ASSERT_EQ(targets->size(), 3u);
  EXPECT_EQ((*targets)[0].address, "10.0.0.2:8466");
  EXPECT_EQ((*targets)[1].address, "host-b:9000");
  EXPECT_EQ((*targets)[2].address, "[::1]:8466");
  EXPECT_TRUE((*targets)[0].host_name.empty());
}

TEST(ParseServiceAddressesTest, RejectsWhatIsNotHostPort) {
  for (const char* bad : {"", ",", "host", "host:", "host:http", "grpc://"}) {
    auto targets = ParseServiceAddresses(bad);
    EXPECT_EQ(targets.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_THAT(std::string(ParseServiceAddresses("a:1,b").status().message()),
              HasSubstr("'b' is not host:port"));
}

TEST(IsRetryableTest, UpstreamsRule) {
  EXPECT_TRUE(IsRetryable(absl::UnavailableError("down")));
  EXPECT_TRUE(IsRetryable(absl::AlreadyExistsError("busy")));
  EXPECT_TRUE(IsRetryable(absl::UnknownError("Stream removed")));
  EXPECT_FALSE(IsRetryable(absl::UnknownError("something else")));
  EXPECT_FALSE(IsRetryable(absl::InvalidArgumentError("bad")));
  EXPECT_FALSE(IsRetryable(absl::PermissionDeniedError("no")));
  EXPECT_FALSE(IsRetryable(absl::DeadlineExceededError("slow")));
}

TEST(EstimateClockOffsetTest, TheSmallestRoundTripWins) {
  // Remote clock 5 ms ahead. A slow sample with an asymmetric delay would say otherwise.
  const std::vector<ClockSample> samples = {
      {1'000'000, 900'000, 1'000'000 + 5'000'000 + 800'000},  // reply delayed: looks +5.35 ms
      {2'000'000, 100'000, 2'000'000 + 5'000'000 + 50'000},   // rtt 100 us, symmetric
      {3'000'000, 400'000, 3'000'000 + 5'000'000 + 100'000},
  };
  const ClockEstimate estimate = EstimateClockOffset(samples);
  EXPECT_EQ(estimate.offset_ns, 5'000'000);
  EXPECT_EQ(estimate.uncertainty_ns, 50'000);
}

TEST(ManifestJsonTest, IsValidJsonWithEveryTarget) {
  CaptureOptions options;
  options.logdir = *storage::ParseLogdir("/data/tb");
  options.duration_ms = 2000;
  options.delay_ms = 500;
  RunResult result;
  result.run = "run \"1\"";
  result.t0_ns = 1'000;
  result.succeeded = 1;
  result.failed = 1;
  result.max_start_skew_ns = 62'000;
  TargetResult ok;
  ok.address = "10.0.0.2:8466";
  ok.host_name = "host-0";
  ok.outcome = Outcome::kOk;
  ok.attempts = 1;
  ok.is_sidecar = true;
  ok.clock_offset_ns = -1200;
  ok.clock_uncertainty_ns = 240'000;
  ok.start_known = true;
  ok.achieved_start_ns = 63'000;
  ok.start_error_ns = 62'000;
  ok.stats_known = true;
  ok.events = 13906;
  ok.bytes = 522444;
  ok.files = {"/data/tb/plugins/profile/r/host-0.xplane.pb"};
  ok.warnings = {"annotations: 3 events of trainer were dropped"};
  TargetResult failed;
  failed.address = "10.0.0.3:8466";
  failed.host_name = "10.0.0.3:8466";
  failed.outcome = Outcome::kFailed;
  failed.attempts = 3;
  failed.message = "UNAVAILABLE: failed to connect to all addresses";
  result.targets = {ok, failed};

  const std::string text = ManifestJson(options, result, 42);
  web::json::value json;
  ASSERT_NO_THROW(json = web::json::value::parse(text)) << text;
  EXPECT_EQ(json.at("run").as_string(), "run \"1\"");
  EXPECT_EQ(json.at("logdir").as_string(), "/data/tb");
  EXPECT_EQ(json.at("created_ns").as_number().to_int64(), 42);
  EXPECT_EQ(json.at("summary").at("succeeded").as_integer(), 1);
  EXPECT_EQ(json.at("summary").at("max_start_skew_ns").as_number().to_int64(), 62'000);
  const auto& targets = json.at("targets").as_array();
  ASSERT_EQ(targets.size(), 2u);
  EXPECT_EQ(targets.at(0).at("outcome").as_string(), "ok");
  EXPECT_EQ(targets.at(0).at("events").as_number().to_int64(), 13906);
  EXPECT_EQ(targets.at(0).at("start_error_ns").as_number().to_int64(), 62'000);
  EXPECT_EQ(targets.at(0).at("files").as_array().size(), 1u);
  EXPECT_EQ(targets.at(1).at("outcome").as_string(), "failed");
  EXPECT_TRUE(targets.at(1).at("start_error_ns").is_null());
  EXPECT_TRUE(targets.at(1).at("clock_uncertainty_ns").is_null());
  EXPECT_FALSE(targets.at(1).has_field("events")) << "unknown for a failed host";
  EXPECT_THAT(targets.at(1).at("message").as_string(), HasSubstr("UNAVAILABLE"));
}

TEST(CaptureTest, BadOptionsAreInvalidArguments) {
  SimulatedClock clock;
  CaptureOptions options;
  options.logdir = *storage::ParseLogdir("/tmp/x");
  EXPECT_EQ(Capture(options, clock).status().code(), absl::StatusCode::kInvalidArgument);
  options.targets = {{"127.0.0.1:1", ""}};
  options.duration_ms = 0;
  EXPECT_EQ(Capture(options, clock).status().code(), absl::StatusCode::kInvalidArgument);
  options.duration_ms = 100;
  options.run = "../escape";
  EXPECT_EQ(Capture(options, clock).status().code(), absl::StatusCode::kInvalidArgument);
  options.run = "ok";
  options.targets = {{"127.0.0.1:1", "bad/name"}};
  EXPECT_EQ(Capture(options, clock).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace clusterprof::coordinator
