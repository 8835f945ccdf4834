#include "tests/chaos/ledger.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_join.h"
#include "common/base/json_writer.h"
#include "common/base/strings.h"

namespace clusterprof::chaos {

bool IsFinalPhase(std::string_view phase) {
  return phase == "Succeeded" || phase == "PartiallySucceeded" || phase == "Failed";
}

std::vector<std::string> CheckPhaseHistory(std::string_view job,
                                           const std::vector<std::string>& phases) {
  std::vector<std::string> problems;
  std::vector<std::string> finals;
  for (const std::string& phase : phases) {
    if (IsFinalPhase(phase)) finals.push_back(phase);
  }
  const std::string shown = absl::StrJoin(phases, " -> ");
  if (finals.empty()) {
    problems.push_back(StrCat("job ", job, " never reached a final phase (",
                              shown.empty() ? "no phase seen" : shown, ")"));
  } else if (finals.size() > 1) {
    problems.push_back(
        StrCat("job ", job, " reached a final phase ", finals.size(), " times (", shown, ")"));
  } else if (!IsFinalPhase(phases.back())) {
    problems.push_back(StrCat("job ", job, " left its final phase ", finals[0], " (", shown, ")"));
  }
  return problems;
}

namespace {

bool Lost(const FileEntry& file) {
  return file.target_phase == "Succeeded" && (!file.found || !file.intact);
}

}  // namespace

std::vector<std::string> Ledger::Add(TrialRecord record) {
  for (const JobEntry& job : record.jobs) {
    for (std::string& problem : CheckPhaseHistory(job.name, job.phases)) {
      record.violations.push_back(std::move(problem));
    }
    for (const FileEntry& file : job.files) {
      if (Lost(file)) {
        record.violations.push_back(StrCat(
            "job ", job.name, ": ", file.uri, " is Succeeded in the status but ",
            file.found
                ? "its content does not match the CRC32C the sidecar reported"
                : StrCat("is not in the logdir", file.pending ? " after the retry window" : "")));
      }
      if (file.contents > 1) {
        record.violations.push_back(StrCat("job ", job.name, ": ", file.uri, " was written ",
                                           file.contents,
                                           " times with different contents: a run captured twice"));
      }
    }
  }
  if (record.extra_captures > 0) {
    record.violations.push_back(StrCat("the sidecars finished ", record.extra_captures,
                                       " capture(s) more than one per job and target"));
  }
  std::vector<std::string> found = record.violations;
  trials_.push_back(std::move(record));
  return found;
}

void Ledger::SetRss(const std::string& scenario, int64_t before_kib, int64_t after_kib) {
  rss_[scenario] = {before_kib, after_kib};
}

std::vector<ScenarioFigures> Ledger::Figures() const {
  std::vector<ScenarioFigures> figures;
  ScenarioFigures all;
  all.scenario = "all";
  auto add = [](ScenarioFigures& f, const TrialRecord& trial) {
    ++f.trials;
    f.faults += static_cast<int64_t>(trial.faults.size()) + trial.bulk_faults;
    f.duplicates += trial.extra_captures;
    f.max_recovery_s = std::max(f.max_recovery_s, trial.recovery_s);
    f.violations += static_cast<int>(trial.violations.size());
    for (const JobEntry& job : trial.jobs) {
      ++f.jobs;
      if (CheckPhaseHistory(job.name, job.phases).empty()) ++f.jobs_ended_once;
      for (const FileEntry& file : job.files) {
        ++f.files;
        if (Lost(file)) ++f.files_lost;
        if (file.pending) ++f.files_pending;
        if (file.contents > 1) f.duplicates += file.contents - 1;
        if (file.writes > file.contents) f.rewrites += file.writes - file.contents;
      }
    }
  };
  for (const TrialRecord& trial : trials_) {
    auto it = std::find_if(figures.begin(), figures.end(),
                           [&](const ScenarioFigures& f) { return f.scenario == trial.scenario; });
    if (it == figures.end()) {
      figures.push_back(ScenarioFigures{});
      it = figures.end() - 1;
      it->scenario = trial.scenario;
    }
    add(*it, trial);
    add(all, trial);
  }
  for (ScenarioFigures& f : figures) {
    if (auto rss = rss_.find(f.scenario); rss != rss_.end()) {
      f.rss_before_kib = rss->second.first;
      f.rss_after_kib = rss->second.second;
    }
  }
  if (!figures.empty()) figures.push_back(all);
  return figures;
}

std::string Ledger::Table() const {
  std::string out =
      "| scenario | trials | faults | jobs ended exactly once | duplicate captures | files "
      "(pending at the end) | files lost | same bytes uploaded again | longest recovery | "
      "operator RSS before → after |\n"
      "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n";
  for (const ScenarioFigures& f : Figures()) {
    char recovery[32];
    std::snprintf(recovery, sizeof(recovery), "%.1f s", f.max_recovery_s);
    const std::string rss = f.rss_before_kib > 0 ? StrCat(f.rss_before_kib / 1024, " → ",
                                                          f.rss_after_kib / 1024, " MiB")
                                                 : std::string(f.scenario == "all" ? "" : "n/a");
    StrAppend(&out, "| ", f.scenario, " | ", f.trials, " | ", f.faults, " | ", f.jobs_ended_once,
              " of ", f.jobs, " | ", f.duplicates, " | ", f.files, " (", f.files_pending, ") | ",
              f.files_lost, " | ", f.rewrites, " | ", recovery, " | ", rss, " |\n");
  }
  return out;
}

int Ledger::violations() const {
  int count = 0;
  for (const TrialRecord& trial : trials_) count += static_cast<int>(trial.violations.size());
  return count;
}

std::string Ledger::JsonLines() const {
  std::string out;
  for (const TrialRecord& trial : trials_) {
    JsonWriter json(&out);
    json.Open('{');
    json.Field("scenario", trial.scenario);
    json.Field("trial", static_cast<int64_t>(trial.trial));
    json.Field("seed", trial.seed);
    json.Key("faults");
    json.Open('[');
    for (const std::string& fault : trial.faults) json.String(fault);
    json.Close(']');
    json.Field("bulk_faults", trial.bulk_faults);
    json.Field("recovery_ms", static_cast<int64_t>(trial.recovery_s * 1000));
    json.Key("jobs");
    json.Open('[');
    for (const JobEntry& job : trial.jobs) {
      json.Open('{');
      json.Field("name", job.name);
      json.Field("run", job.run);
      json.Key("phases");
      json.Open('[');
      for (const std::string& phase : job.phases) json.String(phase);
      json.Close(']');
      json.Key("files");
      json.Open('[');
      for (const FileEntry& file : job.files) {
        json.Open('{');
        json.Field("uri", file.uri);
        json.Field("target_phase", file.target_phase);
        json.Field("pending", file.pending);
        json.Field("found", file.found);
        json.Field("bytes", file.bytes);
        json.Field("intact", file.intact);
        json.Field("writes", file.writes);
        json.Field("contents", file.contents);
        json.Close('}');
      }
      json.Close(']');
      json.Close('}');
    }
    json.Close(']');
    json.Key("violations");
    json.Open('[');
    for (const std::string& violation : trial.violations) json.String(violation);
    json.Close(']');
    json.Close('}');
    out.push_back('\n');
  }
  return out;
}

}  // namespace clusterprof::chaos
