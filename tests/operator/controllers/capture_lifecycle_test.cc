#include "operator/controllers/capture_lifecycle.h"

#include "analysis/report.h"
#include "common/base/clock.h"
#include "common/storage/logdir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace clusterprof::controllers {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

coordinator::TargetResult Target(const std::string& name, coordinator::Outcome outcome,
                                 const std::string& message = "") {
  coordinator::TargetResult target;
  target.host_name = name;
  target.address = name + ":8466";
  target.outcome = outcome;
  target.message = message;
  target.attempts = 1;
  if (outcome == coordinator::Outcome::kOk) {
    target.files = {"/logs/plugins/profile/r1/" + name + ".xplane.pb",
                    "/logs/plugins/profile/r1/" + name + ".trace.json.gz"};
    target.events = 10;
  }
  return target;
}

coordinator::RunResult RunOf(std::vector<coordinator::TargetResult> targets) {
  coordinator::RunResult result;
  result.run = "r1";
  result.attempt = 1;
  for (const auto& target : targets) {
    result.succeeded += target.outcome == coordinator::Outcome::kOk;
    result.empty += target.outcome == coordinator::Outcome::kEmpty;
    result.failed += target.outcome == coordinator::Outcome::kFailed;
  }
  result.targets = std::move(targets);
  result.max_start_skew_ns = 42'400;
  return result;
}

api::ProfileJobStatus Capturing(const std::string& run) {
  api::ProfileJobStatus status;
  status.phase = api::JobPhase::kCapturing;
  status.run_name = run;
  status.attempt = 1;
  status.targets = {api::TargetStatus{.name = "a", .address = "a:8466", .node = "node-1"},
                    api::TargetStatus{.name = "b", .address = "b:8466", .node = "node-2"}};
  return status;
}

TEST(CaptureOptionsForTest, TheSpecAndStatusBecomeTheCoordinatorsOptions) {
  api::ProfileJobSpec spec;
  spec.duration_ms = 3000;
  spec.delay_ms = 500;
  spec.tracing_attempts = 4;
  spec.profile_options.set_host_tracer_level(3);
  spec.profile_options.set_device_tracer_level(0);
  spec.profile_options.set_python_tracer_level(1);
  (*spec.profile_options.mutable_advanced_configuration())["gpu_max_activity_api_events"]
      .set_int64_value(1000);
  spec.parsed_logdir = *storage::ParseLogdir("/logs");
  api::ProfileJobStatus status = Capturing("r1");
  status.start_time_ns = 123;
  status.attempt = 3;
  const CaptureSettings settings{.fan_out_lead_ms = 300,
                                 .retry_backoff_ms = 7,
                                 .grace_ms = 9,
                                 .clock_probes = 2,
                                 .auth_token = "t"};

  const coordinator::CaptureOptions fresh = CaptureOptionsFor(spec, status, settings, false);
  ASSERT_EQ(fresh.targets.size(), 2u);
  EXPECT_EQ(fresh.targets[1].address, "b:8466");
  EXPECT_EQ(fresh.targets[1].host_name, "b");
  EXPECT_EQ(fresh.run, "r1");
  EXPECT_EQ(fresh.duration_ms, 3000);
  EXPECT_EQ(fresh.delay_ms, 500);
  EXPECT_EQ(fresh.num_tracing_attempts, 4);
  EXPECT_EQ(fresh.profile.host_tracer_level(), 3u);
  EXPECT_EQ(fresh.profile.device_tracer_level(), 0u);
  EXPECT_EQ(fresh.profile.python_tracer_level(), 1u);
  EXPECT_EQ(fresh.profile.advanced_configuration().at("gpu_max_activity_api_events").int64_value(),
            1000);
  EXPECT_EQ(fresh.fan_out_lead_ms, 300);
  EXPECT_EQ(fresh.retry_backoff_ms, 7);
  EXPECT_EQ(fresh.grace_ms, 9);
  EXPECT_EQ(fresh.clock_probes, 2);
  EXPECT_EQ(fresh.auth_token, "t");
  EXPECT_EQ(fresh.start_at_ns, 123);
  EXPECT_TRUE(fresh.outlive_client);
  EXPECT_FALSE(fresh.resume);
  EXPECT_EQ(fresh.attempts_used, 0);

  const coordinator::CaptureOptions resumed = CaptureOptionsFor(spec, status, settings, true);
  EXPECT_TRUE(resumed.resume);
  EXPECT_EQ(resumed.attempts_used, 2) << "the attempt under way is made again";
}

TEST(PhaseForTest, FromTheTargetsWithData) {
  using coordinator::Outcome;
  struct Case {
    std::vector<Outcome> outcomes;
    api::JobPhase want;
  } cases[] = {
      {{Outcome::kOk, Outcome::kOk}, api::JobPhase::kSucceeded},
      {{Outcome::kOk, Outcome::kEmpty}, api::JobPhase::kPartiallySucceeded},
      {{Outcome::kOk, Outcome::kFailed}, api::JobPhase::kPartiallySucceeded},
      {{Outcome::kEmpty, Outcome::kFailed}, api::JobPhase::kFailed},
      {{Outcome::kFailed}, api::JobPhase::kFailed},
      {{}, api::JobPhase::kFailed},
  };
  for (const Case& c : cases) {
    std::vector<coordinator::TargetResult> targets;
    for (size_t i = 0; i < c.outcomes.size(); ++i) {
      targets.push_back(Target("t" + std::to_string(i), c.outcomes[i]));
    }
    EXPECT_EQ(PhaseFor(RunOf(targets)), c.want) << c.outcomes.size() << " targets";
  }
}

TEST(TargetStatusForTest, CarriesTheResultAndThePlannedNode) {
  coordinator::TargetResult result = Target("a", coordinator::Outcome::kOk);
  result.clock_offset_ns = 5;
  result.clock_uncertainty_ns = 2;
  result.start_error_ns = -3;
  result.warnings = {"ring overflowed"};
  result.recovered = true;
  const api::TargetStatus status = TargetStatusFor(result, Capturing("r1").targets);
  EXPECT_EQ(status.name, "a");
  EXPECT_EQ(status.node, "node-1");
  EXPECT_EQ(status.phase, "Succeeded");
  EXPECT_EQ(status.file, "/logs/plugins/profile/r1/a.xplane.pb") << "the XSpace, not the JSON";
  EXPECT_EQ(status.events, 10);
  EXPECT_EQ(status.clock_offset_ns, 5);
  EXPECT_EQ(status.clock_uncertainty_ns, 2);
  EXPECT_EQ(status.start_error_ns, -3);
  EXPECT_EQ(status.message, "warnings: ring overflowed (read back after an operator restart)");

  const api::TargetStatus empty =
      TargetStatusFor(Target("b", coordinator::Outcome::kEmpty), Capturing("r1").targets);
  EXPECT_EQ(empty.phase, "Empty");
  EXPECT_EQ(empty.message, "no trace data");
  EXPECT_EQ(empty.node, "node-2");
}

TEST(TargetStatusForTest, ASidecarThatDoesNotListenIsNamedWithWhereToLook) {
  const coordinator::TargetResult refused =
      Target("a", coordinator::Outcome::kFailed,
             "UNAVAILABLE: failed to connect to all addresses; last error: UNKNOWN: "
             "ipv4:10.78.0.21:8466: Failed to connect to remote host: Connection refused");
  const api::TargetStatus status = TargetStatusFor(refused, Capturing("r1").targets);
  EXPECT_EQ(status.phase, "Failed");
  EXPECT_THAT(status.message,
              AllOf(HasSubstr("Connection refused"), HasSubstr("the sidecar is not serving"),
                    HasSubstr("kubectl logs POD -c clusterprof-sidecar")));
  EXPECT_THAT(TargetFailures(RunOf({refused})),
              ElementsAre(AllOf(HasSubstr("a (a:8466): UNAVAILABLE"),
                                HasSubstr("the sidecar is not serving"))));
  // Other failures keep the coordinator's words.
  const coordinator::TargetResult refused_logdir =
      Target("b", coordinator::Outcome::kFailed, "PERMISSION_DENIED: logdir not allowed");
  EXPECT_EQ(TargetStatusFor(refused_logdir, Capturing("r1").targets).message,
            "PERMISSION_DENIED: logdir not allowed");
}

TEST(FinalStatusTest, WritesThePhaseTargetsSummaryAndCondition) {
  api::ProfileJobStatus status = Capturing("r1");
  const coordinator::RunResult result =
      RunOf({Target("a", coordinator::Outcome::kOk),
             Target("b", coordinator::Outcome::kFailed, "UNAVAILABLE: connection refused")});
  const int64_t now = SimulatedClock::kDefaultWallNs;
  ASSERT_TRUE(FinalStatus(status, "r1", result, now).ok());
  EXPECT_EQ(status.phase, api::JobPhase::kPartiallySucceeded);
  EXPECT_EQ(status.message,
            "1 of 2 target(s) captured; b (b:8466): UNAVAILABLE: connection refused");
  EXPECT_EQ(status.completion_time, "2026-01-01T00:00:00Z");
  ASSERT_EQ(status.targets.size(), 2u);
  EXPECT_EQ(status.targets[1].node, "node-2");
  ASSERT_TRUE(status.summary.has_value());
  EXPECT_EQ(status.summary->succeeded, 1);
  EXPECT_EQ(status.summary->failed, 1);
  ASSERT_EQ(status.conditions.size(), 1u);
  EXPECT_EQ(status.conditions[0].type, "Complete");
  EXPECT_EQ(status.conditions[0].reason, "PartiallySucceeded");
}

// A report in which `b` straggles on compute and `c` was left out.
std::shared_ptr<const analysis::RunReport> ReportWithStraggler() {
  auto report = std::make_shared<analysis::RunReport>();
  analysis::Analysis& a = report->analysis;
  a.first_step = 10;
  a.last_step = 59;
  a.steps = 50;
  a.compared_steps = 48;
  a.hosts.push_back({.host = "a", .steps = 50, .step_p50_ns = 27'000'000});
  a.hosts.push_back({.host = "b",
                     .steps = 50,
                     .step_p50_ns = 27'100'000,
                     .straggler = true,
                     .late_steps = 45,
                     .median_lateness_ns = 6'000'000,
                     .others_wait_ns = 270'000'000,
                     .cause = analysis::Cause::kCompute,
                     .evidence = "enters the collectives 6.0 ms late (median) in 45 of 48 steps"});
  a.left_out = {"c: an empty trace"};
  return report;
}

TEST(AnalysisForTest, NamesTheStragglersWithTheirNodesAndTheReportFiles) {
  coordinator::RunResult result = RunOf({Target("a", coordinator::Outcome::kOk)});
  result.report = ReportWithStraggler();
  result.report_html_uri = "/logs/plugins/profile/r1/clusterprof_report.html";
  result.report_json_uri = "/logs/plugins/profile/r1/clusterprof_report.json";
  const api::JobAnalysis analysis = AnalysisFor(result, Capturing("r1").targets);
  EXPECT_EQ(analysis.stragglers, "b");
  EXPECT_EQ(analysis.steps, 50);
  EXPECT_EQ(analysis.compared_steps, 48);
  ASSERT_EQ(analysis.hosts.size(), 2u);
  EXPECT_EQ(analysis.hosts[0].node, "node-1");
  EXPECT_FALSE(analysis.hosts[0].straggler);
  EXPECT_EQ(analysis.hosts[0].cause, "") << "a cause only for stragglers";
  EXPECT_EQ(analysis.hosts[1].node, "node-2");
  EXPECT_EQ(analysis.hosts[1].cause, "compute");
  EXPECT_EQ(analysis.hosts[1].late_steps, 45);
  EXPECT_THAT(analysis.left_out, ::testing::ElementsAre("c: an empty trace"));
  EXPECT_EQ(analysis.report_uri, result.report_html_uri);
  EXPECT_EQ(StragglerMessages(analysis),
            std::vector<std::string>{
                "pod b on node node-2 holds the job back (compute): enters the collectives "
                "6.0 ms late (median) in 45 of 48 steps"});

  result.report = std::make_shared<analysis::RunReport>();
  EXPECT_EQ(AnalysisFor(result, {}).stragglers, "none");
  EXPECT_TRUE(StragglerMessages(AnalysisFor(result, {})).empty());
}

TEST(FinalStatusTest, CarriesTheAnalysisWhenTheRunHasAReport) {
  api::ProfileJobStatus status = Capturing("r1");
  coordinator::RunResult result = RunOf({Target("a", coordinator::Outcome::kOk)});
  ASSERT_TRUE(FinalStatus(status, "r1", result, 0).ok());
  EXPECT_FALSE(status.analysis.has_value()) << "no report, no analysis";
  status = Capturing("r1");
  result.report = ReportWithStraggler();
  ASSERT_TRUE(FinalStatus(status, "r1", result, 0).ok());
  ASSERT_TRUE(status.analysis.has_value());
  EXPECT_EQ(status.analysis->stragglers, "b");
}

TEST(FinalStatusTest, AllFailedIsFailedWithNoTraceData) {
  api::ProfileJobStatus status = Capturing("r1");
  ASSERT_TRUE(
      FinalStatus(status, "r1", RunOf({Target("a", coordinator::Outcome::kEmpty)}), 0).ok());
  EXPECT_EQ(status.phase, api::JobPhase::kFailed);
  ASSERT_EQ(status.conditions.size(), 1u);
  EXPECT_EQ(status.conditions[0].type, "Failed");
  EXPECT_EQ(status.conditions[0].reason, "NoTraceData");
}

TEST(FinalStatusTest, AJobThatMovedOnIsLeftAsItIs) {
  api::ProfileJobStatus other_run = Capturing("r2");
  EXPECT_TRUE(absl::IsFailedPrecondition(
      FinalStatus(other_run, "r1", RunOf({Target("a", coordinator::Outcome::kOk)}), 0)));
  EXPECT_EQ(other_run.phase, api::JobPhase::kCapturing);
  api::ProfileJobStatus finished = Capturing("r1");
  finished.phase = api::JobPhase::kSucceeded;
  EXPECT_TRUE(absl::IsFailedPrecondition(CaptureErrorStatus(finished, "r1", "bad", 0)));
  EXPECT_EQ(finished.phase, api::JobPhase::kSucceeded);
}

TEST(CaptureErrorStatusTest, FailsTheJobWithTheReason) {
  api::ProfileJobStatus status = Capturing("r1");
  ASSERT_TRUE(CaptureErrorStatus(status, "r1", "the logdir is refused", 0).ok());
  EXPECT_EQ(status.phase, api::JobPhase::kFailed);
  EXPECT_EQ(status.message, "the capture could not start: the logdir is refused");
  EXPECT_EQ(status.conditions.at(0).reason, "CaptureError");
}

TEST(AttemptEventForTest, StartedResumedOrRetried) {
  EXPECT_EQ(AttemptEventFor(1, 0, false, 0, 3, 4, "r1").reason, "CaptureStarted");
  EXPECT_THAT(AttemptEventFor(1, 0, false, 0, 3, 4, "r1").message,
              HasSubstr("Profile requests sent to 4 target(s)"));
  EXPECT_EQ(AttemptEventFor(3, 0, true, 2, 3, 4, "r1").reason, "CaptureResumed");
  EXPECT_EQ(AttemptEventFor(2, 0, false, 0, 3, 4, "r1").reason, "CaptureRetried");
  EXPECT_THAT(AttemptEventFor(2, 0, false, 0, 3, 4, "r1").message, HasSubstr("attempt 2 of 3"));
  EXPECT_EQ(AttemptEventFor(4, 0, true, 2, 5, 4, "r1").reason, "CaptureRetried");
}

TEST(JoinNamesTest, ShortensLongLists) {
  EXPECT_EQ(JoinNames({"a", "b"}, 5), "a, b");
  EXPECT_EQ(JoinNames({"a", "b", "c", "d"}, 2), "a, b, and 2 more");
  EXPECT_EQ(JoinNames({}, 2), "");
}

}  // namespace
}  // namespace clusterprof::controllers
