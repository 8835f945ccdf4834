#include "analysis/stragglers.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>

#include "common/base/saturating.h"
#include "common/base/strings.h"
#include "common/xspace/summary.h"

namespace clusterprof::analysis {
namespace {

// The median of `values` (the lower middle for an even count); 0 for none.
int64_t Median(std::vector<int64_t> values) {
  if (values.empty()) return 0;
  const size_t middle = (values.size() - 1) / 2;
  std::nth_element(values.begin(), values.begin() + middle, values.end());
  return values[middle];
}

int64_t Percentile(std::vector<int64_t> values, double fraction) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t index =
      static_cast<size_t>(std::ceil(fraction * static_cast<double>(values.size())) - 1);
  return values[std::min(index, values.size() - 1)];
}

using xspace::FormatDurationNs;

// What the late host did before entering the collective, beyond the others' median, summed
// over its late steps.
struct Excess {
  int64_t compute_ns = 0;
  int64_t input_ns = 0;
  int64_t lateness_ns = 0;
};

struct HostTally {
  int late = 0;
  std::vector<int64_t> lateness;
  int64_t others_wait_ns = 0;
  Excess excess;
};

// Where no host entered a collective (the entry matrix's empty cell).
constexpr int64_t kNoEntry = std::numeric_limits<int64_t>::min();

// A host late in a compared step, and what it and the median of the others spent on compute
// and input in that step (whole-step sums: the time before the collective can't be told from
// the digest, and after the collective every host does the same).
struct LateStep {
  size_t host = 0;    // index among the usable hosts
  size_t column = 0;  // index among the compared steps
  int64_t lateness_ns = 0;
  int64_t others_wait_ns = 0;
  int64_t device_ns = 0, device_others_ns = 0;
  int64_t host_busy_ns = 0, host_busy_others_ns = 0;
  int64_t input_ns = 0, input_others_ns = 0;
};

// The median of a column without one of its values, for every value at once: with the column
// sorted as a[0..n-1] and k = (n - 2) / 2 (the lower middle of n - 1 values), leaving out a value
// v above a[k] leaves a[k] there, and leaving out one at or below it moves a[k + 1] down to it.
struct MedianWithoutOne {
  int64_t lower = 0;  // a[k]
  int64_t upper = 0;  // a[k + 1]
  int64_t Without(int64_t value) const { return value > lower ? lower : upper; }
};
MedianWithoutOne MedianWithoutOneOf(std::vector<int64_t>& column) {
  if (column.size() < 2) return {};
  const size_t k = (column.size() - 2) / 2;
  std::nth_element(column.begin(), column.begin() + static_cast<ptrdiff_t>(k), column.end());
  const int64_t lower = column[k];
  const int64_t upper =
      *std::min_element(column.begin() + static_cast<ptrdiff_t>(k) + 1, column.end());
  return {lower, upper};
}

// The verdict over plain digests (tests, the live trigger rules).
class DigestSource : public StepSource {
 public:
  explicit DigestSource(const std::vector<HostRun>& hosts) : hosts_(hosts) {}
  size_t size() const override { return hosts_.size(); }
  const std::string& host(size_t i) const override { return hosts_[i].digest.host; }
  const std::string& step_source(size_t i) const override { return hosts_[i].digest.step_source; }
  int64_t clock_offset_ns(size_t i) const override { return hosts_[i].clock_offset_ns; }
  void Steps(size_t i, std::vector<StepDigest>* steps) const override {
    *steps = hosts_[i].digest.steps;
  }

 private:
  const std::vector<HostRun>& hosts_;
};

Cause CauseOf(const Excess& excess) {
  if (excess.lateness_ns <= 0) return Cause::kNone;
  // The larger of the two explanations, when it explains at least a third of the lateness.
  const int64_t explained = std::max(excess.compute_ns, excess.input_ns);
  if (explained < excess.lateness_ns / 3) return Cause::kOverhead;
  return excess.input_ns > excess.compute_ns ? Cause::kInput : Cause::kCompute;
}

std::string Evidence(const HostVerdict& verdict, int compared, size_t hosts, const Excess& excess) {
  std::string text = StrCat("enters the collectives ", FormatDurationNs(verdict.median_lateness_ns),
                            " late (median) in ", verdict.late_steps, " of ", compared,
                            " steps; the other ", hosts - 1, " host", hosts == 2 ? "" : "s",
                            " wait ", FormatDurationNs(verdict.others_wait_ns), " for it in all");
  const int late = std::max(verdict.late_steps, 1);
  switch (verdict.cause) {
    case Cause::kCompute:
      StrAppend(&text, "; per late step it computes ", FormatDurationNs(excess.compute_ns / late),
                " longer than the others (device kernels and host work)");
      break;
    case Cause::kInput:
      StrAppend(&text, "; per late step it waits ", FormatDurationNs(excess.input_ns / late),
                " longer than the others on its input pipeline");
      break;
    case Cause::kOverhead:
      StrAppend(&text,
                "; neither its compute nor its input explains it: launch or host overhead, or "
                "idle time before the collective");
      break;
    case Cause::kNone:
      break;
  }
  return text;
}

// The verdict's steps, in order, over one source. Memory: the steps of one host at a time, and
// a few matrices of one number per host and step in common (entries, then one kind of time at a
// time), so that 10,000 hosts of 1,000 steps take some 160 MB at the peak and never their
// digests together.
class StragglerFinder {
 public:
  StragglerFinder(const StepSource& source, const StragglerRule& rule)
      : source_(source), rule_(rule) {}

  Analysis Run() && {
    if (!SummarizeHosts()) return std::move(out_);
    ReadEntries();
    if (!CompareSteps()) return std::move(out_);
    std::vector<LateStep> late = FindLateSteps(Noise());
    if (!late.empty()) AddWhatTheyDid(late);
    Judge(late);
    return std::move(out_);
  }

 private:
  // Every host's step-time figures, and the step numbers all hosts with steps have. False when
  // there is nothing to compare (said in the notes).
  bool SummarizeHosts() {
    std::vector<int64_t> numbers;
    std::vector<int64_t> durations;
    for (size_t index = 0; index < source_.size(); ++index) {
      source_.Steps(index, &steps_);
      if (steps_.empty()) {
        out_.left_out.push_back(StrCat(source_.host(index), ": no steps found (looked for ",
                                       source_.step_source(index), ")"));
        continue;
      }
      HostVerdict verdict;
      verdict.host = source_.host(index);
      durations.clear();
      numbers.clear();
      for (const StepDigest& step : steps_) {
        durations.push_back(step.duration_ns());
        numbers.push_back(step.step);
      }
      verdict.steps = static_cast<int>(durations.size());
      verdict.step_max_ns = *std::max_element(durations.begin(), durations.end());
      verdict.step_p50_ns = Percentile(durations, 0.5);
      verdict.step_p90_ns = Percentile(std::move(durations), 0.9);
      durations = {};
      out_.hosts.push_back(std::move(verdict));
      std::sort(numbers.begin(), numbers.end());
      numbers.erase(std::unique(numbers.begin(), numbers.end()), numbers.end());
      if (usable_.empty()) {
        common_ = numbers;
      } else {
        std::vector<int64_t> both;
        std::set_intersection(common_.begin(), common_.end(), numbers.begin(), numbers.end(),
                              std::back_inserter(both));
        common_ = std::move(both);
      }
      usable_.push_back(index);
    }
    if (usable_.size() < 2) {
      out_.notes.push_back(StrCat("only ", usable_.size(), " host", usable_.size() == 1 ? "" : "s",
                                  " with steps: nothing to compare"));
      return false;
    }
    if (common_.empty()) {
      out_.notes.push_back("the hosts have no step number in common: nothing to compare");
      return false;
    }
    out_.steps = static_cast<int>(common_.size());
    out_.first_step = common_.front();
    out_.last_step = common_.back();
    n_ = usable_.size();
    return true;
  }

  // Calls visit(row, step) for each of usable host u's steps in common (a host's first step of
  // a number counts, as the digest has each once).
  template <typename Visit>
  void ForEachCommonStep(size_t u, const Visit& visit) {
    source_.Steps(usable_[u], &steps_);
    seen_.assign(common_.size(), false);
    for (const StepDigest& step : steps_) {
      const auto it = std::lower_bound(common_.begin(), common_.end(), step.step);
      if (it == common_.end() || *it != step.step) continue;
      const size_t row = static_cast<size_t>(it - common_.begin());
      if (seen_[row]) continue;
      seen_[row] = true;
      visit(row, step);
    }
  }

  // Per step in common (rows) and host (columns): its collective entry on the reference clock,
  // and its step time.
  void ReadEntries() {
    entry_.assign(common_.size() * n_, kNoEntry);
    step_ns_.assign(common_.size() * n_, 0);
    for (size_t u = 0; u < n_; ++u) {
      const int64_t offset = source_.clock_offset_ns(usable_[u]);
      ForEachCommonStep(u, [&](size_t row, const StepDigest& step) {
        if (step.collective_entry_ns != 0) {
          entry_[row * n_ + u] = SaturatingSub(step.collective_entry_ns, offset);
        }
        step_ns_[row * n_ + u] = step.duration_ns();
      });
    }
  }

  // Per step with a collective on every host: lateness from the median host's entry, written
  // over the entries (the rows of the steps not compared are dropped). False when no step is
  // compared (said in the notes).
  bool CompareSteps() {
    int out_of_lockstep = 0;
    size_t compared = 0;  // rows kept, moved to the front of `entry_`
    for (size_t row = 0; row < common_.size(); ++row) {
      const int64_t* entries = &entry_[row * n_];
      if (std::find(entries, entries + n_, kNoEntry) != entries + n_) continue;
      const auto [earliest, latest] = std::minmax_element(entries, entries + n_);
      // Lateness from the median host (with two hosts, the earlier one): the earliest of many
      // hosts is an outlier of the noise, and measured from it most healthy hosts look late.
      column_.assign(entries, entries + n_);
      const int64_t median_entry = Median(column_);
      column_.assign(&step_ns_[row * n_], &step_ns_[row * n_] + n_);
      const int64_t median_step = Median(column_);
      // Hosts that meet in a collective cannot be a whole step apart in it: the others wait
      // within the step. Further apart, the steps of one number did not run together.
      if (SaturatingSub(*latest, *earliest) > median_step) {
        ++out_of_lockstep;
        continue;
      }
      for (size_t u = 0; u < n_; ++u) {
        entry_[compared * n_ + u] = SaturatingSub(entry_[row * n_ + u], median_entry);
      }
      median_step_ns_.push_back(median_step);
      out_.compared_step_numbers.push_back(common_[row]);
      ++compared;
    }
    step_ns_ = {};
    entry_.resize(compared * n_);
    entry_.shrink_to_fit();
    compared_ = compared;
    out_.compared_steps = static_cast<int>(compared);
    if (out_of_lockstep > 0) {
      out_.notes.push_back(StrCat(
          out_of_lockstep, " of the ", out_.steps,
          " steps in common were not compared: the hosts entered their collectives more than a "
          "step apart, so they did not run those steps together (hosts that do not meet in "
          "collectives, or clocks that disagree)"));
    }
    if (compared == 0 && out_of_lockstep == 0) {
      out_.notes.push_back(StrCat("no step of the ", out_.steps,
                                  " in common has a collective on every host: nothing to "
                                  "compare (collectives are found by name; see "
                                  "--collective-pattern)"));
    }
    return compared > 0;
  }

  // The lateness of host u in compared step c.
  int64_t Lateness(size_t c, size_t u) const { return entry_[c * n_ + u]; }

  // The noise: the median absolute deviation of all hosts' lateness over all compared steps (a
  // straggler is a minority of the samples, so it barely moves it). With two hosts every other
  // sample is the gap itself, so only the step-time share applies.
  double Noise() const {
    if (n_ < 3) return 0;
    std::vector<int64_t> pooled = entry_;
    const int64_t center = Median(pooled);
    for (int64_t& l : pooled) l = std::max(SaturatingSub(l, center), SaturatingSub(center, l));
    return rule_.mad_factor * static_cast<double>(Median(std::move(pooled)));
  }

  // The late hosts of each compared step, and how long the others waited for each: the sum of
  // its lateness minus theirs over the hosts that entered before it, from the sorted lateness
  // and its prefix sums (not host by host: thousands of hosts each late in a few steps would
  // make that quadratic).
  std::vector<LateStep> FindLateSteps(double noise) {
    std::vector<LateStep> late;
    std::vector<__int128> prefix;
    for (size_t c = 0; c < compared_; ++c) {
      const int64_t* row = &entry_[c * n_];
      const double threshold =
          std::max(rule_.step_fraction * static_cast<double>(median_step_ns_[c]), noise);
      bool sorted = false;
      for (size_t u = 0; u < n_; ++u) {
        if (static_cast<double>(row[u]) <= threshold) continue;
        if (!sorted) {
          column_.assign(row, row + n_);
          std::sort(column_.begin(), column_.end());
          prefix.assign(n_ + 1, 0);
          for (size_t i = 0; i < n_; ++i) prefix[i + 1] = prefix[i] + column_[i];
          sorted = true;
        }
        const size_t before = static_cast<size_t>(
            std::lower_bound(column_.begin(), column_.end(), row[u]) - column_.begin());
        const __int128 wait = static_cast<__int128>(before) * row[u] - prefix[before];
        LateStep step;
        step.host = u;
        step.column = c;
        step.lateness_ns = row[u];
        step.others_wait_ns =
            static_cast<int64_t>(std::min<__int128>(wait, std::numeric_limits<int64_t>::max()));
        late.push_back(step);
      }
    }
    return late;
  }

  // What each late host spent on compute and input, against the median of the others: one kind
  // of time at a time, over the steps in which a host was late.
  void AddWhatTheyDid(std::vector<LateStep>& late) {
    std::vector<int64_t> late_row(common_.size(), -1);  // compared-step index of a row
    for (size_t row = 0, c = 0; row < common_.size() && c < compared_; ++row) {
      if (common_[row] == out_.compared_step_numbers[c]) late_row[row] = static_cast<int64_t>(c++);
    }
    std::vector<bool> has_late(compared_, false);
    for (const LateStep& step : late) has_late[step.column] = true;
    struct Kind {
      int64_t StepDigest::*field;
      int64_t LateStep::*own;
      int64_t LateStep::*others;
    };
    const Kind kinds[] = {
        {&StepDigest::device_busy_ns, &LateStep::device_ns, &LateStep::device_others_ns},
        {&StepDigest::host_busy_ns, &LateStep::host_busy_ns, &LateStep::host_busy_others_ns},
        {&StepDigest::input_ns, &LateStep::input_ns, &LateStep::input_others_ns}};
    std::vector<int64_t> values;
    for (const Kind& kind : kinds) {
      values.assign(compared_ * n_, 0);
      for (size_t u = 0; u < n_; ++u) {
        ForEachCommonStep(u, [&](size_t row, const StepDigest& step) {
          const int64_t c = late_row[row];
          if (c >= 0 && has_late[static_cast<size_t>(c)]) {
            values[static_cast<size_t>(c) * n_ + u] = step.*kind.field;
          }
        });
      }
      std::vector<MedianWithoutOne> medians(compared_);
      for (size_t c = 0; c < compared_; ++c) {
        if (!has_late[c]) continue;
        column_.assign(&values[c * n_], &values[c * n_] + n_);
        medians[c] = MedianWithoutOneOf(column_);
      }
      for (LateStep& step : late) {
        const int64_t own = values[step.column * n_ + step.host];
        step.*kind.own = own;
        step.*kind.others = medians[step.column].Without(own);
      }
    }
  }

  // Each host's tally of its late steps, and the verdict: a straggler when late in at least
  // rule.min_late_fraction of the compared steps, with its cause and evidence.
  void Judge(const std::vector<LateStep>& late) {
    std::vector<HostTally> tally(n_);
    for (const LateStep& step : late) {
      HostTally& t = tally[step.host];
      ++t.late;
      t.lateness.push_back(step.lateness_ns);
      t.others_wait_ns = SaturatingAdd(t.others_wait_ns, step.others_wait_ns);
      const int64_t compute =
          SaturatingSub(SaturatingAdd(step.device_ns, step.host_busy_ns),
                        SaturatingAdd(step.device_others_ns, step.host_busy_others_ns));
      t.excess.compute_ns = SaturatingAdd(t.excess.compute_ns, std::max<int64_t>(0, compute));
      t.excess.input_ns =
          SaturatingAdd(t.excess.input_ns,
                        std::max<int64_t>(0, SaturatingSub(step.input_ns, step.input_others_ns)));
      t.excess.lateness_ns = SaturatingAdd(t.excess.lateness_ns, step.lateness_ns);
    }
    const int needed =
        std::max(1, static_cast<int>(std::ceil(rule_.min_late_fraction * out_.compared_steps)));
    for (size_t u = 0; u < n_; ++u) {
      HostVerdict& verdict = out_.hosts[u];
      const HostTally& t = tally[u];
      column_.clear();
      for (size_t c = 0; c < compared_; ++c) column_.push_back(Lateness(c, u));
      verdict.typical_lateness_ns = Median(column_);
      verdict.late_steps = t.late;
      verdict.median_lateness_ns = Median(t.lateness);
      verdict.others_wait_ns = t.others_wait_ns;
      verdict.straggler = t.late >= needed;
      if (!verdict.straggler) continue;
      verdict.cause = CauseOf(t.excess);
      verdict.evidence = Evidence(verdict, out_.compared_steps, n_, t.excess);
    }
  }

  const StepSource& source_;
  const StragglerRule& rule_;
  Analysis out_;
  std::vector<size_t> usable_;     // the source's hosts with steps
  size_t n_ = 0;                   // usable_.size()
  std::vector<int64_t> common_;    // the step numbers every usable host has, ascending
  std::vector<StepDigest> steps_;  // one host's, read again for each pass
  std::vector<bool> seen_;
  // [row * n_ + host] collective entries; after CompareSteps, [compared step * n_ + host]
  // lateness.
  std::vector<int64_t> entry_;
  std::vector<int64_t> step_ns_;         // [row * n_ + host], until CompareSteps
  std::vector<int64_t> median_step_ns_;  // per compared step
  size_t compared_ = 0;
  std::vector<int64_t> column_;  // scratch
};

}  // namespace

std::string_view CauseName(Cause cause) {
  switch (cause) {
    case Cause::kNone:
      return "none";
    case Cause::kCompute:
      return "compute";
    case Cause::kInput:
      return "input";
    case Cause::kOverhead:
      return "launch/host overhead";
  }
  return "?";
}

std::vector<const HostVerdict*> Analysis::stragglers() const {
  std::vector<const HostVerdict*> out;
  for (const HostVerdict& host : hosts) {
    if (host.straggler) out.push_back(&host);
  }
  return out;
}

Analysis FindStragglers(const std::vector<HostRun>& hosts, const StragglerRule& rule) {
  return FindStragglers(DigestSource(hosts), rule);
}

Analysis FindStragglers(const StepSource& source, const StragglerRule& rule) {
  return StragglerFinder(source, rule).Run();
}

}  // namespace clusterprof::analysis
