#include "coordinator/coordinator.h"

#include <atomic>
#include <fstream>
#include <map>
#include <thread>

#include "analysis/digest_proto.h"
#include "analysis/report.h"
#include "common/base/cancel.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/analysis/synthetic_run.h"
#include "tests/support/clock_advancer.h"
#include "tests/support/fake_profilers.h"
#include "tests/support/temp_dir.h"

// cpprestsdk's U() macro collides with gtest's templates unless turned off.
#define _TURN_OFF_PLATFORM_STRING
#include <cpprest/json.h>

namespace clusterprof::coordinator {
namespace {

using ::testing::ElementsAre;
using testing::FakeProfilers;
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

TEST(IsRetryableTest, UpstreamsRuleAndASidecarWithTooManyCallsWaiting) {
  EXPECT_TRUE(IsRetryable(absl::ResourceExhaustedError("64 Profile calls wait already")));
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
  options.layout = *storage::RunLayout::Create(*storage::ParseLogdir("/data/tb"), "run1");
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
  options.targets = {{"127.0.0.1:1", ""}};
  // No layout: no logdir and run.
  EXPECT_EQ(Capture(options, clock).status().code(), absl::StatusCode::kInvalidArgument);
  options.layout = *storage::RunLayout::Create(*storage::ParseLogdir("/tmp/x"), "ok");
  options.targets.clear();
  EXPECT_EQ(Capture(options, clock).status().code(), absl::StatusCode::kInvalidArgument);
  options.targets = {{"127.0.0.1:1", ""}};
  options.duration_ms = 0;
  EXPECT_EQ(Capture(options, clock).status().code(), absl::StatusCode::kInvalidArgument);
  options.duration_ms = 100;
  options.targets = {{"127.0.0.1:1", "bad/name"}};
  EXPECT_EQ(Capture(options, clock).status().code(), absl::StatusCode::kInvalidArgument);
}

// The coordinator against in-process servers on a simulated clock: no sockets, no sleeps.
class FakeCaptureTest : public ::testing::Test {
 protected:
  FakeCaptureTest() : servers_(&clock_) {
    options_.layout = *storage::RunLayout::Create(*storage::ParseLogdir(dir_.path()), "run1");
    options_.duration_ms = 1000;
    options_.delay_ms = 500;
    options_.retry_backoff_ms = 1000;
    options_.connector = &servers_;
  }

  // Captures on this thread while another advances the simulated clock through every pause
  // (the retry backoff) the capture sleeps in.
  absl::StatusOr<RunResult> CaptureAdvancing() {
    testing::ClockAdvancer advancer(&clock_, 100 * kNanosPerMilli);
    return Capture(options_, clock_);
  }

  const TargetResult& Find(const RunResult& result, std::string_view address) {
    for (const TargetResult& target : result.targets) {
      if (target.address == address) return target;
    }
    ADD_FAILURE() << "no target " << address;
    return result.targets.front();
  }

  SimulatedClock clock_;
  FakeProfilers servers_;
  testing::TempDir dir_;
  CaptureOptions options_;
};

TEST_F(FakeCaptureTest, TheProfileOptionsReachEveryServerWithTheCapturesOwnFieldsSet) {
  servers_.Add("a:1", {.host_name = "worker-0"});
  options_.targets = {{"a:1", ""}};
  options_.profile.set_host_tracer_level(3);
  options_.profile.set_python_tracer_level(1);
  options_.profile.set_session_id("not-the-run");
  (*options_.profile.mutable_advanced_configuration())["tpu_trace_mode"].set_string_value("X");
  options_.outlive_client = true;
  absl::StatusOr<RunResult> result = Capture(options_, clock_);
  ASSERT_TRUE(result.ok()) << result.status();
  const std::vector<tensorflow::ProfileRequest> a = servers_.ProfileRequests("a:1");
  ASSERT_EQ(a.size(), 1u);
  const tensorflow::ProfileOptions& sent = a[0].opts();
  EXPECT_EQ(sent.host_tracer_level(), 3u);
  EXPECT_EQ(sent.device_tracer_level(), 1u) << "upstream's default, untouched";
  EXPECT_EQ(sent.python_tracer_level(), 1u);
  EXPECT_TRUE(sent.enable_hlo_proto());
  EXPECT_EQ(sent.advanced_configuration().at("tpu_trace_mode").string_value(), "X");
  EXPECT_TRUE(sent.advanced_configuration().at("clusterprof_outlive_client").bool_value());
  EXPECT_EQ(sent.session_id(), "run1") << "the capture's own fields win";
  EXPECT_EQ(sent.version(), 1u);
  EXPECT_EQ(sent.duration_ms(), static_cast<uint64_t>(options_.duration_ms));
  EXPECT_EQ(static_cast<int64_t>(sent.start_timestamp_ns()), result->t0_ns);
}

TEST_F(FakeCaptureTest, EveryTargetStartsAtOneInstantOnItsOwnClock) {
  servers_.Add("a:1", {.host_name = "worker-0", .clock_offset_ns = 3 * kNanosPerMilli});
  servers_.Add("b:1", {.host_name = "worker-1", .clock_offset_ns = -2 * kNanosPerMilli});
  options_.targets = {{"a:1", ""}, {"grpc://b:1", ""}};
  const int64_t now = clock_.WallNs();
  absl::StatusOr<RunResult> result = Capture(options_, clock_);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->succeeded, 2);
  EXPECT_EQ(result->t0_ns, now + 500 * kNanosPerMilli) << "the delay exceeds the fan-out lead";
  const std::vector<tensorflow::ProfileRequest> a = servers_.ProfileRequests("a:1");
  const std::vector<tensorflow::ProfileRequest> b = servers_.ProfileRequests("b:1");
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  // The fake answers at once: round trip 0, so each offset is exact and applied.
  EXPECT_EQ(static_cast<int64_t>(a[0].opts().start_timestamp_ns()),
            result->t0_ns + 3 * kNanosPerMilli);
  EXPECT_EQ(static_cast<int64_t>(b[0].opts().start_timestamp_ns()),
            result->t0_ns - 2 * kNanosPerMilli);
  EXPECT_EQ(a[0].opts().version(), 1u);
  EXPECT_EQ(a[0].opts().override_hostname(), "worker-0") << "the sidecars' names are distinct";
  EXPECT_EQ(a[0].session_id(), "run1");
  EXPECT_EQ(Find(*result, "a:1").clock_offset_ns, 3 * kNanosPerMilli);
  EXPECT_EQ(Find(*result, "a:1").start_error_ns, 0);
  EXPECT_EQ(Find(*result, "a:1").events, 100u);
  EXPECT_THAT(Find(*result, "b:1").files,
              ElementsAre(HasSubstr("/plugins/profile/run1/worker-1.xplane.pb")));
  EXPECT_FALSE(result->manifest_uri.empty());
  EXPECT_TRUE(std::ifstream(result->manifest_uri).good()) << result->manifest_uri;
}

TEST_F(FakeCaptureTest, RetriesUnavailableAndAlreadyExistsWithAFreshStartAfterTheBackoff) {
  servers_.Add("a:1", {.host_name = "a"});
  servers_.Add("b:1", {.host_name = "b",
                       .profile_errors = {absl::UnavailableError("restarting"),
                                          absl::AlreadyExistsError("a capture is running")}});
  options_.targets = {{"a:1", ""}, {"b:1", ""}};
  absl::StatusOr<RunResult> result = CaptureAdvancing();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->succeeded, 2);
  EXPECT_EQ(result->attempt, 3);
  EXPECT_EQ(Find(*result, "a:1").attempts, 1) << "only the failed target is retried";
  EXPECT_EQ(Find(*result, "b:1").attempts, 3);
  const std::vector<tensorflow::ProfileRequest> b = servers_.ProfileRequests("b:1");
  ASSERT_EQ(b.size(), 3u);
  // Each retry waits its backoff (1 s, then 2 s) and picks a later T0.
  EXPECT_GE(b[1].opts().start_timestamp_ns(), b[0].opts().start_timestamp_ns() + kNanosPerSecond);
  EXPECT_GE(b[2].opts().start_timestamp_ns(),
            b[1].opts().start_timestamp_ns() + 2 * kNanosPerSecond);
}

TEST_F(FakeCaptureTest, ATargetThatNeverAnswersFailsAfterEveryAttemptAndTheOthersStillCount) {
  servers_.Add("a:1", {.host_name = "a"});
  servers_.Add("down:1", {.reachable = false});
  options_.targets = {{"a:1", ""}, {"down:1", ""}};
  options_.num_tracing_attempts = 2;
  absl::StatusOr<RunResult> result = CaptureAdvancing();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->succeeded, 1);
  EXPECT_EQ(result->failed, 1);
  const TargetResult& down = Find(*result, "down:1");
  EXPECT_EQ(down.outcome, Outcome::kFailed);
  EXPECT_EQ(down.attempts, 2);
  EXPECT_THAT(down.message, HasSubstr("UNAVAILABLE"));
  EXPECT_EQ(down.clock_uncertainty_ns, -1);
}

TEST_F(FakeCaptureTest, NoDataAnywhereIsUnavailableWithUpstreamsMessage) {
  servers_.Add("a:1", {.empty_trace = true});
  options_.targets = {{"a:1", ""}};
  options_.num_tracing_attempts = 2;
  absl::StatusOr<RunResult> result = CaptureAdvancing();
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(result.status().message(), HasSubstr("No trace event was collected"));
  EXPECT_EQ(servers_.ProfileRequests("a:1").size(), 2u) << "empty captures are retried";
}

TEST_F(FakeCaptureTest, AFrameworkServerGetsOffsetZeroAndUpstreamsFileLayout) {
  servers_.Add("tf:6009", {.is_sidecar = false});
  options_.targets = {{"tf:6009", "trainer"}};
  absl::StatusOr<RunResult> result = Capture(options_, clock_);
  ASSERT_TRUE(result.ok()) << result.status();
  const TargetResult& tf = result->targets.at(0);
  EXPECT_FALSE(tf.is_sidecar);
  EXPECT_EQ(tf.clock_uncertainty_ns, -1);
  EXPECT_FALSE(tf.start_known);
  EXPECT_THAT(tf.files, ElementsAre(HasSubstr("/plugins/profile/run1/trainer.xplane.pb")));
  EXPECT_EQ(servers_.ProfileRequests("tf:6009").at(0).opts().override_hostname(), "trainer");
  EXPECT_EQ(servers_.GetInfoCalls("tf:6009"), 1) << "probed once: UNIMPLEMENTED ends probing";
  EXPECT_EQ(servers_.GetSessionCalls("tf:6009"), 0) << "not a sidecar: no session to ask for";
}

// Digests as three sidecars would make them of a run where worker-1 computes 30% slower, their
// clocks off by up to 5 ms.
std::vector<v1alpha1::HostDigest> StragglerDigests(const std::vector<int64_t>& offsets) {
  analysis::testing::RunSpec spec;
  for (int64_t offset : offsets) spec.hosts.push_back({.clock_offset_ns = offset});
  spec.hosts[1].compute_scale = 1.3;
  std::vector<tensorflow::profiler::XSpace> spaces = analysis::testing::MakeRun(spec);
  std::vector<v1alpha1::HostDigest> digests;
  for (size_t i = 0; i < spaces.size(); ++i) {
    absl::StatusOr<analysis::HostDigest> digest =
        analysis::DigestXSpace(spaces[i], StrCat("worker-", i));
    EXPECT_TRUE(digest.ok()) << digest.status();
    analysis::DigestToProto(*digest, &digests.emplace_back());
  }
  return digests;
}

TEST_F(FakeCaptureTest, TheSidecarsDigestsMakeTheReportWrittenNextToTheManifest) {
  const std::vector<int64_t> offsets = {5 * kNanosPerMilli, -4 * kNanosPerMilli, 0};
  const std::vector<v1alpha1::HostDigest> digests = StragglerDigests(offsets);
  for (int i = 0; i < 3; ++i) {
    servers_.Add(
        StrCat("w", i, ":1"),
        {.host_name = StrCat("worker-", i), .clock_offset_ns = offsets[i], .digest = digests[i]});
  }
  servers_.Add("tf:6009", {.is_sidecar = false});
  servers_.Add("w3:1", {.host_name = "worker-3", .empty_trace = true});
  options_.targets = {
      {"w0:1", ""}, {"w1:1", ""}, {"w2:1", ""}, {"tf:6009", "trainer"}, {"w3:1", ""}};
  absl::StatusOr<RunResult> result = Capture(options_, clock_);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_NE(result->report, nullptr);
  const analysis::Analysis& analysis = result->report->analysis;
  ASSERT_EQ(analysis.stragglers().size(), 1u) << analysis::FormatReportText(*result->report);
  EXPECT_EQ(analysis.stragglers()[0]->host, "worker-1");
  EXPECT_EQ(analysis.stragglers()[0]->cause, analysis::Cause::kCompute);
  EXPECT_THAT(analysis.left_out,
              ElementsAre(HasSubstr("trainer: a TF/JAX profiler server: it makes no digest"),
                          HasSubstr("worker-3: an empty trace")));
  EXPECT_NE(Find(*result, "w0:1").digest, nullptr);

  const std::string path = StrCat(dir_.path(), "/plugins/profile/run1/clusterprof_report.json");
  EXPECT_EQ(result->report_json_uri, path);
  std::ifstream file(path);
  const web::json::value json = web::json::value::parse(file);
  EXPECT_EQ(json.at("kind").as_string(), "clusterprof.io/v1alpha1/RunReport");
  EXPECT_EQ(json.at("stragglers").as_array().at(0).as_string(), "worker-1");
  EXPECT_EQ(result->report_html_uri,
            StrCat(dir_.path(), "/plugins/profile/run1/clusterprof_report.html"));
  EXPECT_TRUE(testing::FileExists(result->report_html_uri));
}

TEST_F(FakeCaptureTest, ACorruptedDigestLeavesItsHostOutAndTheOthersAreAnalyzed) {
  std::vector<v1alpha1::HostDigest> digests = StragglerDigests({0, 0, 0});
  digests[2].mutable_steps(3)->set_step(digests[2].steps(2).step());  // a repeated step
  for (int i = 0; i < 3; ++i) {
    servers_.Add(StrCat("w", i, ":1"), {.host_name = StrCat("worker-", i), .digest = digests[i]});
  }
  servers_.Add("w3:1", {.host_name = "worker-3", .digest_error = "the step pattern '(' is bad"});
  // More steps than any capture makes: refused by name, not held.
  v1alpha1::HostDigest huge = digests[0];
  huge.set_host("worker-4");
  while (huge.steps_size() <= analysis::kMaxDigestSteps) {
    *huge.add_steps() = huge.steps(huge.steps_size() - 1);
    huge.mutable_steps(huge.steps_size() - 1)
        ->set_step(huge.steps(huge.steps_size() - 2).step() + 1);
  }
  servers_.Add("w4:1", {.host_name = "worker-4", .digest = huge});
  options_.targets = {{"w0:1", ""}, {"w1:1", ""}, {"w2:1", ""}, {"w3:1", ""}, {"w4:1", ""}};
  absl::StatusOr<RunResult> result = Capture(options_, clock_);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->succeeded, 5) << "every capture is kept; only the digests are refused";
  ASSERT_NE(result->report, nullptr);
  EXPECT_EQ(result->report->analysis.hosts.size(), 2u);
  EXPECT_THAT(
      result->report->analysis.left_out,
      ElementsAre(HasSubstr("worker-2: the digest of worker-2 is corrupted: step"),
                  HasSubstr("worker-3: no digest: the step pattern '(' is bad"),
                  HasSubstr("worker-4: the digest of worker-4 is corrupted: 100001 steps")));
}

TEST_F(FakeCaptureTest, ABadDigestPatternIsAnInvalidArgumentBeforeAnythingIsCaptured) {
  servers_.Add("a:1", {.host_name = "a"});
  options_.targets = {{"a:1", ""}};
  (*options_.profile.mutable_advanced_configuration())["clusterprof_step_pattern"].set_string_value(
      "train(");
  absl::StatusOr<RunResult> result = Capture(options_, clock_);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(), HasSubstr("the step pattern 'train(' is not"));
  EXPECT_TRUE(servers_.ProfileRequests("a:1").empty());
}

TEST_F(FakeCaptureTest, ResumingReadsFinishedSessionsBackInsteadOfCapturingAgain) {
  servers_.Add("a:1", {.host_name = "a"});
  servers_.Add("b:1", {.host_name = "b"});
  options_.targets = {{"a:1", ""}, {"b:1", ""}};
  ASSERT_TRUE(Capture(options_, clock_).ok());
  const int64_t t0 = servers_.ProfileRequests("a:1").at(0).opts().start_timestamp_ns();

  // A restarted operator resumes the run: both sessions are done on the sidecars.
  options_.resume = true;
  options_.start_at_ns = t0;
  options_.attempts_used = 1;
  absl::StatusOr<RunResult> result = Capture(options_, clock_);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->succeeded, 2);
  for (const TargetResult& target : result->targets) {
    EXPECT_TRUE(target.recovered) << target.address;
    EXPECT_EQ(target.events, 100u);
  }
  EXPECT_EQ(servers_.ProfileRequests("a:1").size(), 1u) << "not captured again";
  EXPECT_EQ(servers_.ProfileRequests("b:1").size(), 1u);
}

TEST_F(FakeCaptureTest, BeforeAttemptSeesEachT0AndItsErrorStopsTheCapture) {
  servers_.Add("a:1", {.host_name = "a"});
  options_.targets = {{"a:1", ""}};
  std::vector<std::pair<int, int64_t>> seen;
  options_.before_attempt = [&](int attempt, int64_t t0_ns) {
    seen.emplace_back(attempt, t0_ns);
    return absl::FailedPreconditionError("the job was deleted");
  };
  absl::StatusOr<RunResult> result = Capture(options_, clock_);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].first, 1);
  EXPECT_TRUE(servers_.ProfileRequests("a:1").empty()) << "nothing sent for a refused attempt";
}

TEST_F(FakeCaptureTest, CancellingEndsCallsInFlightAndReturnsCancelledWithoutAManifest) {
  servers_.Add("a:1", {.host_name = "a", .hold_profile = true});
  servers_.Add("b:1", {.host_name = "b", .hold_profile = true});
  options_.targets = {{"a:1", ""}, {"b:1", ""}};
  CancelToken cancel;
  options_.cancel = &cancel;
  std::thread canceller([&] {
    servers_.WaitForHeld(2);
    cancel.Cancel();
  });
  absl::StatusOr<RunResult> result = Capture(options_, clock_);
  canceller.join();
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(result.status().message(), HasSubstr("run1"));
  EXPECT_FALSE(std::ifstream(dir_.Join("plugins/profile/run1/clusterprof_run.json")).good());
}

TEST_F(FakeCaptureTest, CancellingDuringTheBackoffEndsTheSleep) {
  servers_.Add("a:1", {.profile_errors = {absl::UnavailableError("restarting")}});
  options_.targets = {{"a:1", ""}};
  options_.retry_backoff_ms = 60'000;
  CancelToken cancel;
  options_.cancel = &cancel;
  std::thread canceller([&] {
    clock_.WaitForSleepers(1);  // the backoff; the simulated clock never reaches its end
    cancel.Cancel();
  });
  absl::StatusOr<RunResult> result = Capture(options_, clock_);
  canceller.join();
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(servers_.ProfileRequests("a:1").size(), 1u);
}

// Released calls (outlive_client): a sidecar that says it took the request is let go of, and
// its session read back once it ends.
class ReleasedCallTest : public FakeCaptureTest {
 protected:
  ReleasedCallTest() { options_.outlive_client = true; }
  void AddSidecar(const std::string& address, FakeProfilers::Script script = {}) {
    script.host_name = address.substr(0, address.find(':'));
    script.announce_accept = true;
    servers_.Add(address, std::move(script));
    options_.targets.push_back({address, ""});
  }
};

TEST_F(ReleasedCallTest, ATakenRequestIsLetGoAndItsResultsAreReadFromTheSessionAfterItsEnd) {
  AddSidecar("a:1", {.clock_offset_ns = 3 * kNanosPerMilli});
  AddSidecar("b:1");
  absl::StatusOr<RunResult> result = CaptureAdvancing();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->succeeded, 2);
  for (const char* address : {"a:1", "b:1"}) {
    const TargetResult& target = Find(*result, address);
    EXPECT_EQ(target.outcome, Outcome::kOk) << address << ": " << target.message;
    EXPECT_EQ(target.attempts, 1);
    EXPECT_EQ(target.events, 100u) << "read from the session";
    EXPECT_TRUE(target.start_known);
    EXPECT_EQ(target.start_error_ns, 0);
    EXPECT_EQ(target.phase, Phase::kDone);
    EXPECT_THAT(target.files, ElementsAre(HasSubstr("/plugins/profile/run1/")));
  }
  // The fake's session reads WAITING until its planned end: a result means it was read after.
  EXPECT_GE(servers_.GetSessionCalls("a:1"), 1);
  EXPECT_EQ(servers_.ProfileRequests("a:1").size(), 1u);
  EXPECT_EQ(Find(*result, "a:1").clock_offset_ns, 3 * kNanosPerMilli);
}

TEST_F(ReleasedCallTest, AStopEndsEveryRecordingEarlyAndCollectsWhatItRecorded) {
  AddSidecar("a:1");
  AddSidecar("b:1");
  options_.duration_ms = 60'000;
  options_.num_tracing_attempts = 3;
  CancelToken stop;
  options_.stop = &stop;
  // Once both sidecars took their request (their sessions run).
  std::atomic<int> profiled{0};
  servers_.OnProfile([&](const std::string&) {
    if (++profiled == 2) stop.Cancel();
  });
  absl::StatusOr<RunResult> result = CaptureAdvancing();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->succeeded, 2);
  EXPECT_GT(result->stopped_ns, 0);
  EXPECT_LT(result->stopped_ns, result->t0_ns + 60 * kNanosPerSecond);
  for (const char* address : {"a:1", "b:1"}) {
    EXPECT_GE(servers_.TerminateCalls(address), 1) << address;
    EXPECT_EQ(servers_.ProfileRequests(address).size(), 1u) << "no retry after a stop";
    EXPECT_EQ(Find(*result, address).outcome, Outcome::kOk) << address;
  }
}

TEST_F(FakeCaptureTest, AStopAnswersHeldCallsWithWhatWasRecorded) {
  servers_.Add("a:1", {.host_name = "a", .hold_profile = true});
  servers_.Add("b:1", {.host_name = "b", .hold_profile = true});
  options_.targets = {{"a:1", ""}, {"b:1", ""}};
  options_.duration_ms = 60'000;
  CancelToken stop;
  options_.stop = &stop;
  std::thread stopper([&] {
    servers_.WaitForHeld(2);
    stop.Cancel();
  });
  absl::StatusOr<RunResult> result = CaptureAdvancing();
  stopper.join();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->succeeded, 2);
  EXPECT_GT(result->stopped_ns, 0);
  EXPECT_EQ(servers_.TerminateCalls("a:1"), servers_.TerminateCalls("b:1"));
  EXPECT_GE(servers_.TerminateCalls("a:1"), 1);
}

TEST_F(ReleasedCallTest, AServerThatNeverSaysItTookTheRequestKeepsItsCall) {
  AddSidecar("a:1");
  servers_.Add("tf:1", {.is_sidecar = false});
  options_.targets.push_back({"tf:1", ""});
  absl::StatusOr<RunResult> result = CaptureAdvancing();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->succeeded, 2);
  EXPECT_EQ(Find(*result, "tf:1").outcome, Outcome::kOk);
  EXPECT_THAT(Find(*result, "tf:1").digest_note, HasSubstr("TF/JAX"));
}

TEST_F(ReleasedCallTest, ASidecarOfBeforeTheAnnouncementKeepsItsCallAndIsReadAfterIt) {
  AddSidecar("a:1");
  // It answers GetInfo without announces_accepted, and never says it took a request.
  servers_.Add("old:1", {.host_name = "old", .hold_profile = true});
  options_.targets.push_back({"old:1", ""});
  std::thread releaser([&] {
    servers_.WaitForHeld("old:1");
    servers_.Release();
  });
  absl::StatusOr<RunResult> result = CaptureAdvancing();
  releaser.join();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->succeeded, 2);
  EXPECT_EQ(Find(*result, "old:1").outcome, Outcome::kOk);
  EXPECT_EQ(Find(*result, "old:1").events, 100u) << "its session read after its call ended";
}

TEST_F(ReleasedCallTest, ASidecarThatLostTheSessionIsCapturedAgain) {
  AddSidecar("a:1");
  AddSidecar("b:1", {.restarts_during_capture = true});
  absl::StatusOr<RunResult> result = CaptureAdvancing();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->succeeded, 2);
  EXPECT_EQ(Find(*result, "a:1").attempts, 1);
  EXPECT_EQ(Find(*result, "b:1").attempts, 2)
      << "the lost session is retried, as a dropped call: " << Find(*result, "b:1").message;
  EXPECT_EQ(servers_.ProfileRequests("b:1").size(), 2u);
}

TEST_F(ReleasedCallTest, AFailedSessionFailsItsTargetWithItsCodeAndIsNotRetried) {
  AddSidecar("a:1");
  AddSidecar("b:1", {.session_failure = absl::AbortedError("the sidecar shut down")});
  absl::StatusOr<RunResult> result = CaptureAdvancing();
  ASSERT_TRUE(result.ok()) << result.status();
  const TargetResult& b = Find(*result, "b:1");
  EXPECT_EQ(b.outcome, Outcome::kFailed);
  EXPECT_EQ(b.message, "ABORTED: the sidecar shut down");
  EXPECT_EQ(b.attempts, 1);
  EXPECT_EQ(result->succeeded, 1);
}

TEST_F(ReleasedCallTest, CancellingWhileTheSessionsRunReturnsCancelled) {
  AddSidecar("a:1");
  CancelToken cancel;
  options_.cancel = &cancel;
  std::thread canceller([&] {
    clock_.WaitForSleepers(1);  // waiting for the session's end; the simulated clock stands
    cancel.Cancel();
  });
  absl::StatusOr<RunResult> result = Capture(options_, clock_);
  canceller.join();
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(servers_.ProfileRequests("a:1").size(), 1u);
}

TEST_F(ReleasedCallTest, ConnectionsOpenAtOnceStayBoundedWhateverTheTargets) {
  // 1,500 pods on 15 nodes: the probes keep two connections a node, the window 512 more.
  for (int i = 0; i < 1500; ++i) {
    const std::string address = StrCat("p", i, ":1");
    servers_.Add(address, {.host_name = StrCat("p", i), .announce_accept = true});
    options_.targets.push_back({address, StrCat("p", i), StrCat("node-", i / 100)});
  }
  absl::StatusOr<RunResult> result = CaptureAdvancing();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->succeeded, 1500);
  EXPECT_LE(servers_.MaxConnections(), 15 * 2 + 512);
  EXPECT_GT(servers_.MaxConnections(), 0);

  // A restarted coordinator resuming the run reads every session back, a window at a time.
  options_.resume = true;
  options_.start_at_ns = result->t0_ns;
  options_.attempts_used = 1;
  absl::StatusOr<RunResult> resumed = CaptureAdvancing();
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->succeeded, 1500);
  EXPECT_TRUE(resumed->targets[1499].recovered);
  EXPECT_EQ(servers_.ProfileRequests("p1499:1").size(), 1u) << "not captured again";
  EXPECT_LE(servers_.MaxConnections(), 15 * 2 + 512);
}

// Per-node clock probes. The fake answers at once (round trip 0): every estimate is exact, so
// two estimates of one clock agree exactly and two clocks that differ disagree.
class NodeClockTest : public FakeCaptureTest {
 protected:
  // A sidecar on `node`, `offset_ms` off the test clock.
  void AddPod(const std::string& address, const std::string& name, const std::string& node,
              int64_t offset_ms, bool is_sidecar = true) {
    servers_.Add(address, {.is_sidecar = is_sidecar,
                           .host_name = name,
                           .clock_offset_ns = offset_ms * kNanosPerMilli});
    options_.targets.push_back({address, name, node});
  }
  int64_t RequestedStart(const std::string& address) {
    const std::vector<tensorflow::ProfileRequest> requests = servers_.ProfileRequests(address);
    EXPECT_EQ(requests.size(), 1u) << address;
    return requests.empty() ? 0 : static_cast<int64_t>(requests[0].opts().start_timestamp_ns());
  }
};

TEST_F(NodeClockTest, TwoTargetsOfANodeAreProbedAndTheRestGetTheirOffset) {
  for (int i = 0; i < 4; ++i) AddPod(StrCat("a", i, ":1"), StrCat("a", i), "node-a", 3);
  AddPod("b0:1", "b0", "node-b", -2);
  options_.targets.push_back({"c0:1", "c0", ""});  // no node: probed itself
  servers_.Add("c0:1", {.host_name = "c0", .clock_offset_ns = 5 * kNanosPerMilli});
  absl::StatusOr<RunResult> result = Capture(options_, clock_);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->succeeded, 6);

  EXPECT_EQ(servers_.GetInfoCalls("a0:1"), options_.clock_probes);
  EXPECT_EQ(servers_.GetInfoCalls("a1:1"), options_.clock_probes) << "the check";
  EXPECT_EQ(servers_.GetInfoCalls("a2:1"), 1) << "only its clock check, after the capture";
  EXPECT_EQ(servers_.GetInfoCalls("a3:1"), 1);
  EXPECT_EQ(servers_.GetInfoCalls("b0:1"), options_.clock_probes);
  EXPECT_EQ(servers_.GetInfoCalls("c0:1"), options_.clock_probes);
  for (int i = 0; i < 4; ++i) {
    const std::string address = StrCat("a", i, ":1");
    const TargetResult& target = Find(*result, address);
    EXPECT_EQ(target.clock_offset_ns, 3 * kNanosPerMilli) << address;
    EXPECT_EQ(target.clock_uncertainty_ns, 0) << address;
    EXPECT_TRUE(target.clock_offset_applied) << address;
    EXPECT_TRUE(target.is_sidecar) << address;
    EXPECT_EQ(target.node, "node-a");
    EXPECT_EQ(target.clock_probed_via, i < 2 ? "" : "a0:1") << address;
    EXPECT_EQ(RequestedStart(address), result->t0_ns + 3 * kNanosPerMilli) << address;
    EXPECT_EQ(target.start_error_ns, 0) << address;
    EXPECT_TRUE(target.warnings.empty()) << address;
  }
  EXPECT_EQ(RequestedStart("b0:1"), result->t0_ns - 2 * kNanosPerMilli);
  EXPECT_EQ(RequestedStart("c0:1"), result->t0_ns + 5 * kNanosPerMilli);
}

TEST_F(NodeClockTest, OffProbesEveryTarget) {
  for (int i = 0; i < 4; ++i) AddPod(StrCat("a", i, ":1"), StrCat("a", i), "node-a", 3);
  options_.clock_probe_per_node = false;
  absl::StatusOr<RunResult> result = Capture(options_, clock_);
  ASSERT_TRUE(result.ok()) << result.status();
  for (int i = 0; i < 4; ++i) {
    const std::string address = StrCat("a", i, ":1");
    EXPECT_EQ(servers_.GetInfoCalls(address), options_.clock_probes) << address;
    EXPECT_EQ(Find(*result, address).clock_probed_via, "") << address;
    EXPECT_EQ(RequestedStart(address), result->t0_ns + 3 * kNanosPerMilli) << address;
  }
}

TEST_F(NodeClockTest, WhenTheTwoProbedDisagreeEveryTargetOfTheNodeIsProbed) {
  AddPod("a0:1", "a0", "node-a", 3);
  AddPod("a1:1", "a1", "node-a", 7);
  AddPod("a2:1", "a2", "node-a", -4);
  AddPod("a3:1", "a3", "node-a", 3);
  absl::StatusOr<RunResult> result = Capture(options_, clock_);
  ASSERT_TRUE(result.ok()) << result.status();
  const std::map<std::string, int64_t> offsets = {
      {"a0:1", 3}, {"a1:1", 7}, {"a2:1", -4}, {"a3:1", 3}};
  for (const auto& [address, offset_ms] : offsets) {
    EXPECT_EQ(servers_.GetInfoCalls(address), options_.clock_probes) << address;
    EXPECT_EQ(Find(*result, address).clock_offset_ns, offset_ms * kNanosPerMilli) << address;
    EXPECT_EQ(Find(*result, address).clock_probed_via, "") << address;
    EXPECT_EQ(RequestedStart(address), result->t0_ns + offset_ms * kNanosPerMilli) << address;
  }
}

TEST_F(NodeClockTest, ATargetWhoseClockDiffersFromItsNodesIsJudgedOnItsOwnClock) {
  AddPod("a0:1", "a0", "node-a", 3);
  AddPod("a1:1", "a1", "node-a", 3);
  AddPod("a2:1", "a2", "node-a", 10);  // not the node's clock after all
  absl::StatusOr<RunResult> result = Capture(options_, clock_);
  ASSERT_TRUE(result.ok()) << result.status();
  // Asked for T0 on the node's clock: it starts at T0 + 3 ms on its own, 7 ms before T0.
  EXPECT_EQ(RequestedStart("a2:1"), result->t0_ns + 3 * kNanosPerMilli);
  const TargetResult& odd = Find(*result, "a2:1");
  EXPECT_EQ(servers_.GetInfoCalls("a2:1"), 1);
  EXPECT_EQ(odd.clock_offset_ns, 10 * kNanosPerMilli);
  EXPECT_EQ(odd.clock_probed_via, "") << "its offset is its own now";
  EXPECT_TRUE(odd.start_known);
  EXPECT_EQ(odd.achieved_start_ns, result->t0_ns - 7 * kNanosPerMilli);
  EXPECT_EQ(odd.start_error_ns, -7 * kNanosPerMilli);
  EXPECT_EQ(result->max_start_skew_ns, 7 * kNanosPerMilli);
  EXPECT_THAT(odd.warnings, ElementsAre(HasSubstr("its clock disagrees with node node-a's")));
  EXPECT_EQ(Find(*result, "a0:1").start_error_ns, 0);
}

TEST_F(NodeClockTest, ANodeWhoseProbedTargetsAreNotSidecarsHasTheRestProbed) {
  AddPod("a0:1", "a0", "node-a", 0, /*is_sidecar=*/false);
  AddPod("a1:1", "a1", "node-a", 0, /*is_sidecar=*/false);
  AddPod("a2:1", "a2", "node-a", 4);
  absl::StatusOr<RunResult> result = Capture(options_, clock_);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(servers_.GetInfoCalls("a2:1"), options_.clock_probes);
  EXPECT_EQ(Find(*result, "a2:1").clock_offset_ns, 4 * kNanosPerMilli);
  EXPECT_EQ(Find(*result, "a2:1").clock_probed_via, "");
  EXPECT_EQ(Find(*result, "a0:1").clock_uncertainty_ns, -1) << "a TF/JAX server: unknown";
}

TEST_F(NodeClockTest, ATargetGivenItsNodesOffsetThatIsNoSidecarIsTreatedAsTfJax) {
  AddPod("a0:1", "a0", "node-a", 3);
  AddPod("a1:1", "a1", "node-a", 3);
  AddPod("a2:1", "a2", "node-a", 3, /*is_sidecar=*/false);
  absl::StatusOr<RunResult> result = Capture(options_, clock_);
  ASSERT_TRUE(result.ok()) << result.status();
  const TargetResult& tf = Find(*result, "a2:1");
  EXPECT_FALSE(tf.is_sidecar);
  EXPECT_TRUE(tf.warnings.empty());
  EXPECT_THAT(tf.digest_note, HasSubstr("TF/JAX"));
  EXPECT_EQ(RequestedStart("a2:1"), result->t0_ns + 3 * kNanosPerMilli) << "its node's clock";
}

TEST_F(NodeClockTest, ATargetWithoutAHostNameIsProbedForItsName) {
  for (int i = 0; i < 3; ++i) {
    servers_.Add(StrCat("a", i, ":1"), {.host_name = StrCat("worker-", i)});
    options_.targets.push_back({StrCat("a", i, ":1"), "", "node-a"});
  }
  absl::StatusOr<RunResult> result = Capture(options_, clock_);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(servers_.GetInfoCalls("a2:1"), options_.clock_probes);
  EXPECT_EQ(Find(*result, "a2:1").host_name, "worker-2");
}

}  // namespace
}  // namespace clusterprof::coordinator
