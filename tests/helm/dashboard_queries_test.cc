// The chart's Grafana dashboard (helm/clusterprof/dashboards/clusterprof.json) against what the
// binaries really export: the operator's and the sidecar's metrics objects are built on their
// prometheus-cpp registries, every labelled series is made to appear once, and their /metrics
// pages (the text format the health servers serve) give the metric names (with their _bucket,
// _sum, _count forms) and label names. Every query of the dashboard must parse and name only
// those, plus the labels the scrape adds (tests/helm/promql_check.h); the checker's own tests
// show that it refuses what it should.
#include <algorithm>
#include <cctype>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "coordinator/coordinator.h"
#include "cpprest/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "operator/controllers/metrics.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "sidecar/metrics.h"
#include "tests/helm/promql_check.h"

namespace clusterprof::testing::promql {
namespace {

using ::testing::HasSubstr;
using web::json::value;

constexpr char kDashboard[] =
    CLUSTERPROF_SOURCE_DIR "/helm/clusterprof/dashboards/clusterprof.json";

std::string Page(const prometheus::Registry& registry) {
  return prometheus::TextSerializer().Serialize(registry.Collect());
}

// The operator's /metrics page, with a series of every labelled family.
std::string OperatorPage() {
  controllers::OperatorMetrics metrics;
  metrics.CaptureFinished(3);
  metrics.ObserveStartSkew(1e-4);
  metrics.TargetFinished("succeeded");
  coordinator::TargetResult target;
  target.uploads.push_back({.uri = "gs://b/run/pod.xplane.pb", .state = "failed"});
  metrics.TargetUploads(target);
  metrics.QueueWaitEnded("scheduled", 5);
  metrics.ReconcileFinished("profilejob", /*ok=*/false);
  metrics.ApiRequest("GET", 200, 1'000'000);
  metrics.SetLeader(true);
  metrics.TriggerFired("step-time");
  metrics.TriggerSuppressed("cooldown");
  kube::WorkQueueMetrics* queue = metrics.QueueMetrics("profilejobs");
  queue->OnAdd("team/job");
  queue->OnGet("team/job", 1'000'000);
  return Page(*metrics.registry());
}

// A sidecar's /metrics page, with a series of every labelled family.
std::string SidecarPage() {
  sidecar::SidecarMetrics metrics;
  metrics.RequestRefused("ALREADY_EXISTS");
  metrics.ProfileCallStarted();
  metrics.CaptureFinished("ok", sidecar::TracerStats{.events = 10}, 4096, 1e-4, 0.5);
  metrics.StepFinished(1, 0, 100'000'000);
  using Kind = storage::UploadEvent::Kind;
  for (Kind kind :
       {Kind::kUploaded, Kind::kDeferred, Kind::kFailed, Kind::kRetry, Kind::kSpoolFull}) {
    storage::UploadEvent event;
    event.kind = kind;
    metrics.UploadEvent(event);
  }
  return Page(*metrics.registry());
}

const Exposition& Exported() {
  static const Exposition* exported = [] {
    auto* exposition = new Exposition;
    for (const std::string& page : {OperatorPage(), SidecarPage()}) {
      const absl::Status parsed = ParseExposition(page, *exposition);
      EXPECT_TRUE(parsed.ok()) << parsed;
    }
    return exposition;
  }();
  return *exported;
}

value ReadDashboard() {
  std::ifstream in(kDashboard);
  EXPECT_TRUE(in.good()) << kDashboard;
  std::stringstream text;
  text << in.rdbuf();
  try {
    return value::parse(text.str());
  } catch (const web::json::json_exception& error) {
    ADD_FAILURE() << kDashboard << " is not JSON: " << error.what();
    return value::object();
  }
}

// Every panel, rows' nested panels included (a collapsed row keeps its panels inside).
std::vector<value> Panels(const value& dashboard) {
  std::vector<value> panels;
  if (!dashboard.has_array_field("panels")) return panels;
  for (const value& panel : dashboard.at("panels").as_array()) {
    panels.push_back(panel);
    if (panel.has_array_field("panels")) {
      for (const value& nested : panel.at("panels").as_array()) panels.push_back(nested);
    }
  }
  return panels;
}

struct Query {
  std::string panel;
  std::string expr;
  std::string legend;
};

std::vector<Query> Queries(const value& dashboard) {
  std::vector<Query> queries;
  for (const value& panel : Panels(dashboard)) {
    if (!panel.has_array_field("targets")) continue;
    for (const value& target : panel.at("targets").as_array()) {
      queries.push_back(
          {panel.at("title").as_string(),
           target.has_string_field("expr") ? target.at("expr").as_string() : "",
           target.has_string_field("legendFormat") ? target.at("legendFormat").as_string() : ""});
    }
  }
  return queries;
}

// Whether `expr` names the family `name` (as itself, or as its _bucket, _sum or _count).
bool Mentions(const std::string& expr, const std::string& name) {
  const auto ident = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (size_t at = expr.find(name); at != std::string::npos; at = expr.find(name, at + 1)) {
    if (at > 0 && ident(expr[at - 1])) continue;
    size_t end = at + name.size();
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      if (expr.compare(end, std::string(suffix).size(), suffix) == 0) {
        end += std::string(suffix).size();
        break;
      }
    }
    if (end >= expr.size() || !ident(expr[end])) return true;
  }
  return false;
}

TEST(DashboardQueriesTest, TheMetricPagesAreReadAsTheyAreServed) {
  const Exposition& exported = Exported();
  const Exposition::Series& wait =
      exported.series.at("clusterprof_operator_queue_wait_seconds_bucket");
  EXPECT_EQ(wait.family, "clusterprof_operator_queue_wait_seconds");
  EXPECT_EQ(wait.type, "histogram");
  EXPECT_EQ(wait.labels, (std::set<std::string>{"outcome", "le"}));
  EXPECT_EQ(exported.series.at("clusterprof_operator_queue_wait_seconds_sum").labels,
            std::set<std::string>{"outcome"});
  const Exposition::Series& failures =
      exported.series.at("clusterprof_operator_upload_failures_total");
  EXPECT_EQ(failures.type, "counter");
  EXPECT_EQ(failures.labels, std::set<std::string>{"state"});
  EXPECT_EQ(exported.series.at("clusterprof_step_duration_seconds_bucket").labels,
            std::set<std::string>{"le"});
  EXPECT_EQ(exported.series.at("clusterprof_sidecar_spool_files").type, "gauge");
  EXPECT_EQ(exported.series.at("clusterprof_sidecar_spool_files").labels,
            std::set<std::string>{"state"});
}

TEST(DashboardQueriesTest, EveryQueryNamesOnlyExportedMetricsAndLabels) {
  const std::vector<Query> queries = Queries(ReadDashboard());
  ASSERT_GE(queries.size(), 20u);
  for (const Query& query : queries) {
    SCOPED_TRACE(query.panel + ": " + query.expr);
    const absl::StatusOr<Result> result = Check(query.expr, Exported());
    if (!result.ok()) {
      ADD_FAILURE() << result.status();
      continue;
    }
    EXPECT_EQ(result->kind, Result::Kind::kVector);
    const absl::Status legend = CheckLegend(query.legend, *result);
    EXPECT_TRUE(legend.ok()) << legend;
  }
}

TEST(DashboardQueriesTest, VariablesAndDatasourcesAreThoseOfAPublishedDashboard) {
  const value dashboard = ReadDashboard();
  ASSERT_TRUE(dashboard.has_object_field("templating"));
  std::set<std::string> variables;
  bool datasource = false;
  for (const value& variable : dashboard.at("templating").at("list").as_array()) {
    const std::string name = variable.at("name").as_string();
    variables.insert(name);
    const std::string type = variable.at("type").as_string();
    if (type == "datasource") {
      datasource = name == "datasource" && variable.at("query").as_string() == "prometheus";
      continue;
    }
    ASSERT_EQ(type, "query") << name;
    EXPECT_EQ(variable.at("datasource").at("uid").as_string(), "${datasource}") << name;
    const value& query = variable.at("query");
    const std::string text = query.is_string() ? query.as_string() : query.at("query").as_string();
    const absl::Status checked = CheckLabelValues(text, Exported());
    EXPECT_TRUE(checked.ok()) << name << ": " << checked;
  }
  EXPECT_TRUE(datasource) << "a variable `datasource` of type datasource, query prometheus";
  EXPECT_THAT(variables, ::testing::IsSupersetOf({"namespace", "pod"}));

  // Every panel reads the chosen data source, and uses only variables the dashboard defines
  // (or Grafana's own).
  std::set<int> ids;
  for (const value& panel : Panels(dashboard)) {
    const std::string title = panel.at("title").as_string();
    EXPECT_TRUE(ids.insert(panel.at("id").as_integer()).second) << "duplicate id: " << title;
    EXPECT_TRUE(panel.has_object_field("gridPos")) << title;
    if (panel.at("type").as_string() == "row") continue;
    EXPECT_EQ(panel.at("datasource").at("uid").as_string(), "${datasource}") << title;
    EXPECT_FALSE(panel.at("description").as_string().empty()) << title;
    for (const value& target : panel.at("targets").as_array()) {
      EXPECT_EQ(target.at("datasource").at("uid").as_string(), "${datasource}") << title;
      const std::string expr = target.at("expr").as_string();
      for (size_t at = expr.find('$'); at != std::string::npos; at = expr.find('$', at + 1)) {
        size_t end = at + 1;
        while (end < expr.size() &&
               (std::isalnum(static_cast<unsigned char>(expr[end])) || expr[end] == '_')) {
          ++end;
        }
        const std::string name = expr.substr(at + 1, end - at - 1);
        EXPECT_TRUE(variables.count(name) > 0 || name.rfind("__", 0) == 0)
            << title << ": $" << name << " is not a variable of the dashboard";
      }
    }
  }
}

TEST(DashboardQueriesTest, ThePanelsCoverTheOperatorAndTheSidecars) {
  std::vector<std::string> exprs;
  for (const Query& query : Queries(ReadDashboard())) exprs.push_back(query.expr);
  for (const char* family : {
           "clusterprof_operator_profilejobs",
           "clusterprof_operator_capture_duration_seconds",
           "clusterprof_operator_start_skew_seconds",
           "clusterprof_operator_targets_total",
           "clusterprof_operator_reconciles_total",
           "clusterprof_operator_reconcile_errors_total",
           "clusterprof_operator_workqueue_depth",
           "clusterprof_operator_leader",
           "clusterprof_operator_trigger_firings_total",
           "clusterprof_operator_upload_failures_total",
           "clusterprof_operator_queue_wait_seconds",
           "clusterprof_step_duration_seconds",
           "clusterprof_steps_total",
           "clusterprof_last_step",
           "clusterprof_sidecar_uploads_total",
           "clusterprof_sidecar_spool_bytes",
       }) {
    EXPECT_TRUE(std::any_of(exprs.begin(), exprs.end(),
                            [&](const std::string& expr) { return Mentions(expr, family); }))
        << "no panel shows " << family;
  }
}

// --- The checker -------------------------------------------------------------------------------

constexpr char kPage[] = R"(# HELP jobs ProfileJobs by phase
# TYPE jobs gauge
jobs{phase="Pending"} 1
# TYPE targets_total counter
targets_total{outcome="ok"} 1
# TYPE wait_seconds histogram
wait_seconds_bucket{outcome="scheduled",le="1"} 0
wait_seconds_bucket{outcome="scheduled",le="+Inf"} 0
wait_seconds_sum{outcome="scheduled"} 0
wait_seconds_count{outcome="scheduled"} 0
)";

const Exposition& Small() {
  static const Exposition* small = [] {
    auto* exposition = new Exposition;
    EXPECT_TRUE(ParseExposition(kPage, *exposition).ok());
    return exposition;
  }();
  return *small;
}

std::string Error(std::string_view expr, const Exposition& exported = Small()) {
  absl::StatusOr<Result> result = Check(expr, exported);
  return result.ok() ? "accepted" : std::string(result.status().message());
}

TEST(PromqlCheckTest, AcceptsWhatDashboardsWrite) {
  for (const char* expr : {
           "jobs",
           "max by (phase) (jobs{namespace=~\"$ns\", phase!=\"Failed\"})",
           "sum(rate(targets_total{outcome!~\"ok|empty\"}[$__rate_interval])) by (outcome)",
           "sum without (outcome) (increase(targets_total[5m] offset 1h))",
           "histogram_quantile(0.9, sum by (le, outcome) (rate(wait_seconds_bucket[1h30m])))",
           "wait_seconds_sum / wait_seconds_count",
           "time() - max(jobs)",
           "jobs > bool 0",
           "-jobs + 2 ^ 3 ^ 2 * 1e-3",
           "sum by (pod) (jobs) / on (pod) group_left sum by (pod) (targets_total)",
           "jobs * on (namespace) group_left (outcome) targets_total",
           "jobs or targets_total",
           "topk(3, jobs)",
           "count_values(\"value\", jobs)",
           "label_replace(jobs, \"p\", \"$1\", \"phase\", \"(.*)\")",
           "clamp_min(vector(1), 0)",
       }) {
    EXPECT_EQ(Error(expr), "accepted") << expr;
  }
}

TEST(PromqlCheckTest, RefusesUnknownMetricsAndLabels) {
  EXPECT_THAT(Error("job"), HasSubstr("unknown metric \"job\""));
  EXPECT_THAT(Error("wait_seconds"), HasSubstr("unknown metric \"wait_seconds\""))
      << "a histogram is read through its _bucket, _sum and _count";
  EXPECT_THAT(Error("clusterprof_operator_profilejob", Exported()),
              HasSubstr("unknown metric \"clusterprof_operator_profilejob\""));
  EXPECT_THAT(Error("rate(clusterprof_operator_upload_failure_total[5m])", Exported()),
              HasSubstr("unknown metric"));
  EXPECT_THAT(Error("jobs{phaze=\"Pending\"}"), HasSubstr("label \"phaze\" is not carried"));
  EXPECT_THAT(Error("clusterprof_steps_total{node=\"a\"}", Exported()),
              HasSubstr("label \"node\" is not carried"));
  EXPECT_THAT(Error("sum by (outcome) (jobs)"), HasSubstr("label \"outcome\" in by()"));
  EXPECT_THAT(Error("sum without (le) (wait_seconds_sum)"), HasSubstr("\"le\" in without()"));
  EXPECT_THAT(Error("jobs / on (outcome) targets_total"), HasSubstr("on() (left side)"));
  EXPECT_THAT(Error("jobs * on (namespace) group_left (phase) targets_total"),
              HasSubstr("group_left()"));
  EXPECT_THAT(Error("sum by (pod) (jobs) / sum by (namespace) (jobs)"),
              HasSubstr("carry different ones"));
}

TEST(PromqlCheckTest, RefusesUnbalancedBrackets) {
  EXPECT_THAT(Error("sum(rate(targets_total[5m])"), HasSubstr("unbalanced '(': never closed"));
  EXPECT_THAT(Error("rate(targets_total[5m]))"), HasSubstr("unbalanced ')'"));
  EXPECT_THAT(Error("jobs{phase=\"x\""), HasSubstr("unbalanced '{'"));
  EXPECT_THAT(Error("rate(targets_total[5m)"), HasSubstr("unbalanced ')'"));
  EXPECT_THAT(Error("jobs}"), HasSubstr("unbalanced '}'"));
  EXPECT_THAT(Error("jobs{phase=\"x)"), HasSubstr("unterminated string"));
}

TEST(PromqlCheckTest, RefusesBadSyntaxAndTypes) {
  EXPECT_THAT(Error(""), HasSubstr("empty"));
  EXPECT_THAT(Error("rat(targets_total[5m])"), HasSubstr("unknown function rat()"));
  EXPECT_THAT(Error("rate(jobs[5m])"), HasSubstr("rate() of jobs, a gauge"));
  EXPECT_THAT(Error("increase(jobs[5m])"), HasSubstr("it takes counters"));
  EXPECT_THAT(Error("rate(targets_total)"), HasSubstr("must be a range vector"));
  EXPECT_THAT(Error("sum(targets_total[5m])"), HasSubstr("not a range vector"));
  EXPECT_THAT(Error("targets_total[5m]"), HasSubstr("cannot be graphed"));
  EXPECT_THAT(Error("histogram_quantile(0.9, sum by (outcome) (rate(wait_seconds_bucket[5m])))"),
              HasSubstr("needs the buckets' le label"));
  EXPECT_THAT(Error("histogram_quantile(0.9, rate(wait_seconds_sum[5m]))"),
              HasSubstr("not a histogram's _bucket series"));
  EXPECT_THAT(Error("histogram_quantile(sum(jobs), jobs)"), HasSubstr("must be a scalar"));
  EXPECT_THAT(Error("jobs{phase=~Pending}"), HasSubstr("a quoted label value"));
  EXPECT_THAT(Error("jobs{phase==\"x\"}"), HasSubstr("is not a label matcher"));
  EXPECT_THAT(Error("sum(jobs[5m:1m])"), HasSubstr("subqueries"));
  EXPECT_THAT(Error("jobs @ 100"), HasSubstr("@ modifier"));
  EXPECT_THAT(Error("{phase=\"x\"}"), HasSubstr("without a metric name"));
  EXPECT_THAT(Error("1 > 2"), HasSubstr("needs bool"));
  EXPECT_THAT(Error("jobs jobs"), HasSubstr("unexpected \"jobs\""));
  EXPECT_THAT(Error("sum by (phase) jobs"), HasSubstr("expected '(' after sum"));
  EXPECT_THAT(Error("rate(targets_total[5x])"), HasSubstr("bad number or duration"));
  EXPECT_THAT(Error("clamp_min(jobs)"), HasSubstr("takes 2 argument(s), not 1"));
}

TEST(PromqlCheckTest, ChecksLegendsAndVariableQueries) {
  absl::StatusOr<Result> by_phase = Check("sum by (phase) (jobs)", Small());
  ASSERT_TRUE(by_phase.ok()) << by_phase.status();
  EXPECT_TRUE(CheckLegend("{{phase}}", *by_phase).ok());
  EXPECT_TRUE(CheckLegend("jobs {{ phase }}", *by_phase).ok());
  EXPECT_THAT(CheckLegend("{{pod}}", *by_phase).message(), HasSubstr("names label \"pod\""));
  EXPECT_THAT(CheckLegend("{{phase", *by_phase).message(), HasSubstr("unclosed"));
  absl::StatusOr<Result> quantile = Check(
      "histogram_quantile(0.5, sum by (le, outcome) (rate(wait_seconds_bucket[5m])))", Small());
  ASSERT_TRUE(quantile.ok()) << quantile.status();
  EXPECT_EQ(quantile->labels, std::set<std::string>{"outcome"}) << "le is gone";

  EXPECT_TRUE(CheckLabelValues("label_values(jobs, phase)", Small()).ok());
  EXPECT_TRUE(CheckLabelValues("label_values(jobs{namespace=~\"$ns\"}, pod)", Small()).ok());
  EXPECT_TRUE(CheckLabelValues("label_values(namespace)", Small()).ok());
  EXPECT_TRUE(CheckLabelValues("label_values(outcome)", Small()).ok());
  EXPECT_THAT(CheckLabelValues("label_values(jobs, outcome)", Small()).message(),
              HasSubstr("label \"outcome\" is not carried"));
  EXPECT_THAT(CheckLabelValues("label_values(nope, pod)", Small()).message(),
              HasSubstr("unknown metric"));
  EXPECT_THAT(CheckLabelValues("label_values(bogus)", Small()).message(),
              HasSubstr("no exported series carries label \"bogus\""));
  EXPECT_THAT(CheckLabelValues("query_result(jobs)", Small()).message(),
              HasSubstr("is not label_values"));
}

}  // namespace
}  // namespace clusterprof::testing::promql
