#include "analysis/report.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "analysis/digest_proto.h"
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

// The verdict's view of a report's hosts: each one's packed steps, only those from
// `verdict_from_ns` on (reference clock) when it is not 0.
class ReportSource : public StepSource {
 public:
  ReportSource(const std::vector<ReportHost>& hosts, int64_t verdict_from_ns)
      : hosts_(hosts), verdict_from_ns_(verdict_from_ns) {}
  size_t size() const override { return hosts_.size(); }
  const std::string& host(size_t i) const override { return hosts_[i].host; }
  const std::string& step_source(size_t i) const override { return hosts_[i].step_source; }
  int64_t clock_offset_ns(size_t i) const override { return hosts_[i].clock_offset_ns; }
  void Steps(size_t i, std::vector<StepDigest>* steps) const override {
    hosts_[i].steps.Unpack(steps);
    if (verdict_from_ns_ <= 0) return;
    const int64_t offset = hosts_[i].clock_offset_ns;
    std::erase_if(
        *steps, [&](const StepDigest& step) { return step.start_ns - offset < verdict_from_ns_; });
  }

 private:
  const std::vector<ReportHost>& hosts_;
  const int64_t verdict_from_ns_;
};

bool HasDevice(const HostDigest& digest) {
  for (const OpStat& op : digest.top_ops) {
    if (op.device) return true;
  }
  for (const StepDigest& step : digest.steps) {
    if (step.device_busy_ns > 0) return true;
  }
  return false;
}

}  // namespace

bool NaturalLess(std::string_view a, std::string_view b) {
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  size_t i = 0;
  size_t j = 0;
  while (i < a.size() && j < b.size()) {
    if (digit(a[i]) && digit(b[j])) {
      // Numbers: without their leading zeros, the longer is larger, else the first digit that
      // differs decides; equal numbers with more leading zeros come first (007 before 7).
      size_t a_start = i;
      size_t b_start = j;
      while (a_start < a.size() && a[a_start] == '0') ++a_start;
      while (b_start < b.size() && b[b_start] == '0') ++b_start;
      size_t a_end = a_start;
      size_t b_end = b_start;
      while (a_end < a.size() && digit(a[a_end])) ++a_end;
      while (b_end < b.size() && digit(b[b_end])) ++b_end;
      const std::string_view a_number = a.substr(a_start, a_end - a_start);
      const std::string_view b_number = b.substr(b_start, b_end - b_start);
      if (a_number.size() != b_number.size()) return a_number.size() < b_number.size();
      if (a_number != b_number) return a_number < b_number;
      if (a_start - i != b_start - j) return a_start - i > b_start - j;
      i = a_end;
      j = b_end;
      continue;
    }
    if (a[i] != b[j]) return static_cast<unsigned char>(a[i]) < static_cast<unsigned char>(b[j]);
    ++i;
    ++j;
  }
  return a.size() - i < b.size() - j;
}

std::vector<size_t> HostsWorstFirst(const Analysis& analysis) {
  std::vector<size_t> order(analysis.hosts.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    const HostVerdict& a = analysis.hosts[x];
    const HostVerdict& b = analysis.hosts[y];
    if (a.straggler != b.straggler) return a.straggler;
    if (a.typical_lateness_ns != b.typical_lateness_ns) {
      return a.typical_lateness_ns > b.typical_lateness_ns;
    }
    if (a.late_steps != b.late_steps) return a.late_steps > b.late_steps;
    if (a.step_p50_ns != b.step_p50_ns) return a.step_p50_ns > b.step_p50_ns;
    return NaturalLess(a.host, b.host);
  });
  return order;
}

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
  std::sort(run.hosts.begin(), run.hosts.end(), NaturalLess);
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

RunReportBuilder::RunReportBuilder(std::string run_dir, DigestOptions options) {
  report_.run_dir = std::move(run_dir);
  report_.run = report_.run_dir.substr(report_.run_dir.find_last_of('/') + 1);
  report_.options = std::move(options);
}

void RunReportBuilder::Add(HostDigest digest, int64_t clock_offset_ns) {
  if (digest.steps.size() > static_cast<size_t>(kMaxDigestSteps)) {
    LeaveOut(StrCat(digest.host, ": ", digest.steps.size(), " steps, more than the ",
                    kMaxDigestSteps, " a host's digest may hold (capture a shorter window)"));
    return;
  }
  ReportHost host;
  host.host = std::move(digest.host);
  host.clock_offset_ns = clock_offset_ns;
  host.has_device = HasDevice(digest);
  host.step_source = std::move(digest.step_source);
  host.steps = PackedSteps(digest.steps);
  for (OpStat& op : digest.top_ops) {
    const auto [it, added] =
        op_index_.try_emplace(op.name, static_cast<uint32_t>(report_.op_names.size()));
    if (added) report_.op_names.push_back(std::move(op.name));
    host.top_ops.push_back({it->second, op.device, op.count, op.total_ns});
  }
  report_.runs.push_back(std::move(host));
}

void RunReportBuilder::LeaveOut(std::string why) { left_out_.push_back(std::move(why)); }

RunReport RunReportBuilder::Finish(bool offsets_known, int64_t verdict_from_ns) && {
  RunReport report = std::move(report_);
  report.manifest_found = offsets_known;
  // Natural order of names: the order every table by name shows.
  std::stable_sort(
      report.runs.begin(), report.runs.end(),
      [](const ReportHost& a, const ReportHost& b) { return NaturalLess(a.host, b.host); });
  std::stable_sort(left_out_.begin(), left_out_.end(), NaturalLess);
  if (verdict_from_ns > 0) {
    // The verdict over the capture window; the lookback's steps only for context.
    const ReportSource window(report.runs, verdict_from_ns);
    report.analysis = FindStragglers(window);
    size_t before = 0;
    std::vector<StepDigest> steps;
    std::vector<bool> in_window(report.runs.size());
    for (size_t i = 0; i < report.runs.size(); ++i) {
      window.Steps(i, &steps);
      before = std::max(before, report.runs[i].steps.size() - steps.size());
      in_window[i] = !steps.empty();
    }
    if (before > 0) {
      report.analysis.notes.push_back(
          StrCat("the verdict is over the steps from the capture's start on; the up to ", before,
                 " steps of the lookback before it are in the traces for context"));
    }
    // The report's pages go with the verdicts, one per host with steps in the window: a host
    // whose steps all came before the start (a workload that ended in the lookback) has none.
    size_t kept = 0;
    for (size_t i = 0; i < report.runs.size(); ++i) {
      if (!in_window[i]) continue;
      if (kept != i) report.runs[kept] = std::move(report.runs[i]);
      ++kept;
    }
    report.runs.resize(kept);
  } else {
    report.analysis = FindStragglers(ReportSource(report.runs, 0));
    // In the order of the verdicts: FindStragglers gives one to each host with steps, in order,
    // and leaves out the others.
    std::erase_if(report.runs, [](const ReportHost& host) { return host.steps.empty(); });
  }
  report.analysis.left_out.insert(report.analysis.left_out.begin(), left_out_.begin(),
                                  left_out_.end());
  if (!offsets_known && report.runs.size() + left_out_.size() > 1) {
    report.analysis.notes.push_back(
        StrCat("no clock offsets (", storage::kManifestName,
               " missing or without targets): the hosts' clocks are taken to agree"));
  }
  return report;
}

RunReport MakeRunReport(std::string run_dir, const DigestOptions& options,
                        std::vector<HostRun> runs, const std::vector<std::string>& left_out,
                        bool offsets_known, int64_t verdict_from_ns) {
  RunReportBuilder builder(std::move(run_dir), options);
  for (const std::string& why : left_out) builder.LeaveOut(why);
  for (HostRun& run : runs) {
    builder.Add(std::move(run.digest), run.clock_offset_ns);
    run.digest = {};  // packed: release the digest now, not when all are
  }
  return std::move(builder).Finish(offsets_known, verdict_from_ns);
}

absl::StatusOr<RunReport> AnalyzeRunDirectory(
    storage::Storage& storage, const std::string& run_dir, const DigestOptions& options,
    const std::function<void(const std::string& host, int index, int total)>& progress) {
  absl::StatusOr<RunHosts> run = ListRunHosts(storage, run_dir);
  if (!run.ok()) return run.status();
  const std::vector<std::string>& hosts = run->hosts;
  RunReportBuilder builder(run_dir, options);
  for (size_t i = 0; i < hosts.size(); ++i) {
    const std::string& host = hosts[i];
    if (progress) progress(host, static_cast<int>(i), static_cast<int>(hosts.size()));
    const std::string path = StrCat(run_dir, "/", host, storage::kXPlaneSuffix);
    // One host at a time: its trace is gone before the next is read, its digest once packed.
    absl::StatusOr<std::unique_ptr<storage::LocalCopy>> local =
        storage::LocalCopy::Fetch(storage, path);
    absl::StatusOr<std::unique_ptr<xspace::LoadedXSpace>> loaded =
        local.ok() ? xspace::ReadXSpaceFile((*local)->path())
                   : absl::StatusOr<std::unique_ptr<xspace::LoadedXSpace>>(local.status());
    if (!loaded.ok()) {
      builder.LeaveOut(StrCat(host, ": unreadable: ", loaded.status().message()));
      continue;
    }
    absl::StatusOr<HostDigest> digest = DigestXSpace((*loaded)->space(), host, options);
    if (!digest.ok()) return digest.status();  // a bad pattern: the same for every host
    loaded->reset();
    local->reset();
    builder.Add(*std::move(digest), run->OffsetOf(host));
  }
  return std::move(builder).Finish(run->manifest_found, run->lookback_start_ns);
}

std::string FormatVerdictText(const Analysis& a, size_t max_stragglers) {
  std::string out;
  const std::vector<const HostVerdict*> stragglers = a.stragglers();
  if (!stragglers.empty()) {
    for (size_t i = 0; i < stragglers.size() && i < max_stragglers; ++i) {
      const HostVerdict* host = stragglers[i];
      out += fmt::format("STRAGGLER {} ({}): {}\n", host->host, CauseName(host->cause),
                         host->evidence);
    }
    if (stragglers.size() > max_stragglers) {
      out += fmt::format("... and {} more stragglers (--all lists them; so does the JSON report)\n",
                         stragglers.size() - max_stragglers);
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

namespace {

std::string HostRow(const Analysis& a, const HostVerdict& host) {
  return fmt::format(
      "  {:<24} {:>6} {:>11} {:>11} {:>11} {:>8} {:>12} {:>12}  {}\n", host.host, host.steps,
      FormatDurationNs(host.step_p50_ns), FormatDurationNs(host.step_p90_ns),
      FormatDurationNs(host.step_max_ns),
      a.compared_steps > 0 ? fmt::format("{}/{}", host.late_steps, a.compared_steps)
                           : std::string("-"),
      host.late_steps > 0 ? FormatDurationNs(host.median_lateness_ns) : "-",
      host.late_steps > 0 ? FormatDurationNs(host.others_wait_ns) : "-",
      host.straggler ? fmt::format("straggler ({})", CauseName(host.cause)) : std::string("ok"));
}

// One line for the hosts not shown: how many, the range of their step times and steps late, and
// how many stragglers among them.
std::string SummaryRow(const Analysis& a, const std::vector<size_t>& rest) {
  int64_t p50_low = std::numeric_limits<int64_t>::max();
  int64_t p50_high = 0;
  int late_low = std::numeric_limits<int>::max();
  int late_high = 0;
  size_t stragglers = 0;
  for (size_t i : rest) {
    const HostVerdict& host = a.hosts[i];
    p50_low = std::min(p50_low, host.step_p50_ns);
    p50_high = std::max(p50_high, host.step_p50_ns);
    late_low = std::min(late_low, host.late_steps);
    late_high = std::max(late_high, host.late_steps);
    if (host.straggler) ++stragglers;
  }
  std::string line =
      fmt::format("  {:<24} step p50 {} to {}", fmt::format("... {} more hosts", rest.size()),
                  FormatDurationNs(p50_low), FormatDurationNs(p50_high));
  if (a.compared_steps > 0) {
    line += fmt::format(", late in {} to {} of {} steps", late_low, late_high, a.compared_steps);
  }
  line += stragglers == 0 ? std::string(", none a straggler")
                          : fmt::format(", {} stragglers", stragglers);
  line += " (--all lists every host)\n";
  return line;
}

}  // namespace

std::string FormatReportText(const RunReport& report, bool all) {
  const Analysis& a = report.analysis;
  std::string out = fmt::format("run {}: {} host{}", report.run_dir, a.hosts.size(),
                                a.hosts.size() == 1 ? "" : "s");
  if (a.steps > 0) {
    out += fmt::format(", steps {}-{} in common ({} compared)", a.first_step, a.last_step,
                       a.compared_steps);
  }
  if (!a.left_out.empty()) out += fmt::format(", {} left out", a.left_out.size());
  out += "\n\n";
  const bool every_host = all || a.hosts.size() <= kTextAllHostsUpTo;
  out += FormatVerdictText(a, every_host ? std::numeric_limits<size_t>::max() : kTextWorstHosts);
  out += fmt::format("\n  {:<24} {:>6} {:>11} {:>11} {:>11} {:>8} {:>12} {:>12}  {}\n", "host",
                     "steps", "step p50", "step p90", "step max", "late", "lateness", "others wait",
                     "verdict");
  if (every_host) {
    for (const HostVerdict& host : a.hosts) out += HostRow(a, host);
  } else {
    // The worst first: a 10,000-host table is read for its top, and the rest in one line.
    const std::vector<size_t> order = HostsWorstFirst(a);
    for (size_t i = 0; i < kTextWorstHosts; ++i) out += HostRow(a, a.hosts[order[i]]);
    out += SummaryRow(a, std::vector<size_t>(order.begin() + kTextWorstHosts, order.end()));
  }
  const size_t left_shown =
      all || a.left_out.size() <= kTextAllHostsUpTo ? a.left_out.size() : kTextWorstHosts;
  for (size_t i = 0; i < left_shown; ++i) out += fmt::format("  left out: {}\n", a.left_out[i]);
  if (left_shown < a.left_out.size()) {
    out += fmt::format("  left out: {} more (--all lists them; so does the JSON report)\n",
                       a.left_out.size() - left_shown);
  }
  return out;
}

void WriteReportJson(const RunReport& report, std::ostream& stream) {
  const Analysis& a = report.analysis;
  // Written a host at a time: the text held is one host's, whatever the number of hosts.
  std::string out;
  JsonWriter json(&out);
  auto flush = [&] {
    stream << out;
    out.clear();
  };
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
    flush();
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
  flush();
}

std::string ReportJson(const RunReport& report) {
  std::ostringstream out;
  WriteReportJson(report, out);
  return std::move(out).str();
}

}  // namespace clusterprof::analysis
