// The ProfileJob and ProfileSchedule specs as the controllers read them: defaults, every bound,
// the rules the CRD states in CEL (checked again here), and the status round trip.
#include "operator/api/types.h"

#include "common/base/strings.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace clusterprof::api {
namespace {

using ::testing::HasSubstr;
using web::json::value;

value Json(const std::string& text) { return value::parse(text); }

absl::StatusOr<ProfileJobSpec> Parse(const std::string& text) {
  return ParseProfileJobSpec(Json(text));
}

std::string Error(const std::string& text) {
  absl::StatusOr<ProfileJobSpec> spec = Parse(text);
  EXPECT_FALSE(spec.ok()) << text;
  return spec.ok() ? "" : std::string(spec.status().message());
}

TEST(ProfileJobSpecTest, DefaultsAreTheSchemas) {
  absl::StatusOr<ProfileJobSpec> spec =
      Parse(R"({"targets": {"selector": {"matchLabels": {"app": "t"}}}, "logdir": "/tb"})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->selector->ToString(), "app=t");
  EXPECT_EQ(spec->port, 0);
  EXPECT_EQ(spec->min_ready, 1);
  EXPECT_EQ(spec->max_targets, 20000);
  EXPECT_EQ(spec->wait_seconds, 120);
  EXPECT_EQ(spec->duration_ms, 2000);
  EXPECT_EQ(spec->delay_ms, 1000);
  EXPECT_EQ(spec->tracing_attempts, 3);
  EXPECT_EQ(spec->profile_options.host_tracer_level(), 2u);
  EXPECT_EQ(spec->profile_options.device_tracer_level(), 1u);
  EXPECT_EQ(spec->profile_options.python_tracer_level(), 0u);
  EXPECT_TRUE(spec->profile_options.enable_hlo_proto()) << "upstream's defaults";
  EXPECT_FALSE(spec->ttl_seconds_after_finished.has_value());
}

TEST(ProfileJobSpecTest, ReadsEveryField) {
  absl::StatusOr<ProfileJobSpec> spec = Parse(R"({
    "targets": {"addresses": ["10.0.0.2:8466", "[::1]:9000"], "port": 9001, "minReady": 2},
    "durationMs": 5000, "delayMs": 0, "logdir": "gs://bucket/tb", "runName": "step_1200",
    "tracingAttempts": 5,
    "options": {"hostTracerLevel": 3, "deviceTracerLevel": 2, "pythonTracerLevel": 1,
                "advancedConfiguration": {"gpu_max_activity_api_events": 4194304,
                                          "tpu_trace_mode": "TRACE_COMPUTE", "flag": true}},
    "ttlSecondsAfterFinished": 60})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->selector.has_value());
  EXPECT_THAT(spec->addresses, ::testing::ElementsAre("10.0.0.2:8466", "[::1]:9000"));
  EXPECT_EQ(spec->port, 9001);
  EXPECT_EQ(spec->min_ready, 2);
  EXPECT_EQ(spec->duration_ms, 5000);
  EXPECT_EQ(spec->delay_ms, 0);
  EXPECT_EQ(spec->logdir.uri, "gs://bucket/tb");
  EXPECT_EQ(spec->logdir.bucket, "bucket");
  EXPECT_EQ(spec->logdir.kind, storage::Logdir::Kind::kGcs);
  EXPECT_EQ(spec->run_name, "step_1200");
  EXPECT_EQ(spec->tracing_attempts, 5);
  EXPECT_EQ(spec->profile_options.host_tracer_level(), 3u);
  const auto& advanced = spec->profile_options.advanced_configuration();
  EXPECT_EQ(advanced.at("gpu_max_activity_api_events").int64_value(), 4194304);
  EXPECT_EQ(advanced.at("tpu_trace_mode").string_value(), "TRACE_COMPUTE");
  EXPECT_TRUE(advanced.at("flag").bool_value());
  EXPECT_EQ(*spec->ttl_seconds_after_finished, 60);
}

TEST(ProfileJobSpecTest, ErrorsNameTheFieldAndSayWhatIsAllowed) {
  const std::string base = R"("targets": {"addresses": ["a:1"]}, "logdir": "/tb")";
  EXPECT_EQ(Error(StrCat("{", base, R"(, "durationMs": -5})")),
            "spec.durationMs: must be between 1 and 600000 (milliseconds), got -5");
  EXPECT_EQ(Error(StrCat("{", base, R"(, "durationMs": 0})")),
            "spec.durationMs: must be between 1 and 600000 (milliseconds), got 0");
  EXPECT_THAT(Error(StrCat("{", base, R"(, "durationMs": 600001})")), HasSubstr("600001"));
  EXPECT_EQ(Error(StrCat("{", base, R"(, "durationMs": "2s"})")),
            "spec.durationMs: must be an integer, got \"2s\"");
  EXPECT_THAT(Error(StrCat("{", base, R"(, "delayMs": -1})")), HasSubstr("spec.delayMs"));
  EXPECT_THAT(Error(StrCat("{", base, R"(, "tracingAttempts": 0})")),
              HasSubstr("spec.tracingAttempts: must be between 1 and 10"));
  EXPECT_THAT(Error(StrCat("{", base, R"(, "runName": "../x"})")), HasSubstr("spec.runName"));
  EXPECT_THAT(Error(StrCat("{", base, R"(, "options": {"hostTracerLevel": 4}})")),
              HasSubstr("spec.options.hostTracerLevel: must be between 0 and 3"));
  EXPECT_THAT(Error(StrCat("{", base, R"(, "options": {"advancedConfiguration": {"x": 1.5}}})")),
              HasSubstr("spec.options.advancedConfiguration.x"));
  EXPECT_THAT(Error(StrCat("{", base, R"(, "queueTimeoutSeconds": 86401})")),
              HasSubstr("spec.queueTimeoutSeconds: must be between 0 and 86400 (seconds)"));
  EXPECT_THAT(Error(StrCat("{", base, R"(, "ttlSecondsAfterFinished": -1})")),
              HasSubstr("spec.ttlSecondsAfterFinished"));
  EXPECT_EQ(Error(R"({"targets": {"addresses": ["a:1"]}})"),
            "spec.logdir: required: gs://bucket/prefix or an absolute path such as "
            "/data/tensorboard");
  EXPECT_EQ(Error(R"({"targets": {"addresses": ["a:1"]}, "logdir": "s3://b/x"})"),
            "spec.logdir: \"s3://b/x\" is neither gs://bucket/prefix nor an absolute path "
            "(/... or file:///...)");
  EXPECT_THAT(Error(R"({"targets": {"addresses": ["a:1"]}, "logdir": "relative/dir"})"),
              HasSubstr("neither"));
  EXPECT_THAT(Error(R"({"targets": {"addresses": ["a:1"]}, "logdir": "gs://B!/x"})"),
              HasSubstr("spec.logdir"));
  EXPECT_THAT(Error(StrCat("{", R"("targets": {"addresses": ["a:1"], "maxTargets": 0})",
                           R"(, "logdir": "/tb"})")),
              HasSubstr("spec.targets.maxTargets: must be between 1 and 100000 (targets), got 0"));
  EXPECT_THAT(Error(StrCat("{", R"("targets": {"addresses": ["a:1"], "maxTargets": 10, )",
                           R"("minReady": 11}, "logdir": "/tb"})")),
              HasSubstr("spec.targets.minReady: 11 is more than targets.maxTargets (10)"));
  EXPECT_THAT(Error(StrCat("{", R"("targets": {"addresses": ["a:1"], "waitSeconds": -1})",
                           R"(, "logdir": "/tb"})")),
              HasSubstr("spec.targets.waitSeconds: must be between 0 and 86400 (seconds), got -1"));
  EXPECT_THAT(Error(R"({"targets": {}, "logdir": "/tb"})"),
              HasSubstr("spec.targets: needs a selector"));
  EXPECT_THAT(Error(R"({"logdir": "/tb"})"), HasSubstr("spec.targets: needs a selector"));
  EXPECT_THAT(Error(R"({"targets": {"addresses": ["nohost"]}, "logdir": "/tb"})"),
              HasSubstr("spec.targets.addresses[0]: must be host:port"));
  EXPECT_THAT(Error(R"({"targets": {"addresses": ["a:70000"]}, "logdir": "/tb"})"),
              HasSubstr("spec.targets.addresses[0]"));
  EXPECT_THAT(Error(R"({"targets": {"selector": {"matchLabels": {"a": 1}}}, "logdir": "/tb"})"),
              HasSubstr("spec.targets.selector"));
  EXPECT_THAT(Error(R"({"targets": {"addresses": ["a:1"]}, "logdir": "/tb", "durationMs": 1.5})"),
              HasSubstr("spec.durationMs: must be an integer"));
  EXPECT_EQ(ParseProfileJobSpec(value::null()).status().message(),
            "spec: missing; a ProfileJob needs a spec");
}

TEST(ProfileJobStatusTest, RoundTripsThroughJson) {
  ProfileJobStatus status;
  status.phase = JobPhase::kPartiallySucceeded;
  status.message = "1 of 2";
  status.run_name = "run";
  status.run_uri = "/tb/plugins/profile/run";
  status.start_time_ns = 1'767'225'600'123'456'789;
  status.start_time = FormatTime(status.start_time_ns);
  status.attempt = 2;
  status.observed_generation = 3;
  SetCondition(status.conditions, {"Complete", "True", "PartiallySucceeded", "m", 3, ""},
               "2026-01-01T00:00:00Z");
  TargetStatus target;
  target.name = "pod-0";
  target.address = "10.0.0.1:8466";
  target.phase = "Succeeded";
  target.events = 1 << 20;
  target.clock_uncertainty_ns = -1;
  status.targets = {target};
  status.summary = JobSummary{.targets = 2,
                              .succeeded = 1,
                              .failed = 1,
                              .skipped = 3,
                              .max_start_skew_ns = 142'000,
                              .start_error_p50_ns = 20'000,
                              .start_error_p99_ns = 140'000,
                              .slowest_starts = {{"pod-1", -142'000}}};
  status.targets_not_listed = 4;
  JobAnalysis analysis;
  analysis.steps = 50;
  analysis.compared_steps = 48;
  analysis.stragglers = "pod-0";
  analysis.hosts.push_back({.host = "pod-0",
                            .node = "node-1",
                            .steps = 50,
                            .step_p50_ns = 27'500'000,
                            .straggler = true,
                            .late_steps = 45,
                            .cause = "compute",
                            .evidence = "late"});
  analysis.left_out = {"pod-1: an empty trace"};
  analysis.report_uri = "/tb/plugins/profile/run/clusterprof_report.html";
  analysis.hosts_not_listed = 7;
  status.analysis = analysis;
  const value json = ProfileJobStatusToJson(status);
  EXPECT_EQ(json.at("analysis").at("hosts").at(0).at("stepP50").as_string(), "27.5ms");
  EXPECT_EQ(json.at("targetsSucceeded").as_string(), "1/2");
  EXPECT_EQ(json.at("summary").at("maxStartSkew").as_string(), "142us");
  EXPECT_EQ(json.at("startTime").as_string(), "2026-01-01T00:00:00Z");
  absl::StatusOr<ProfileJobStatus> back = ParseProfileJobStatus(json);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->phase, JobPhase::kPartiallySucceeded);
  EXPECT_EQ(back->start_time_ns, status.start_time_ns);
  EXPECT_EQ(back->attempt, 2);
  ASSERT_EQ(back->targets.size(), 1u);
  EXPECT_EQ(back->targets[0].events, 1 << 20);
  EXPECT_EQ(back->targets[0].clock_uncertainty_ns, -1);
  ASSERT_EQ(back->conditions.size(), 1u);
  EXPECT_EQ(back->conditions[0].last_transition_time, "2026-01-01T00:00:00Z");
  EXPECT_EQ(back->summary->max_start_skew_ns, 142'000);
  EXPECT_EQ(back->summary->skipped, 3);
  EXPECT_EQ(back->summary->start_error_p99_ns, 140'000);
  EXPECT_EQ(json.at("summary").at("startErrorP99").as_string(), "140us");
  ASSERT_EQ(back->summary->slowest_starts.size(), 1u);
  EXPECT_EQ(back->summary->slowest_starts[0].name, "pod-1");
  EXPECT_EQ(back->summary->slowest_starts[0].start_error_ns, -142'000);
  EXPECT_EQ(back->targets_not_listed, 4);
  EXPECT_EQ(back->analysis->hosts_not_listed, 7);
  ASSERT_TRUE(back->analysis.has_value());
  EXPECT_EQ(back->analysis->hosts.at(0).cause, "compute");
  EXPECT_EQ(back->analysis->left_out, analysis.left_out);
  EXPECT_EQ(ProfileJobStatusToJson(*back), json);
  EXPECT_THAT(
      std::string(
          ParseProfileJobStatus(Json(R"({"analysis": {"leftOut": [3]}})")).status().message()),
      ::testing::HasSubstr("status.analysis.leftOut[]: must be a string"));
  EXPECT_FALSE(ParseProfileJobStatus(Json(R"({"attempt": "x"})")).ok());
  EXPECT_EQ(ParseProfileJobStatus(value::null())->phase, JobPhase::kPending);
}

TEST(ConditionTest, TransitionTimeMovesOnlyWhenTheStatusChanges) {
  std::vector<Condition> conditions;
  SetCondition(conditions, {"Failed", "False", "r", "m", 1, ""}, "t1");
  SetCondition(conditions, {"Failed", "False", "r2", "m2", 1, ""}, "t2");
  ASSERT_EQ(conditions.size(), 1u);
  EXPECT_EQ(conditions[0].last_transition_time, "t1");
  EXPECT_EQ(conditions[0].reason, "r2");
  SetCondition(conditions, {"Failed", "True", "r3", "m3", 1, ""}, "t3");
  EXPECT_EQ(conditions[0].last_transition_time, "t3");
  SetCondition(conditions, {"Complete", "False", "r4", "m4", 1, ""}, "t4");
  ASSERT_EQ(conditions.size(), 2u);
  EXPECT_EQ(conditions[0].type, "Failed");
  EXPECT_EQ(conditions[0].last_transition_time, "t3");
  EXPECT_EQ(conditions[1].last_transition_time, "t4");
  // Through JSON and back, and a list that is not one.
  absl::StatusOr<std::vector<Condition>> back =
      ParseConditions(ConditionsToJson(conditions), "status.conditions");
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[1].reason, "r4");
  EXPECT_EQ((*back)[1].observed_generation, 1);
  EXPECT_EQ(ParseConditions(value::object(), "status.conditions").status().message(),
            "status.conditions: must be a list");
}

TEST(FormatTest, DurationsAndTimes) {
  EXPECT_EQ(FormatDuration(0), "0ns");
  EXPECT_EQ(FormatDuration(999), "999ns");
  EXPECT_EQ(FormatDuration(142'000), "142us");
  EXPECT_EQ(FormatDuration(1'500'000), "1.5ms");
  EXPECT_EQ(FormatDuration(-2'250'000'000), "-2.25s");
  EXPECT_EQ(FormatTime(0), "1970-01-01T00:00:00Z");
  EXPECT_EQ(*ParseTime("2026-11-24T10:00:00Z"), 1'795'514'400LL * 1'000'000'000);
  EXPECT_FALSE(ParseTime("yesterday").ok());
}

TEST(ProfileScheduleSpecTest, DefaultsAndErrors) {
  absl::StatusOr<ProfileScheduleSpec> spec = ParseProfileScheduleSpec(Json(R"({
    "schedule": "*/30 * * * *",
    "jobTemplate": {"metadata": {"labels": {"team": "llm"}},
                    "spec": {"targets": {"addresses": ["a:1"]}, "logdir": "/tb"}}})"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->concurrency_policy, ConcurrencyPolicy::kForbid);
  EXPECT_EQ(spec->successful_jobs_history_limit, 3);
  EXPECT_EQ(spec->failed_jobs_history_limit, 1);
  EXPECT_FALSE(spec->suspend);
  EXPECT_EQ(spec->job_labels.at("team"), "llm");
  EXPECT_EQ(spec->job_spec.at("logdir").as_string(), "/tb");

  const auto error = [](const std::string& text) {
    return std::string(ParseProfileScheduleSpec(Json(text)).status().message());
  };
  EXPECT_THAT(error(R"({"jobTemplate": {}})"), HasSubstr("spec.schedule: required"));
  EXPECT_THAT(error(R"({"schedule": "@hourly"})"), HasSubstr("spec.jobTemplate: required"));
  EXPECT_THAT(error(R"({"schedule": "@hourly", "concurrencyPolicy": "Sometimes",
                        "jobTemplate": {"spec": {}}})"),
              HasSubstr("spec.concurrencyPolicy: must be Allow, Forbid or Replace"));
  EXPECT_THAT(error(R"({"schedule": "@hourly", "successfulJobsHistoryLimit": -1,
                        "jobTemplate": {"spec": {}}})"),
              HasSubstr("spec.successfulJobsHistoryLimit"));
  EXPECT_THAT(error(R"({"schedule": "@hourly", "startingDeadlineSeconds": -1,
                        "jobTemplate": {"spec": {}}})"),
              HasSubstr("spec.startingDeadlineSeconds"));
  EXPECT_THAT(error(R"({"schedule": "@hourly",
                        "jobTemplate": {"spec": {"targets": {"addresses": ["a:1"]},
                                                 "logdir": "/tb", "durationMs": 0}}})"),
              HasSubstr("spec.jobTemplate.spec.durationMs"));
}

}  // namespace
}  // namespace clusterprof::api
