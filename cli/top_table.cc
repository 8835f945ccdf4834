#include "cli/top_table.h"

#include <algorithm>
#include <map>

#include "absl/time/time.h"
#include "analysis/stragglers.h"
#include "cpprest/json.h"
#include "fmt/format.h"

namespace clusterprof::cli {
namespace {

// A host whose last step ended this many of its step times ago (and at least this long) has
// stalled.
constexpr int kStallSteps = 10;
constexpr int64_t kStallMinNs = 5'000'000'000;

int64_t Median(std::vector<int64_t> values) {
  if (values.empty()) return 0;
  std::nth_element(values.begin(), values.begin() + values.size() / 2, values.end());
  return values[values.size() / 2];
}

std::string Duration(int64_t ns) {
  if (ns < 0) return "-";
  if (ns < 1'000'000) return fmt::format("{:.0f} us", ns / 1e3);
  if (ns < 1'000'000'000) return fmt::format("{:.1f} ms", ns / 1e6);
  return fmt::format("{:.1f} s", ns / 1e9);
}

}  // namespace

absl::StatusOr<std::vector<coordinator::WatchedSidecar>> ParseOperatorView(
    const std::string& json) {
  std::vector<coordinator::WatchedSidecar> out;
  try {
    const web::json::value view = web::json::value::parse(json);
    for (const web::json::value& s : view.at("sidecars").as_array()) {
      coordinator::WatchedSidecar sidecar;
      sidecar.address = s.at("address").as_string();
      sidecar.host_name = s.at("pod").as_string();
      sidecar.connected = s.at("connected").as_bool();
      sidecar.error = s.at("error").as_string();
      sidecar.last_message_ns = s.at("lastMessageNs").as_number().to_int64();
      sidecar.clock_offset_ns = s.at("clockOffsetNs").as_number().to_int64();
      sidecar.clock_uncertainty_ns = s.at("clockUncertaintyNs").as_number().to_int64();
      sidecar.processes = s.at("processes").as_integer();
      sidecar.processes_with_steps = s.at("processesWithSteps").as_integer();
      sidecar.step_source = s.at("stepSource").as_string();
      sidecar.steps_total = s.at("stepsTotal").as_number().to_uint64();
      sidecar.last_step_end_ns = s.at("lastStepEndNs").as_number().to_int64();
      sidecar.recorder_level = s.at("recorderLevel").as_integer();
      sidecar.recorder_window_ms = s.at("recorderWindowMs").as_number().to_int64();
      for (const web::json::value& row : s.at("steps").as_array()) {
        analysis::StepDigest step;
        step.step = row.at(0).as_number().to_int64();
        step.start_ns = row.at(1).as_number().to_int64();
        step.end_ns = row.at(2).as_number().to_int64();
        step.collective_entry_ns = row.at(3).as_number().to_int64();
        sidecar.steps.push_back(step);
      }
      out.push_back(std::move(sidecar));
    }
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        fmt::format("the operator's answer is not a trigger's steps: {}", e.what()));
  }
  return out;
}

TopTable BuildTopTable(const std::vector<coordinator::WatchedSidecar>& sidecars, int steps,
                       int64_t now_ns) {
  TopTable table;
  std::vector<analysis::HostRun> runs;
  std::vector<size_t> run_rows;
  for (const coordinator::WatchedSidecar& s : sidecars) {
    TopRow row;
    row.address = s.address;
    row.host = s.host_name.empty() ? s.address : s.host_name;
    row.processes = s.processes;
    row.recorder_level = s.recorder_level;
    row.recorder_window_ms = s.recorder_window_ms;
    if (!s.connected && s.last_message_ns == 0) {
      row.verdict = "unreachable";
      row.detail = s.error;
      ++table.unreachable;
      table.rows.push_back(std::move(row));
      continue;
    }
    if (!s.connected) row.detail = fmt::format("stream down ({}); showing what it sent", s.error);
    const size_t first = s.steps.size() > static_cast<size_t>(steps) ? s.steps.size() - steps : 0;
    std::vector<analysis::StepDigest> recent(s.steps.begin() + static_cast<std::ptrdiff_t>(first),
                                             s.steps.end());
    if (recent.empty()) {
      row.verdict = "no steps";
      row.detail = s.processes == 0 ? "no instrumented process attached"
                                    : fmt::format("{} process(es) attached, none marks steps ({})",
                                                  s.processes, s.step_source);
      table.rows.push_back(std::move(row));
      continue;
    }
    row.last_step = recent.back().step;
    std::vector<int64_t> durations;
    for (const analysis::StepDigest& step : recent) durations.push_back(step.duration_ns());
    row.step_p50_ns = Median(durations);
    row.since_last_step_ns =
        std::max<int64_t>(0, now_ns - (s.last_step_end_ns - s.clock_offset_ns));
    const bool stalled = row.since_last_step_ns > kStallMinNs &&
                         row.since_last_step_ns > kStallSteps * row.step_p50_ns;
    const bool collectives =
        std::any_of(recent.begin(), recent.end(),
                    [](const analysis::StepDigest& step) { return step.collective_entry_ns != 0; });
    row.verdict = stalled ? "stalled" : collectives ? "ok" : "no collectives";
    if (stalled) row.detail = fmt::format("no step for {}", Duration(row.since_last_step_ns));
    analysis::HostRun run;
    run.digest.host = row.host;
    run.digest.steps = std::move(recent);
    run.clock_offset_ns = s.clock_offset_ns;
    if (collectives) {
      runs.push_back(std::move(run));
      run_rows.push_back(table.rows.size());
    }
    table.rows.push_back(std::move(row));
  }
  if (runs.size() < 2) {
    if (!table.rows.empty()) table.notes.push_back("lateness needs two hosts with collectives");
    return table;
  }
  // Lateness on one clock, over the steps every host has with a collective.
  std::map<int64_t, std::vector<int64_t>> entries;  // step -> entry per run (reference clock)
  for (size_t r = 0; r < runs.size(); ++r) {
    for (const analysis::StepDigest& step : runs[r].digest.steps) {
      if (step.collective_entry_ns == 0) continue;
      std::vector<int64_t>& e = entries[step.step];
      if (e.size() == r) e.push_back(step.collective_entry_ns - runs[r].clock_offset_ns);
    }
  }
  std::vector<std::vector<int64_t>> lateness(runs.size());
  for (const auto& [step, e] : entries) {
    if (e.size() != runs.size()) continue;
    ++table.compared_steps;
    const int64_t earliest = *std::min_element(e.begin(), e.end());
    for (size_t r = 0; r < runs.size(); ++r) lateness[r].push_back(e[r] - earliest);
  }
  if (table.compared_steps == 0) {
    table.notes.push_back("the hosts have no step with a collective in common yet");
    return table;
  }
  for (size_t r = 0; r < runs.size(); ++r) {
    table.rows[run_rows[r]].lateness_ns = Median(lateness[r]);
  }
  const analysis::Analysis analysis = analysis::FindStragglers(runs);
  for (const analysis::HostVerdict& verdict : analysis.hosts) {
    if (!verdict.straggler) continue;
    for (size_t r = 0; r < runs.size(); ++r) {
      TopRow& row = table.rows[run_rows[r]];
      if (row.host != verdict.host || row.verdict == "stalled") continue;
      row.verdict = "straggler";
      row.detail = verdict.evidence;
    }
  }
  for (const std::string& note : analysis.notes) table.notes.push_back(note);
  return table;
}

std::string FormatTopTable(const TopTable& table, int steps, int64_t now_ns) {
  std::string out = fmt::format(
      "clusterprof top  {}  {} host(s), the last {} steps{}\n\n",
      absl::FormatTime("%H:%M:%S", absl::FromUnixNanos(now_ns), absl::UTCTimeZone()),
      table.rows.size(), steps,
      table.compared_steps > 0 ? fmt::format(", {} compared", table.compared_steps) : "");
  out += fmt::format("  {:<28} {:>9} {:>11} {:>10} {:>10}  {:<14} {:>5}  {}\n", "HOST", "STEP",
                     "STEP TIME", "LAST STEP", "LATE", "VERDICT", "PROCS", "RECORDER");
  for (const TopRow& row : table.rows) {
    const std::string recorder = row.recorder_level == 0 ? "off"
                                 : row.recorder_window_ms > 0
                                     ? fmt::format("{} s", row.recorder_window_ms / 1000)
                                     : "steps only";
    out +=
        fmt::format("  {:<28} {:>9} {:>11} {:>10} {:>10}  {:<14} {:>5}  {}\n", row.host,
                    row.last_step >= 0 ? fmt::format("{}", row.last_step) : "-",
                    row.step_p50_ns > 0 ? Duration(row.step_p50_ns) : "-",
                    row.since_last_step_ns >= 0 ? Duration(row.since_last_step_ns) + " ago" : "-",
                    Duration(row.lateness_ns), row.verdict, row.processes, recorder);
  }
  bool details = false;
  for (const TopRow& row : table.rows) {
    if (row.detail.empty()) continue;
    if (!details) out += "\n";
    details = true;
    out += fmt::format("  {}: {}\n", row.host, row.detail);
  }
  for (const std::string& note : table.notes) out += fmt::format("  note: {}\n", note);
  return out;
}

}  // namespace clusterprof::cli
