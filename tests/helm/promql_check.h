// A PromQL checker for the queries of helm/clusterprof/dashboards/clusterprof.json: each query
// is parsed (the PromQL grammar a dashboard uses: selectors with label matchers, range
// selectors, offset, functions, aggregations with by/without, binary operators with bool,
// on/ignoring and group_left/group_right, numbers and strings) and typed against what the
// binaries really export, as a /metrics page of theirs says (Prometheus text format):
//
//   - every metric it names is exported (histograms as NAME_bucket, NAME_sum, NAME_count);
//   - every label it matches on, groups by, or joins on is one the metric carries, or one that
//     the scrape adds (the target labels: namespace, pod, job, instance);
//   - rate(), irate() and increase() take counters or a histogram's series only;
//   - histogram_quantile() takes _bucket series that still carry `le`;
//   - range vectors appear only where a function takes one, and vector-to-vector operators
//     without on()/ignoring() compare the same labels (or nothing would match).
//
// It is a checker for the dashboard's queries, not a full PromQL implementation: subqueries,
// `@` modifiers and selectors without a metric name are refused. Grafana's variables ($var,
// ${var}) may appear inside strings and range durations ($__rate_interval, ...).
#ifndef CLUSTERPROF_TESTS_HELM_PROMQL_CHECK_H_
#define CLUSTERPROF_TESTS_HELM_PROMQL_CHECK_H_

#include <map>
#include <set>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace clusterprof::testing::promql {

// What /metrics pages export, by sample name.
struct Exposition {
  struct Series {
    std::string family;  // the # TYPE line's name
    std::string type;    // counter, gauge, histogram, summary, untyped
    std::set<std::string> labels;
  };
  std::map<std::string, Series> series;
};

// Adds the samples of one page in the Prometheus text format to `exposition`. A sample whose
// family has no # TYPE line is untyped.
absl::Status ParseExposition(std::string_view text, Exposition& exposition);

// The labels the scrape adds to every series (Prometheus Operator's ServiceMonitor and PodMonitor,
// and the usual kubernetes-pods scrape configs, all add these).
inline const std::set<std::string>& TargetLabels() {
  static const std::set<std::string> labels = {"namespace", "pod", "job", "instance"};
  return labels;
}

// What a checked expression gives: its kind and the labels its series may carry.
struct Result {
  enum class Kind { kScalar, kString, kVector, kRange };
  Kind kind = Kind::kVector;
  std::set<std::string> labels;
};

// Checks `expr` as described above. The error says what is wrong and where (byte offset).
absl::StatusOr<Result> Check(std::string_view expr, const Exposition& exported,
                             const std::set<std::string>& target_labels = TargetLabels());

// Checks a Grafana legend format ("{{namespace}}/{{pod}}") against the labels of its query.
absl::Status CheckLegend(std::string_view legend, const Result& result);

// Checks a Grafana query variable: label_values(LABEL) or label_values(SELECTOR, LABEL).
absl::Status CheckLabelValues(std::string_view query, const Exposition& exported,
                              const std::set<std::string>& target_labels = TargetLabels());

}  // namespace clusterprof::testing::promql

#endif  // CLUSTERPROF_TESTS_HELM_PROMQL_CHECK_H_
