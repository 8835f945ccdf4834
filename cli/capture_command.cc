// clusterprof capture: a synchronized capture across profiler servers, with a live progress
// line per host on a terminal and a summary table at the end.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "analysis/report.h"
#include "cli/commands.h"
#include "common/base/clock.h"
#include "common/base/strings.h"
#include "common/base/token_file.h"
#include "common/storage/logdir.h"
#include "coordinator/coordinator.h"
#include "fmt/format.h"

namespace clusterprof::cli {
namespace {

using coordinator::Outcome;
using coordinator::Phase;
using coordinator::RunResult;
using coordinator::TargetResult;

std::string FormatBytes(uint64_t bytes) {
  if (bytes < 1024) return fmt::format("{} B", bytes);
  if (bytes < 1024 * 1024) return fmt::format("{:.1f} KiB", bytes / 1024.0);
  return fmt::format("{:.1f} MiB", bytes / (1024.0 * 1024.0));
}

std::string FormatMicros(int64_t ns) { return fmt::format("{:+.0f} us", ns / 1000.0); }

std::string ProgressText(const TargetResult& target, const RunResult& state, int64_t now_ns,
                         int64_t duration_ms) {
  switch (target.phase) {
    case Phase::kProbing:
      return "connecting";
    case Phase::kWaiting:
      return fmt::format("starts in {:.1f} s", (state.t0_ns - now_ns) / 1e9);
    case Phase::kCapturing: {
      const double elapsed = (now_ns - state.t0_ns) / 1e9;
      const int width = 20;
      const int filled =
          std::clamp(static_cast<int>(elapsed * 1000 / duration_ms * width), 0, width);
      return fmt::format("capturing [{}{}] {:.1f}/{:.1f} s", std::string(filled, '#'),
                         std::string(width - filled, '.'), elapsed, duration_ms / 1000.0);
    }
    case Phase::kCollecting:
      return "collecting and writing";
    case Phase::kDone:
      if (target.outcome == Outcome::kFailed) return fmt::format("failed: {}", target.message);
      if (target.outcome == Outcome::kEmpty) return "done, empty trace";
      return target.stats_known ? fmt::format("done, {} events", target.events) : "done";
  }
  return "";
}

// Redraws one line per host in place on a terminal; elsewhere prints each host's end once.
class ProgressPrinter {
 public:
  ProgressPrinter(std::ostream& err, bool terminal, int64_t duration_ms)
      : err_(err), terminal_(terminal), duration_ms_(duration_ms) {}

  void Update(const RunResult& state, int64_t now_ns) {
    if (state.targets.size() > analysis::kTextAllHostsUpTo) {
      UpdateMany(state, now_ns);
      return;
    }
    if (terminal_) {
      if (lines_ > 0) err_ << "\x1b[" << lines_ << "A";
      for (const TargetResult& target : state.targets) {
        err_ << "\r\x1b[2K"
             << fmt::format("  {:<24} {}",
                            target.host_name.empty() ? target.address : target.host_name,
                            ProgressText(target, state, now_ns, duration_ms_))
             << "\n";
      }
      lines_ = static_cast<int>(state.targets.size());
      err_.flush();
      return;
    }
    for (const TargetResult& target : state.targets) {
      if (target.phase != Phase::kDone) continue;
      const std::string key = fmt::format("{}#{}", target.address, target.attempts);
      if (!printed_.emplace(key, true).second) continue;
      err_ << fmt::format("  {:<24} attempt {}: {}\n", target.host_name, target.attempts,
                          ProgressText(target, state, now_ns, duration_ms_));
    }
  }

 private:
  // Many hosts: one line of counts by phase (redrawn on a terminal, else printed when it
  // changes), and each host that ends without data on a line of its own.
  void UpdateMany(const RunResult& state, int64_t now_ns) {
    size_t phases[5] = {0, 0, 0, 0, 0};
    for (const TargetResult& target : state.targets) {
      ++phases[static_cast<int>(target.phase)];
      if (target.phase == Phase::kDone && target.outcome != Outcome::kOk) {
        const std::string key = fmt::format("{}#{}", target.address, target.attempts);
        if (printed_.emplace(key, true).second) {
          if (terminal_) err_ << "\r\x1b[2K";
          err_ << fmt::format("  {:<24} attempt {}: {}\n", target.host_name, target.attempts,
                              ProgressText(target, state, now_ns, duration_ms_));
        }
      }
    }
    const std::string line = fmt::format(
        "  {} hosts: {} connecting, {} waiting, {} capturing, {} collecting, {} done",
        state.targets.size(), phases[static_cast<int>(Phase::kProbing)],
        phases[static_cast<int>(Phase::kWaiting)], phases[static_cast<int>(Phase::kCapturing)],
        phases[static_cast<int>(Phase::kCollecting)], phases[static_cast<int>(Phase::kDone)]);
    if (terminal_) {
      last_line_ = line;
      err_ << "\r\x1b[2K" << line;
      if (phases[static_cast<int>(Phase::kDone)] == state.targets.size()) err_ << "\n";
      err_.flush();
    } else if (line != last_line_ &&
               (now_ns - last_print_ns_ >= kNanosPerSecond ||
                phases[static_cast<int>(Phase::kDone)] == state.targets.size())) {
      // Elsewhere (a log, a pipe): at most once a second, and the last.
      err_ << line << "\n";
      last_line_ = line;
      last_print_ns_ = now_ns;
    }
  }

  std::ostream& err_;
  const bool terminal_;
  const int64_t duration_ms_;
  int lines_ = 0;
  std::map<std::string, bool> printed_;
  std::string last_line_;
  int64_t last_print_ns_ = 0;
};

std::string SummaryRow(const TargetResult& t) {
  const std::string events = t.stats_known ? fmt::format("{}", t.events) : "-";
  const std::string dropped = t.stats_known ? fmt::format("{}", t.dropped_events) : "-";
  const std::string bytes = t.stats_known ? FormatBytes(t.bytes) : "-";
  const std::string start = t.start_known ? FormatMicros(t.start_error_ns) : "-";
  std::string note = t.message;
  if (note.empty() && !t.warnings.empty()) note = t.warnings.front();
  if (note.empty() && t.attempts > 1) note = fmt::format("{} attempts", t.attempts);
  if (note.empty() && !t.is_sidecar && t.outcome != Outcome::kFailed) {
    note = "not a clusterprof sidecar: clock not probed";
  }
  return fmt::format("  {:<24} {:<8} {:>9} {:>8} {:>11} {:>12}  {}\n", t.host_name,
                     coordinator::OutcomeName(t.outcome), events, dropped, bytes, start, note);
}

}  // namespace

void PrintCaptureSummary(const RunResult& result, bool all, std::ostream& out) {
  out << fmt::format("\n  {:<24} {:<8} {:>9} {:>8} {:>11} {:>12}  {}\n", "host", "outcome",
                     "events", "dropped", "bytes", "start error", "note");
  if (all || result.targets.size() <= analysis::kTextAllHostsUpTo) {
    for (const TargetResult& t : result.targets) out << SummaryRow(t);
  } else {
    // Failed and empty first (in order), then the latest starts; the rest in one line.
    std::vector<const TargetResult*> shown;
    for (const TargetResult& t : result.targets) {
      if (t.outcome != Outcome::kOk && shown.size() < analysis::kTextWorstHosts) {
        shown.push_back(&t);
      }
    }
    for (const TargetResult* t :
         coordinator::LatestStarts(result, analysis::kTextWorstHosts - shown.size())) {
      shown.push_back(t);
    }
    for (const TargetResult* t : shown) out << SummaryRow(*t);
    std::vector<int64_t> errors;
    uint64_t events = 0;
    for (const TargetResult& t : result.targets) {
      if (std::find(shown.begin(), shown.end(), &t) != shown.end()) continue;
      if (t.start_known) errors.push_back(std::llabs(t.start_error_ns));
      events += t.events;
    }
    std::sort(errors.begin(), errors.end());
    const auto at = [&](double p) {
      return errors.empty() ? std::string("-")
                            : FormatMicros(errors[std::min(
                                  errors.size() - 1,
                                  static_cast<size_t>(p * static_cast<double>(errors.size())))]);
    };
    out << fmt::format(
        "  ... {} more hosts: {} events, start error p50 {}, p99 {} (--all lists every host)\n",
        result.targets.size() - shown.size(), events, at(0.50), at(0.99));
  }
  out << fmt::format("\n  {} of {} hosts returned data ({} empty, {} failed); max start skew {}\n",
                     result.succeeded, result.targets.size(), result.empty, result.failed,
                     result.max_start_skew_ns > 0
                         ? fmt::format("{:.0f} us", result.max_start_skew_ns / 1000.0)
                         : std::string("unknown"));
  // With a lookback: how far back each host's trace reaches (a recorder that started late, or
  // hit its memory bound, reaches less far); the ten that reach least when there are many.
  std::vector<const TargetResult*> reached;
  for (const TargetResult& t : result.targets) {
    if (t.stats_known && t.lookback_ns > 0) reached.push_back(&t);
  }
  if (!reached.empty()) {
    std::stable_sort(reached.begin(), reached.end(),
                     [](const TargetResult* a, const TargetResult* b) {
                       return a->lookback_ns < b->lookback_ns;
                     });
    std::vector<std::string> lookbacks;
    for (size_t i = 0; i < reached.size() && i < 10; ++i) {
      lookbacks.push_back(
          fmt::format("{} {:.1f} s", reached[i]->host_name, reached[i]->lookback_ns / 1e9));
    }
    out << fmt::format(
        "  lookback before the start: {}{}\n", absl::StrJoin(lookbacks, ", "),
        reached.size() > 10 ? fmt::format(", and {} more", reached.size() - 10) : "");
  }
}

namespace {

// The cross-host verdict from the sidecars' digests, as `clusterprof report` words it, and the
// hosts it left out.
void PrintVerdict(const RunResult& result, std::ostream& out) {
  if (result.report == nullptr) return;
  const analysis::Analysis& a = result.report->analysis;
  std::string text = analysis::FormatVerdictText(a, analysis::kTextWorstHosts);
  for (size_t i = 0; i < a.left_out.size() && i < analysis::kTextWorstHosts; ++i) {
    text += fmt::format("left out: {}\n", a.left_out[i]);
  }
  if (a.left_out.size() > analysis::kTextWorstHosts) {
    text +=
        fmt::format("left out: and {} more hosts\n", a.left_out.size() - analysis::kTextWorstHosts);
  }
  if (text.empty()) return;
  out << "\n";
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    out << "  " << line << "\n";
  }
}

}  // namespace

int RunCapture(const CaptureOptions& options, std::ostream& out, std::ostream& err) {
  coordinator::CaptureOptions capture;
  if (!options.token_file.empty()) {
    absl::StatusOr<std::string> token = ReadTokenFile(options.token_file);
    if (!token.ok()) {
      err << "clusterprof capture: --token-file: " << token.status().message() << "\n";
      return 2;
    }
    capture.auth_token = *token;
  }
  absl::StatusOr<std::vector<coordinator::Target>> targets =
      coordinator::ParseServiceAddresses(options.service_addr);
  if (!targets.ok()) {
    err << "clusterprof capture: --service-addr: " << targets.status().message() << "\n";
    return kExitUsage;
  }
  capture.targets = std::move(*targets);
  {
    std::vector<std::string> addresses;
    for (const coordinator::Target& target : capture.targets) addresses.push_back(target.address);
    absl::StatusOr<std::shared_ptr<const tls::ChannelSecurity>> security =
        ChooseTransport(options.transport, addresses);
    if (!security.ok()) {
      err << "clusterprof capture: " << security.status().message() << "\n";
      return kExitUsage;
    }
    capture.security = *std::move(security);
  }
  if (!options.host_names.empty()) {
    const std::vector<std::string_view> names = SplitSkipEmpty(options.host_names, ',');
    if (names.size() != capture.targets.size()) {
      err << "clusterprof capture: --host-names has " << names.size() << " names for "
          << capture.targets.size() << " addresses; give one per address\n";
      return kExitUsage;
    }
    for (size_t i = 0; i < names.size(); ++i) capture.targets[i].host_name = names[i];
  }
  absl::StatusOr<storage::Logdir> logdir = storage::ParseLogdir(options.logdir);
  if (!logdir.ok()) {
    err << "clusterprof capture: --logdir: " << logdir.status().message() << "\n";
    return kExitUsage;
  }
  RealClock clock;
  absl::StatusOr<storage::RunLayout> layout = storage::RunLayout::Create(
      *std::move(logdir),
      options.run.empty() ? storage::DefaultRunName(clock.WallNs()) : options.run);
  if (!layout.ok()) {
    err << "clusterprof capture: --run: " << layout.status().message() << "\n";
    return kExitUsage;
  }
  capture.layout = *std::move(layout);
  capture.duration_ms = options.duration_ms;
  capture.delay_ms = options.delay_ms;
  capture.num_tracing_attempts = options.num_tracing_attempts;
  capture.profile = options.profile;

  err << fmt::format("Capturing {} ms from {} host{}{} into {}\n", capture.duration_ms,
                     capture.targets.size(), capture.targets.size() == 1 ? "" : "s",
                     capture.delay_ms > 0 ? fmt::format(" after {} ms", capture.delay_ms) : "",
                     capture.layout->logdir().uri);
  ProgressPrinter printer(err, options.progress && isatty(STDERR_FILENO) == 1, capture.duration_ms);
  RunResult last;
  absl::StatusOr<RunResult> result =
      coordinator::Capture(capture, clock, [&](const RunResult& state, int64_t now_ns) {
        last = state;
        printer.Update(state, now_ns);
      });
  if (!result.ok() && last.targets.empty()) {
    err << "clusterprof capture: " << result.status().message() << "\n";
    return result.status().code() == absl::StatusCode::kInvalidArgument ? kExitUsage : kExitFailure;
  }
  const RunResult& final_result = result.ok() ? *result : last;
  PrintCaptureSummary(final_result, options.all, out);
  if (!result.ok()) {
    err << "clusterprof capture: " << result.status().message() << "\n";
    return kExitFailure;
  }
  PrintVerdict(final_result, out);
  out << "\n  run directory  " << final_result.run_dir << "\n";
  if (!final_result.manifest_uri.empty()) {
    out << "  manifest       " << final_result.manifest_uri << "\n";
  }
  if (!final_result.report_html_uri.empty()) {
    out << "  report         " << final_result.report_html_uri << "   (and "
        << storage::kReportJsonName << "; docs/analysis.md)\n";
  }
  out << "  open it with   xprof --logdir " << capture.layout->logdir().uri
      << "   (or tensorboard --logdir " << capture.layout->logdir().uri << ")\n";
  out << "  in Perfetto    load a <host>.trace.json.gz from the run directory at "
         "https://ui.perfetto.dev\n";
  return kExitOk;
}

}  // namespace clusterprof::cli
