// What `clusterprof top` shows, computed from the sidecars' live steps (pure, for tests).
#ifndef CLUSTERPROF_CLI_TOP_TABLE_H_
#define CLUSTERPROF_CLI_TOP_TABLE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/step_watcher.h"

namespace clusterprof::cli {

struct TopRow {
  std::string host;  // the sidecar's name, else its address
  std::string address;
  int64_t last_step = -1;
  // Median duration of its last `steps` steps; 0: none.
  int64_t step_p50_ns = 0;
  // Since its last step ended, on our clock; -1: no step yet.
  int64_t since_last_step_ns = -1;
  // Median of (its collective entry - the earliest host's), on one clock, over the steps every
  // host has with a collective; -1: not known.
  int64_t lateness_ns = -1;
  // "ok", "straggler", "stalled", "no steps", "no collectives", "unreachable".
  std::string verdict;
  // Why, for "unreachable", "no steps" and "straggler".
  std::string detail;
  int processes = 0;
  int recorder_level = 0;
  int64_t recorder_window_ms = 0;
};

struct TopTable {
  std::vector<TopRow> rows;
  int unreachable = 0;
  // Steps compared across hosts for lateness and the verdict.
  int compared_steps = 0;
  std::vector<std::string> notes;
};

// The operator's view of a ProfileTrigger's pods (GET /triggers/<namespace>/<name> on its
// health port) as followed sidecars; INVALID_ARGUMENT naming what does not parse.
absl::StatusOr<std::vector<coordinator::WatchedSidecar>> ParseOperatorView(const std::string& json);

// `steps`: how many of the latest steps count; `now_ns`: our wall clock.
TopTable BuildTopTable(const std::vector<coordinator::WatchedSidecar>& sidecars, int steps,
                       int64_t now_ns);
std::string FormatTopTable(const TopTable& table, int steps, int64_t now_ns);

}  // namespace clusterprof::cli

#endif  // CLUSTERPROF_CLI_TOP_TABLE_H_
