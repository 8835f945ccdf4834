#include "analysis/report.h"

#include <algorithm>
#include <map>

#include "common/base/json_writer.h"
#include "common/base/strings.h"
#include "common/storage/logdir.h"
#include "common/storage/storage.h"
#include "common/xspace/summary.h"
#include "common/xspace/xspace_io.h"
#include "fmt/format.h"
// After fmt: cpprest's headers break fmt's format_as detection when they come first.
#include "cpprest/json.h"

namespace clusterprof::analysis {
namespace {

using xspace::FormatDurationNs;

// A manifest larger than this is not read (it names each target once: a few hundred bytes each).
constexpr uint64_t kMaxManifestBytes = 64 << 20;

// Each host's clock offset from the manifest, by host name.
std::map<std::string, int64_t> ClockOffsets(const std::string& manifest,
                                            int64_t* lookback_start_ns) {
  std::map<std::string, int64_t> offsets;
  try {
    const web::json::value json = web::json::value::parse(manifest);
    if (!json.has_array_field("targets")) return offsets;
    for (const web::json::value& target : json.at("targets").as_array()) {
      if (target.has_number_field("lookback_ns") &&
          target.at("lookback_ns").as_number().to_int64() > 0 && json.has_number_field("t0_ns")) {
        *lookback_start_ns = json.at("t0_ns").as_number().to_int64();
      }
      if (!target.has_string_field("host") || !target.has_number_field("clock_offset_ns")) {
        continue;
      }
      offsets[target.at("host").as_string()] = target.at("clock_offset_ns").as_number().to_int64();
    }
  } catch (const std::exception&) {
    // A manifest that does not parse gives no offsets; the report says so.
  }
  return offsets;
}

}  // namespace

absl::StatusOr<RunHosts> ListRunHosts(storage::Storage& storage, const std::string& run_dir) {
  absl::StatusOr<std::vector<storage::Entry>> entries = storage.List(run_dir);
  if (!entries.ok()) return entries.status();
  RunHosts run;
  bool has_manifest = false;
  for (const storage::Entry& entry : *entries) {
    std::string_view name = entry.name;
    if (entry.is_directory) continue;
    if (name == storage::kManifestName) has_manifest = entry.bytes <= kMaxManifestBytes;
    if (ConsumeSuffix(&name, storage::kXPlaneSuffix)) run.hosts.emplace_back(name);
  }
  if (run.hosts.empty()) {
    return absl::NotFoundError(StrCat(run_dir, " holds no ", storage::kXPlaneSuffix,
                                      " files: give a run directory "
                                      "(<logdir>/plugins/profile/<run>)"));
  }
  std::sort(run.hosts.begin(), run.hosts.end());
  if (has_manifest) {
    absl::StatusOr<std::string> manifest =
        storage::ReadObject(storage, StrCat(run_dir, "/", storage::kManifestName));
    if (manifest.ok()) {
      run.clock_offsets_ns = ClockOffsets(*manifest, &run.lookback_start_ns);
      run.manifest_found = !run.clock_offsets_ns.empty();
    }
  }
  return run;
}

RunReport MakeRunReport(std::string run_dir, const DigestOptions& options,
                        std::vector<HostRun> runs, const std::vector<std::string>& left_out,
                        bool offsets_known, int64_t verdict_from_ns) {
  RunReport report;
  report.run_dir = std::move(run_dir);
  report.run = report.run_dir.substr(report.run_dir.find_last_of('/') + 1);
  report.options = options;
  report.manifest_found = offsets_known;
  if (verdict_from_ns > 0) {
    // The verdict over the capture window; the lookback's steps only for context.
    std::vector<HostRun> window = runs;
    size_t before = 0;
    for (HostRun& run : window) {
      const size_t all = run.digest.steps.size();
      std::erase_if(run.digest.steps, [&](const StepDigest& step) {
        return step.start_ns - run.clock_offset_ns < verdict_from_ns;
      });
      before = std::max(before, all - run.digest.steps.size());
    }
    report.analysis = FindStragglers(window);
    if (before > 0) {
      report.analysis.notes.push_back(
          StrCat("the verdict is over the steps from the capture's start on; the up to ", before,
                 " steps of the lookback before it are in the traces for context"));
    }
    // The report's pages go with the verdicts, one per host with steps in the window: a host
    // whose steps all came before the start (a workload that ended in the lookback) has none.
    std::vector<HostRun> kept;
    for (size_t i = 0; i < runs.size(); ++i) {
      if (!window[i].digest.steps.empty()) kept.push_back(std::move(runs[i]));
    }
    runs = std::move(kept);
  } else {
    report.analysis = FindStragglers(runs);
  }
  report.analysis.left_out.insert(report.analysis.left_out.begin(), left_out.begin(),
                                  left_out.end());
  if (!offsets_known && runs.size() + left_out.size() > 1) {
    report.analysis.notes.push_back(
        StrCat("no clock offsets (", storage::kManifestName,
               " missing or without targets): the hosts' clocks are taken to agree"));
  }
  // In the order of the verdicts: FindStragglers gives one to each host with steps, in order,
  // and leaves out the others.
  std::erase_if(runs, [](const HostRun& run) { return run.digest.steps.empty(); });
  report.runs = std::move(runs);
  return report;
}

absl::StatusOr<RunReport> AnalyzeRunDirectory(
    storage::Storage& storage, const std::string& run_dir, const DigestOptions& options,
    const std::function<void(const std::string& host, int index, int total)>& progress) {
  absl::StatusOr<RunHosts> run = ListRunHosts(storage, run_dir);
  if (!run.ok()) return run.status();
  const std::vector<std::string>& hosts = run->hosts;
  std::vector<HostRun> runs;
  std::vector<std::string> unreadable;
  for (size_t i = 0; i < hosts.size(); ++i) {
    const std::string& host = hosts[i];
    if (progress) progress(host, static_cast<int>(i), static_cast<int>(hosts.size()));
    const std::string path = StrCat(run_dir, "/", host, storage::kXPlaneSuffix);
    // One host at a time: its trace is gone before the next is read.
    absl::StatusOr<std::unique_ptr<storage::LocalCopy>> local =
        storage::LocalCopy::Fetch(storage, path);
    absl::StatusOr<std::unique_ptr<xspace::LoadedXSpace>> loaded =
        local.ok() ? xspace::ReadXSpaceFile((*local)->path())
                   : absl::StatusOr<std::unique_ptr<xspace::LoadedXSpace>>(local.status());
    if (!loaded.ok()) {
      unreadable.push_back(StrCat(host, ": unreadable: ", loaded.status().message()));
      continue;
    }
    absl::StatusOr<HostDigest> digest = DigestXSpace((*loaded)->space(), host, options);
    if (!digest.ok()) return digest.status();  // a bad pattern: the same for every host
    runs.push_back({*std::move(digest), run->OffsetOf(host)});
  }
  return MakeRunReport(run_dir, options, std::move(runs), unreadable, run->manifest_found,
                       run->lookback_start_ns);
}

std::string FormatVerdictText(const Analysis& a) {
  std::string out;
  const std::vector<const HostVerdict*> stragglers = a.stragglers();
  if (!stragglers.empty()) {
    for (const HostVerdict* host : stragglers) {
      out += fmt::format("STRAGGLER {} ({}): {}\n", host->host, CauseName(host->cause),
                         host->evidence);
    }
  } else if (a.compared_steps > 0) {
    out += fmt::format(
        "no straggler: no host entered the collectives late in half of the {} "
        "steps compared\n",
        a.compared_steps);
  }
  for (const std::string& note : a.notes) out += fmt::format("note: {}\n", note);
  return out;
}

std::string FormatReportText(const RunReport& report) {
  const Analysis& a = report.analysis;
  std::string out = fmt::format("run {}: {} host{}", report.run_dir, a.hosts.size(),
                                a.hosts.size() == 1 ? "" : "s");
  if (a.steps > 0) {
    out += fmt::format(", steps {}-{} in common ({} compared)", a.first_step, a.last_step,
                       a.compared_steps);
  }
  out += "\n\n";
  out += FormatVerdictText(a);
  out += fmt::format("\n  {:<24} {:>6} {:>11} {:>11} {:>11} {:>8} {:>12} {:>12}  {}\n", "host",
                     "steps", "step p50", "step p90", "step max", "late", "lateness", "others wait",
                     "verdict");
  for (const HostVerdict& host : a.hosts) {
    out += fmt::format(
        "  {:<24} {:>6} {:>11} {:>11} {:>11} {:>8} {:>12} {:>12}  {}\n", host.host, host.steps,
        FormatDurationNs(host.step_p50_ns), FormatDurationNs(host.step_p90_ns),
        FormatDurationNs(host.step_max_ns),
        a.compared_steps > 0 ? fmt::format("{}/{}", host.late_steps, a.compared_steps)
                             : std::string("-"),
        host.late_steps > 0 ? FormatDurationNs(host.median_lateness_ns) : "-",
        host.late_steps > 0 ? FormatDurationNs(host.others_wait_ns) : "-",
        host.straggler ? fmt::format("straggler ({})", CauseName(host.cause)) : std::string("ok"));
  }
  for (const std::string& left : a.left_out) out += fmt::format("  left out: {}\n", left);
  return out;
}

std::string ReportJson(const RunReport& report) {
  const Analysis& a = report.analysis;
  std::string out;
  JsonWriter json(&out);
  json.Open('{');
  json.Field("kind", std::string_view("clusterprof.io/v1alpha1/RunReport"));
  json.Field("schema_version", int64_t{kReportSchemaVersion});
  json.Field("run", report.run);
  json.Field("run_dir", report.run_dir);
  json.Key("patterns");
  json.Open('{');
  json.Field("step", report.options.step_pattern);
  json.Field("collective", report.options.collective_pattern);
  json.Field("input", report.options.input_pattern);
  json.Close('}');
  json.Key("steps");
  json.Open('{');
  json.Field("first", a.first_step);
  json.Field("last", a.last_step);
  json.Field("in_common", int64_t{a.steps});
  json.Field("compared", int64_t{a.compared_steps});
  json.Close('}');
  json.Key("stragglers");
  json.Open('[');
  for (const HostVerdict* host : a.stragglers()) json.String(host->host);
  json.Close(']');
  json.Key("hosts");
  json.Open('[');
  for (const HostVerdict& host : a.hosts) {
    json.Open('{');
    json.Field("host", host.host);
    json.Field("steps", int64_t{host.steps});
    json.Field("step_p50_ns", host.step_p50_ns);
    json.Field("step_p90_ns", host.step_p90_ns);
    json.Field("step_max_ns", host.step_max_ns);
    json.Field("straggler", host.straggler);
    json.Field("late_steps", int64_t{host.late_steps});
    json.Field("median_lateness_ns", host.median_lateness_ns);
    json.Field("others_wait_ns", host.others_wait_ns);
    json.Field("cause", CauseName(host.cause));
    json.Field("evidence", host.evidence);
    json.Close('}');
  }
  json.Close(']');
  json.Key("left_out");
  json.Open('[');
  for (const std::string& left : a.left_out) json.String(left);
  json.Close(']');
  json.Key("notes");
  json.Open('[');
  for (const std::string& note : a.notes) json.String(note);
  json.Close(']');
  json.Close('}');
  out.push_back('\n');
  return out;
}

}  // namespace clusterprof::analysis
