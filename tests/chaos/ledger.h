// The chaos suite's ledger (docs/reliability.md, "The chaos suite"): every job and every file a
// trial made, the invariants checked against them, and the figures per scenario that go into
// bench/RESULTS.md. Pure bookkeeping, no processes: tests/chaos/ledger_test.cc covers it.
#ifndef CLUSTERPROF_TESTS_CHAOS_LEDGER_H_
#define CLUSTERPROF_TESTS_CHAOS_LEDGER_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace clusterprof::chaos {

// Succeeded, PartiallySucceeded and Failed.
bool IsFinalPhase(std::string_view phase);

// The phases a job showed, in order, each change once ("" never appears). A job ends exactly once
// when exactly one final phase appears and it is the last. Returns what is wrong, one line each
// (empty: nothing).
std::vector<std::string> CheckPhaseHistory(std::string_view job,
                                           const std::vector<std::string>& phases);

// One trace file of a target, as the logdir holds it.
struct FileEntry {
  std::string uri;
  // The target's phase in the job's status, and whether the status said the upload was pending.
  std::string target_phase;
  bool pending = false;
  // What the logdir holds: found (after the retry window for a pending one), its size, whether
  // its CRC32C matched the one the sidecar reported and its content parsed, how many times the
  // object was written, and how many different contents those writes had. More than one content
  // is a run captured twice; the same bytes written again (an upload that a killed sidecar had
  // already sent, finished again by its successor) is a rewrite, harmless, and counted apart.
  bool found = false;
  uint64_t bytes = 0;
  bool intact = false;
  int64_t writes = 0;
  int64_t contents = 0;
};

struct JobEntry {
  std::string name;
  std::string run;
  std::vector<std::string> phases;
  std::string final_phase;
  std::vector<FileEntry> files;
};

// One trial: the faults it injected and what the invariants found.
struct TrialRecord {
  std::string scenario;
  int trial = 0;
  uint64_t seed = 0;
  // One line per fault injected ("operator killed 1.42 s after the job's creation").
  std::vector<std::string> faults;
  // Faults counted in bulk (requests a server failed on purpose, watches dropped).
  int64_t bulk_faults = 0;
  std::vector<JobEntry> jobs;
  // From the end of the last fault to the last job's final phase and its files landing.
  double recovery_s = 0;
  // Completed captures the sidecars counted beyond one per job and target.
  int64_t extra_captures = 0;
  std::vector<std::string> violations;
};

// A scenario's figures over its trials.
struct ScenarioFigures {
  std::string scenario;
  int trials = 0;
  int64_t faults = 0;
  int jobs = 0;
  int jobs_ended_once = 0;
  int64_t duplicates = 0;
  int64_t rewrites = 0;
  int files = 0;
  int files_lost = 0;
  int files_pending = 0;
  double max_recovery_s = 0;
  int64_t rss_before_kib = 0;
  int64_t rss_after_kib = 0;
  int violations = 0;
};

class Ledger {
 public:
  // Derives what the invariants say about the trial's jobs and files (phase histories, files
  // lost, duplicate writes) and adds those violations to the record's own, then keeps it.
  // Returns the violations found for this trial.
  std::vector<std::string> Add(TrialRecord record);
  void SetRss(const std::string& scenario, int64_t before_kib, int64_t after_kib);

  // Per scenario in the order scenarios first appeared, and the total ("all").
  std::vector<ScenarioFigures> Figures() const;
  // The figures as a Markdown table.
  std::string Table() const;
  int violations() const;
  const std::vector<TrialRecord>& trials() const { return trials_; }
  // One JSON object per trial, per line: every job, its phases and its files.
  std::string JsonLines() const;

 private:
  std::vector<TrialRecord> trials_;
  std::map<std::string, std::pair<int64_t, int64_t>> rss_;
};

}  // namespace clusterprof::chaos

#endif  // CLUSTERPROF_TESTS_CHAOS_LEDGER_H_
