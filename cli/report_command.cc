#include <unistd.h>

#include <fstream>
#include <iostream>

#include "analysis/report.h"
#include "analysis/report_html.h"
#include "cli/commands.h"
#include "common/base/clock.h"
#include "common/storage/dirs.h"
#include "common/storage/logdir.h"
#include "common/storage/storage_set.h"
#include "fmt/format.h"

namespace clusterprof::cli {
namespace {

// Writes `text` to `path` whole; false, having said why on `err`, when it cannot.
bool WriteFile(const std::string& path, const std::string& text, std::ostream& err) {
  const absl::Status written = storage::WriteFileDurably(path, text, 0644);
  if (!written.ok()) {
    err << "clusterprof report: cannot write " << path << ": " << written.message() << "\n";
    return false;
  }
  return true;
}

}  // namespace

int RunReport(const ReportOptions& options, std::ostream& out, std::ostream& err) {
  absl::StatusOr<storage::Logdir> path = storage::ParseLogdir(options.path);
  if (!path.ok()) {
    err << "clusterprof report: " << path.status().message() << "\n";
    return kExitUsage;
  }
  analysis::DigestOptions digest;
  digest.step_pattern = options.step_pattern;
  if (!options.collective_pattern.empty()) digest.collective_pattern = options.collective_pattern;
  if (!options.input_pattern.empty()) digest.input_pattern = options.input_pattern;
  RealClock clock;
  storage::StorageSet storages(storage::StorageSetOptions{.clock = &clock});
  absl::StatusOr<storage::Storage*> storage = storages.For(*path);
  if (!storage.ok()) {
    err << "clusterprof report: " << storage.status().message() << "\n";
    return kExitFailure;
  }
  const bool progress = options.progress && isatty(STDERR_FILENO) == 1;
  absl::StatusOr<analysis::RunReport> report = analysis::AnalyzeRunDirectory(
      **storage, path->uri, digest, [&](const std::string& host, int index, int total) {
        if (progress) err << fmt::format("\rreading {} ({} of {})\x1b[K", host, index + 1, total);
      });
  if (progress) err << "\r\x1b[K";
  if (!report.ok()) {
    err << "clusterprof report: " << report.status().message() << "\n";
    return report.status().code() == absl::StatusCode::kInvalidArgument ? kExitUsage : kExitFailure;
  }
  out << analysis::FormatReportText(*report, options.all);
  if (!options.json.empty()) {
    if (!WriteFile(options.json, analysis::ReportJson(*report), err)) return kExitFailure;
    out << "\nJSON report: " << options.json << "\n";
  }
  if (!options.html.empty()) {
    if (!WriteFile(options.html, analysis::ReportHtml(*report), err)) return kExitFailure;
    out << (options.json.empty() ? "\n" : "") << "HTML report: " << options.html << "\n";
  }
  if (report->analysis.hosts.empty()) {
    err << "clusterprof report: no host could be analyzed (see \"left out\" above)\n";
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace clusterprof::cli
