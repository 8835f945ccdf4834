#include "operator/controllers/capture_lifecycle.h"

#include <functional>
#include <iostream>

#include "analysis/report.h"
#include "common/base/clock.h"
#include "common/base/strings.h"
#include "common/storage/logdir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace clusterprof::controllers {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

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
  return status;
}

// What the capture was asked of: a on node-1, b on node-2.
TargetResolution Plan() {
  TargetResolution plan;
  plan.targets = {{"a", "a:8466", "node-1"}, {"b", "b:8466", "node-2"}};
  return plan;
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
  spec.logdir = *storage::ParseLogdir("/logs");
  api::ProfileJobStatus status = Capturing("r1");
  status.start_time_ns = 123;
  status.attempt = 3;
  const CaptureSettings settings{.fan_out_lead_ms = 300,
                                 .retry_backoff_ms = 7,
                                 .grace_ms = 9,
                                 .clock_probes = 2,
                                 .auth_token = "t"};

  const coordinator::CaptureOptions fresh =
      *CaptureOptionsFor(spec, status, Plan().targets, settings, false);
  ASSERT_EQ(fresh.targets.size(), 2u);
  EXPECT_EQ(fresh.targets[1].address, "b:8466");
  EXPECT_EQ(fresh.targets[1].host_name, "b");
  ASSERT_TRUE(fresh.layout.has_value());
  EXPECT_EQ(fresh.layout->RunDir(), "/logs/plugins/profile/r1");
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

  const coordinator::CaptureOptions resumed =
      *CaptureOptionsFor(spec, status, Plan().targets, settings, true);
  EXPECT_TRUE(resumed.resume);
  EXPECT_EQ(resumed.attempts_used, 2) << "the attempt under way is made again";

  // A run name that is not one (a status edited by hand) is refused, not captured.
  status.run_name = "../elsewhere";
  absl::StatusOr<coordinator::CaptureOptions> refused =
      CaptureOptionsFor(spec, status, Plan().targets, settings, false);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), ::testing::HasSubstr("run name"));
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
  const api::TargetStatus status = TargetStatusFor(result, "node-1");
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
      TargetStatusFor(Target("b", coordinator::Outcome::kEmpty), "node-2");
  EXPECT_EQ(empty.phase, "Empty");
  EXPECT_EQ(empty.message, "no trace data");
  EXPECT_EQ(empty.node, "node-2");
}

TEST(TargetStatusForTest, ASidecarThatDoesNotListenIsNamedWithWhereToLook) {
  const coordinator::TargetResult refused =
      Target("a", coordinator::Outcome::kFailed,
             "UNAVAILABLE: failed to connect to all addresses; last error: UNKNOWN: "
             "ipv4:10.78.0.21:8466: Failed to connect to remote host: Connection refused");
  const api::TargetStatus status = TargetStatusFor(refused, "");
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
  EXPECT_EQ(TargetStatusFor(refused_logdir, "").message, "PERMISSION_DENIED: logdir not allowed");
}

TEST(FinalStatusTest, WritesThePhaseTargetsSummaryAndCondition) {
  api::ProfileJobStatus status = Capturing("r1");
  const coordinator::RunResult result =
      RunOf({Target("a", coordinator::Outcome::kOk),
             Target("b", coordinator::Outcome::kFailed, "UNAVAILABLE: connection refused")});
  const int64_t now = SimulatedClock::kDefaultWallNs;
  ASSERT_TRUE(FinalStatus(status, "r1", result, Plan(), now).ok());
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
  const api::JobAnalysis analysis = AnalysisFor(result, Plan());
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
  EXPECT_EQ(AnalysisFor(result, TargetResolution{}).stragglers, "none");
  EXPECT_TRUE(StragglerMessages(AnalysisFor(result, TargetResolution{})).empty());
}

TEST(FinalStatusTest, CarriesTheAnalysisWhenTheRunHasAReport) {
  api::ProfileJobStatus status = Capturing("r1");
  coordinator::RunResult result = RunOf({Target("a", coordinator::Outcome::kOk)});
  ASSERT_TRUE(FinalStatus(status, "r1", result, Plan(), 0).ok());
  EXPECT_FALSE(status.analysis.has_value()) << "no report, no analysis";
  status = Capturing("r1");
  result.report = ReportWithStraggler();
  ASSERT_TRUE(FinalStatus(status, "r1", result, Plan(), 0).ok());
  ASSERT_TRUE(status.analysis.has_value());
  EXPECT_EQ(status.analysis->stragglers, "b");
}

TEST(FinalStatusTest, AllFailedIsFailedWithNoTraceData) {
  api::ProfileJobStatus status = Capturing("r1");
  ASSERT_TRUE(
      FinalStatus(status, "r1", RunOf({Target("a", coordinator::Outcome::kEmpty)}), Plan(), 0)
          .ok());
  EXPECT_EQ(status.phase, api::JobPhase::kFailed);
  ASSERT_EQ(status.conditions.size(), 1u);
  EXPECT_EQ(status.conditions[0].type, "Failed");
  EXPECT_EQ(status.conditions[0].reason, "NoTraceData");
}

TEST(FinalStatusTest, AJobThatMovedOnIsLeftAsItIs) {
  api::ProfileJobStatus other_run = Capturing("r2");
  EXPECT_TRUE(absl::IsFailedPrecondition(
      FinalStatus(other_run, "r1", RunOf({Target("a", coordinator::Outcome::kOk)}), Plan(), 0)));
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

namespace clusterprof::controllers {
namespace {

// --- Status at scale (docs/operator.md, "Status at scale") ---

// `n` targets w-0 .. w-(n-1) on nodes of 8; `outcome(i)` and `start_error(i)` for each.
struct BigRun {
  coordinator::RunResult result;
  TargetResolution plan;
};
BigRun MakeBigRun(int n, const std::function<coordinator::Outcome(int)>& outcome,
                  const std::function<int64_t(int)>& start_error, int skipped = 0) {
  BigRun run;
  std::vector<coordinator::TargetResult> targets;
  for (int i = 0; i < n; ++i) {
    const std::string name = StrCat("trainer-7f9c8d6b5-worker-", i);
    const coordinator::Outcome o = outcome(i);
    coordinator::TargetResult target =
        Target(name, o,
               o == coordinator::Outcome::kFailed
                   ? StrCat("UNAVAILABLE: failed to connect to all addresses; last error: UNKNOWN: "
                            "ipv4:10.",
                            i / 256, ".", i % 256,
                            ".7:8466: Failed to connect to remote host: Connection refused ",
                            std::string(600, 'x'))
                   : "");
    target.address = StrCat("10.", i / 256, ".", i % 256, ".7:8466");
    target.start_known = o == coordinator::Outcome::kOk;
    target.start_error_ns = start_error(i);
    target.warnings = {std::string(300, 'w')};
    targets.push_back(std::move(target));
    run.plan.targets.push_back({name, targets.back().address, StrCat("gke-a3-pool-node-", i / 8)});
  }
  for (int i = 0; i < skipped; ++i) {
    run.plan.skipped.push_back(StrCat("trainer-7f9c8d6b5-extra-", i, ": not Ready"));
  }
  run.result = RunOf(std::move(targets));
  run.result.manifest_uri = "gs://bucket/profiles/plugins/profile/r1/clusterprof_run.json";
  return run;
}

size_t StatusBytes(const api::ProfileJobStatus& status) {
  return api::ProfileJobStatusToJson(status).serialize().size();
}

TEST(StatusAtScaleTest, TenThousandTargetsFitWhateverTheOutcomeMix) {
  using coordinator::Outcome;
  struct Mix {
    const char* name;
    std::function<Outcome(int)> outcome;
  } mixes[] = {
      {"all succeeded", [](int) { return Outcome::kOk; }},
      {"all failed", [](int) { return Outcome::kFailed; }},
      {"all empty", [](int) { return Outcome::kEmpty; }},
      {"every third failed",
       [](int i) {
         return i % 3 == 0 ? Outcome::kFailed : i % 3 == 1 ? Outcome::kEmpty : Outcome::kOk;
       }},
  };
  for (const Mix& mix : mixes) {
    // Every target late by more than the bound, with 300 skipped pods: the most to list.
    BigRun run = MakeBigRun(
        10'000, mix.outcome, [](int i) { return 2'000'000 + i; }, 300);
    api::ProfileJobStatus status = Capturing("r1");
    ASSERT_TRUE(FinalStatus(status, "r1", run.result, run.plan, 0).ok()) << mix.name;
    EXPECT_LE(StatusBytes(status), api::kMaxStatusBytes) << mix.name;
    // For bench/RESULTS.md, "One ProfileJob over 10,000 pods".
    std::cout << "10,000 targets, " << mix.name << ": status " << StatusBytes(status) << " bytes\n";
    EXPECT_EQ(status.targets.size(), api::kMaxListedTargets) << mix.name;
    EXPECT_EQ(status.targets_not_listed, 10'300 - static_cast<int>(api::kMaxListedTargets))
        << mix.name;
    EXPECT_THAT(status.message, HasSubstr("every target in gs://bucket/profiles/plugins/profile/r1/"
                                          "clusterprof_run.json"))
        << mix.name;
    ASSERT_TRUE(status.summary.has_value());
    EXPECT_EQ(status.summary->targets, 10'000);
    EXPECT_EQ(status.summary->skipped, 300);
    EXPECT_EQ(status.summary->succeeded + status.summary->failed + status.summary->empty, 10'000);
    // Read back as the API server would hand it over.
    absl::StatusOr<api::ProfileJobStatus> parsed =
        api::ParseProfileJobStatus(api::ProfileJobStatusToJson(status));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->targets_not_listed, status.targets_not_listed);
  }
}

TEST(StatusAtScaleTest, ALargeJobListsOnlyWhatNeedsAttentionMostSeriousFirst) {
  using coordinator::Outcome;
  // 5,000 targets: 3 failed, 2 empty, 4 started late (one by 9 ms), the rest fine; 2 skipped.
  BigRun run = MakeBigRun(
      5'000,
      [](int i) {
        return i == 10 || i == 20 || i == 30 ? Outcome::kFailed
               : i == 40 || i == 50          ? Outcome::kEmpty
                                             : Outcome::kOk;
      },
      [](int i) -> int64_t {
        return i == 100               ? 9'000'000
               : i == 200             ? -3'000'000
               : i == 300 || i == 400 ? 1'500'000
                                      : 50'000;
      },
      2);
  api::ProfileJobStatus status = Capturing("r1");
  ASSERT_TRUE(FinalStatus(status, "r1", run.result, run.plan, 0).ok());
  std::vector<std::string> listed;
  for (const api::TargetStatus& target : status.targets)
    listed.push_back(target.phase + " " + target.name);
  EXPECT_THAT(
      listed,
      ElementsAre("Failed trainer-7f9c8d6b5-worker-10", "Failed trainer-7f9c8d6b5-worker-20",
                  "Failed trainer-7f9c8d6b5-worker-30", "Empty trainer-7f9c8d6b5-worker-40",
                  "Empty trainer-7f9c8d6b5-worker-50", "Skipped trainer-7f9c8d6b5-extra-0",
                  "Skipped trainer-7f9c8d6b5-extra-1", "Succeeded trainer-7f9c8d6b5-worker-100",
                  "Succeeded trainer-7f9c8d6b5-worker-200",
                  "Succeeded trainer-7f9c8d6b5-worker-300",
                  "Succeeded trainer-7f9c8d6b5-worker-400"));
  EXPECT_EQ(status.targets_not_listed, 5'002 - 11);
  EXPECT_EQ(status.targets[0].node, "gke-a3-pool-node-1");
  EXPECT_LE(status.targets[0].message.size(), api::kMaxTargetMessageBytes);
  EXPECT_THAT(status.targets[0].message, HasSubstr("[...]"));
  EXPECT_EQ(status.targets[5].message, "not Ready");
  ASSERT_TRUE(status.summary.has_value());
  EXPECT_EQ(status.summary->start_error_p50_ns, 50'000);
  EXPECT_EQ(status.summary->start_error_p99_ns, 50'000);
  ASSERT_GE(status.summary->slowest_starts.size(), 2u);
  EXPECT_EQ(status.summary->slowest_starts[0].name, "trainer-7f9c8d6b5-worker-100");
  EXPECT_EQ(status.summary->slowest_starts[1].start_error_ns, -3'000'000);
}

TEST(StatusAtScaleTest, ASmallJobListsEveryTarget) {
  BigRun run = MakeBigRun(
      api::kMaxListedTargets - 1, [](int) { return coordinator::Outcome::kOk; },
      [](int) { return 10'000; }, 1);
  api::ProfileJobStatus status = Capturing("r1");
  ASSERT_TRUE(FinalStatus(status, "r1", run.result, run.plan, 0).ok());
  EXPECT_EQ(status.targets.size(), api::kMaxListedTargets);
  EXPECT_EQ(status.targets_not_listed, 0);
  EXPECT_EQ(status.targets.back().phase, "Skipped");
  EXPECT_THAT(status.message, Not(HasSubstr("every target in")));
}

TEST(StatusAtScaleTest, ThePlannedStatusListsSmallJobsAndCountsLargeOnes) {
  api::ProfileJobStatus status;
  PlannedTargets(Plan(), status);
  ASSERT_EQ(status.targets.size(), 2u);
  EXPECT_EQ(status.targets[0].phase, "Pending");
  EXPECT_EQ(status.summary->targets, 2);
  EXPECT_EQ(api::ProfileJobStatusToJson(status).at("targetsSucceeded").as_string(), "0/2");

  BigRun run = MakeBigRun(
      10'000, [](int) { return coordinator::Outcome::kOk; }, [](int) { return 0; }, 5);
  PlannedTargets(run.plan, status);
  EXPECT_TRUE(status.targets.empty());
  EXPECT_EQ(status.targets_not_listed, 10'005);
  EXPECT_EQ(status.summary->targets, 10'000);
  EXPECT_EQ(status.summary->skipped, 5);
  EXPECT_EQ(api::ProfileJobStatusToJson(status).at("targetsSucceeded").as_string(), "0/10000");
  EXPECT_LE(StatusBytes(status), 4096u);
}

TEST(StatusAtScaleTest, TheAnalysisListsTheStragglersAndTheCostliestHosts) {
  BigRun run = MakeBigRun(
      10'000, [](int) { return coordinator::Outcome::kOk; }, [](int) { return 0; });
  auto report = std::make_shared<analysis::RunReport>();
  for (int i = 0; i < 10'000; ++i) {
    analysis::HostVerdict verdict{.host = StrCat("trainer-7f9c8d6b5-worker-", i),
                                  .steps = 1000,
                                  .step_p50_ns = 27'000'000,
                                  .others_wait_ns = i};
    if (i % 1000 == 7) {
      verdict.straggler = true;
      verdict.cause = analysis::Cause::kCompute;
      verdict.evidence = std::string(2000, 'e');
    }
    report->analysis.hosts.push_back(std::move(verdict));
    report->analysis.left_out.push_back(StrCat("h", i, ": an empty trace"));
  }
  run.result.report = report;
  run.result.report_html_uri = "gs://bucket/r1/clusterprof_report.html";
  const api::JobAnalysis analysis = AnalysisFor(run.result, run.plan);
  ASSERT_EQ(analysis.hosts.size(), api::kMaxListedHosts);
  EXPECT_EQ(analysis.hosts_not_listed, 10'000 - static_cast<int>(api::kMaxListedHosts));
  for (int k = 0; k < 10; ++k) EXPECT_TRUE(analysis.hosts[k].straggler) << k;
  EXPECT_EQ(analysis.hosts[10].host, "trainer-7f9c8d6b5-worker-9999") << "then the costliest";
  EXPECT_EQ(analysis.hosts[0].host, "trainer-7f9c8d6b5-worker-9007") << "the costliest straggler";
  EXPECT_EQ(analysis.hosts[0].node, "gke-a3-pool-node-1125");
  EXPECT_EQ(analysis.stragglers,
            "trainer-7f9c8d6b5-worker-7, trainer-7f9c8d6b5-worker-1007, "
            "trainer-7f9c8d6b5-worker-2007, and 7 more");
  EXPECT_EQ(analysis.left_out.size(), api::kMaxListedHosts + 1);
  EXPECT_EQ(analysis.left_out.back(), "and 9980 more host(s) left out");
  const std::vector<std::string> events = StragglerMessages(analysis);
  ASSERT_EQ(events.size(), kMaxStragglerEvents + 1);
  EXPECT_EQ(events.back(),
            "5 more straggler(s) hold the job back; every host in "
            "gs://bucket/r1/clusterprof_report.html");
  api::ProfileJobStatus status;
  status.analysis = analysis;
  EXPECT_LE(StatusBytes(status), 32u * 1024) << "the analysis's share of the object";
}

TEST(TargetFailuresEventTest, OneEventGroupsTheFailuresByKind) {
  using coordinator::Outcome;
  BigRun run = MakeBigRun(
      10'000,
      [](int i) {
        return i < 9'990 ? Outcome::kFailed : i < 9'995 ? Outcome::kEmpty : Outcome::kOk;
      },
      [](int) { return 0; });
  const std::string event = TargetFailuresEvent(run.result);
  EXPECT_THAT(event, HasSubstr("9995 of 10000 target(s) have no data: UNAVAILABLE (9990): "
                               "trainer-7f9c8d6b5-worker-0 (10.0.0.7:8466), "));
  EXPECT_THAT(event,
              HasSubstr(", and 9987 more; no trace data (5): trainer-7f9c8d6b5-worker-9990"));
  EXPECT_THAT(event, HasSubstr("; every target in gs://bucket/profiles/"));
  EXPECT_LE(event.size(), 4096u);
  EXPECT_EQ(TargetFailuresEvent(RunOf({Target("a", Outcome::kOk)})), "");
  EXPECT_THAT(
      TargetFailuresEvent(RunOf({Target("a", Outcome::kFailed, "DEADLINE_EXCEEDED: slow")})),
      HasSubstr("1 of 1 target(s) has no data: a (a:8466): DEADLINE_EXCEEDED: slow"));
  EXPECT_EQ(SkippedEvent({}), "");
  EXPECT_EQ(SkippedEvent({"a: not Ready", "b: no pod IP yet"}),
            "2 matching pod(s) left out: a: not Ready, b: no pod IP yet");
}

}  // namespace
}  // namespace clusterprof::controllers
