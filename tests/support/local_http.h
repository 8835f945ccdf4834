// Small helpers for tests and benchmarks that talk to local processes: their port files, their
// HTTP endpoints, and the Prometheus text they serve.
#ifndef CLUSTERPROF_TESTS_SUPPORT_LOCAL_HTTP_H_
#define CLUSTERPROF_TESTS_SUPPORT_LOCAL_HTTP_H_

#include <map>
#include <string>

namespace clusterprof::testing {

// The "name=port" lines of a port file (clusterprof-sidecar and clusterprof-operator write one
// with --port-file); empty when it cannot be read.
std::map<std::string, int> ReadPortFile(const std::string& path);

// GET http://127.0.0.1:port/path: the body, or "" when there is no answer.
std::string HttpGet(int port, const std::string& path);

// The sum of the samples of metric `name` whose label text contains `labels` ("" for all), in
// Prometheus text format.
double MetricSum(const std::string& text, const std::string& name, const std::string& labels);

}  // namespace clusterprof::testing

#endif  // CLUSTERPROF_TESTS_SUPPORT_LOCAL_HTTP_H_
