// Which host holds a synchronized job back (docs/analysis.md). In a job whose hosts meet in
// collectives every step, the step time is the same everywhere: the slow host shows instead in
// when it enters the collectives, late, while the others wait for it. Per step shared by every
// host, entries are put on one clock (the offsets measured at capture time); a host's lateness is
// its entry minus the median host's (with two hosts, the earlier one's: the gap). A host is a
// straggler when its lateness exceeds
// max(5% of the step time, 3 x the median absolute deviation of all hosts' lateness over all
// steps) in at least half of the steps. The cause compares what it did before entering with what
// the others did.
#ifndef CLUSTERPROF_ANALYSIS_STRAGGLERS_H_
#define CLUSTERPROF_ANALYSIS_STRAGGLERS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "analysis/digest.h"

namespace clusterprof::analysis {

struct HostRun {
  HostDigest digest;
  // The host's clock minus the reference clock (the coordinator's), as measured at capture time.
  int64_t clock_offset_ns = 0;
};

enum class Cause {
  kNone,
  kCompute,   // device kernels or host work before the collective took longer
  kInput,     // waiting on the input pipeline
  kOverhead,  // neither: launch or host overhead, idle time before the collective
};
std::string_view CauseName(Cause cause);

struct StragglerRule {
  double step_fraction = 0.05;
  double mad_factor = 3.0;
  // Of the steps compared.
  double min_late_fraction = 0.5;
};

struct HostVerdict {
  std::string host;
  int steps = 0;
  int64_t step_p50_ns = 0;
  int64_t step_p90_ns = 0;
  int64_t step_max_ns = 0;
  bool straggler = false;
  // Steps in which it entered the collectives late, and its median lateness in those.
  int late_steps = 0;
  int64_t median_lateness_ns = 0;
  // What the other hosts spent waiting for it in its late steps, all together.
  int64_t others_wait_ns = 0;
  Cause cause = Cause::kNone;
  // In words: "enters the collectives 12.3 ms late (median) in 45 of 50 steps; the other 63
  // hosts wait 41.2 s for it in all; before entering it spends 11.9 ms more on device work".
  std::string evidence;
  // Its median lateness over every compared step, late or not (negative: it usually enters
  // before the median host). What the report orders hosts by, worst first.
  int64_t typical_lateness_ns = 0;
};

struct Analysis {
  // Steps every analyzed host has, and how many of them had a collective on every host.
  int64_t first_step = 0;
  int64_t last_step = 0;
  int steps = 0;
  int compared_steps = 0;
  // The numbers of the compared steps, ascending.
  std::vector<int64_t> compared_step_numbers;
  std::vector<HostVerdict> hosts;  // in the order given
  // Hosts that could not be analyzed, each with why ("host-3: no steps (looked for ...)").
  std::vector<std::string> left_out;
  // What limits the result ("only one host: nothing to compare").
  std::vector<std::string> notes;

  std::vector<const HostVerdict*> stragglers() const;
};

// The hosts' steps as the verdict reads them: one host at a time, so that a caller holding
// thousands of hosts can keep their steps packed (RunReport) and unpack one host at a time. The
// verdict itself holds a few numbers per host and compared step (about 20 bytes), never two
// hosts' digests.
class StepSource {
 public:
  virtual ~StepSource() = default;
  virtual size_t size() const = 0;
  virtual const std::string& host(size_t index) const = 0;
  // What marked the steps ("step_num stat" or the pattern), for a host without steps.
  virtual const std::string& step_source(size_t index) const = 0;
  virtual int64_t clock_offset_ns(size_t index) const = 0;
  // Replaces `*steps` with the host's steps, by step number.
  virtual void Steps(size_t index, std::vector<StepDigest>* steps) const = 0;
};

Analysis FindStragglers(const StepSource& hosts, const StragglerRule& rule = {});
Analysis FindStragglers(const std::vector<HostRun>& hosts, const StragglerRule& rule = {});

}  // namespace clusterprof::analysis

#endif  // CLUSTERPROF_ANALYSIS_STRAGGLERS_H_
