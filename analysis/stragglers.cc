#include "analysis/stragglers.h"

#include <algorithm>
#include <cmath>
#include <map>

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

// The time the host spent on `kind` before entering step `s`'s collective can't be told from
// the digest (it holds whole-step sums); whole-step sums compare well because after the
// collective every host does the same.
int64_t MedianOthers(const std::vector<const StepDigest*>& steps, size_t self,
                     int64_t StepDigest::*field) {
  std::vector<int64_t> values;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (i != self) values.push_back(steps[i]->*field);
  }
  return Median(std::move(values));
}

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
  Analysis out;
  std::vector<const HostRun*> usable;
  for (const HostRun& host : hosts) {
    if (host.digest.steps.empty()) {
      out.left_out.push_back(
          StrCat(host.digest.host, ": no steps found (looked for ", host.digest.step_source, ")"));
      continue;
    }
    usable.push_back(&host);
    HostVerdict verdict;
    verdict.host = host.digest.host;
    std::vector<int64_t> durations;
    for (const StepDigest& step : host.digest.steps) durations.push_back(step.duration_ns());
    verdict.steps = static_cast<int>(durations.size());
    verdict.step_p50_ns = Percentile(durations, 0.5);
    verdict.step_p90_ns = Percentile(durations, 0.9);
    verdict.step_max_ns = *std::max_element(durations.begin(), durations.end());
    out.hosts.push_back(std::move(verdict));
  }
  if (usable.size() < 2) {
    out.notes.push_back(StrCat("only ", usable.size(), " host", usable.size() == 1 ? "" : "s",
                               " with steps: nothing to compare"));
    return out;
  }

  // The steps every host has, compared only there.
  std::map<int64_t, std::vector<const StepDigest*>> common;
  for (size_t h = 0; h < usable.size(); ++h) {
    for (const StepDigest& step : usable[h]->digest.steps) {
      std::vector<const StepDigest*>& row = common[step.step];
      if (row.size() == h) row.push_back(&step);
    }
  }
  std::erase_if(common, [&](const auto& entry) { return entry.second.size() != usable.size(); });
  if (common.empty()) {
    out.notes.push_back("the hosts have no step number in common: nothing to compare");
    return out;
  }
  out.steps = static_cast<int>(common.size());
  out.first_step = common.begin()->first;
  out.last_step = common.rbegin()->first;

  // Per step with a collective on every host: entries on the reference clock, lateness.
  struct Compared {
    const std::vector<const StepDigest*>* steps;
    std::vector<int64_t> entries;
    std::vector<int64_t> lateness;
    int64_t median_step_ns = 0;
  };
  std::vector<Compared> compared;
  std::vector<int64_t> pooled;  // every host's lateness in every compared step
  int out_of_lockstep = 0;
  for (const auto& [number, steps] : common) {
    Compared c{&steps, {}, {}, 0};
    for (size_t h = 0; h < steps.size(); ++h) {
      if (steps[h]->collective_entry_ns == 0) break;
      c.entries.push_back(SaturatingSub(steps[h]->collective_entry_ns, usable[h]->clock_offset_ns));
    }
    if (c.entries.size() != steps.size()) continue;  // a host without a collective in this step
    const auto [earliest, latest] = std::minmax_element(c.entries.begin(), c.entries.end());
    // Lateness from the median host (with two hosts, the earlier one): the earliest of many
    // hosts is an outlier of the noise, and measured from it most healthy hosts look late.
    const int64_t median_entry = Median(c.entries);
    std::vector<int64_t> durations;
    for (size_t h = 0; h < steps.size(); ++h) {
      c.lateness.push_back(SaturatingSub(c.entries[h], median_entry));
      durations.push_back(steps[h]->duration_ns());
    }
    c.median_step_ns = Median(std::move(durations));
    // Hosts that meet in a collective cannot be a whole step apart in it: the others wait within
    // the step. Further apart, the steps of one number did not run together.
    if (SaturatingSub(*latest, *earliest) > c.median_step_ns) {
      ++out_of_lockstep;
      continue;
    }
    pooled.insert(pooled.end(), c.lateness.begin(), c.lateness.end());
    compared.push_back(std::move(c));
    out.compared_step_numbers.push_back(number);
  }
  out.compared_steps = static_cast<int>(compared.size());
  if (out_of_lockstep > 0) {
    out.notes.push_back(StrCat(
        out_of_lockstep, " of the ", out.steps,
        " steps in common were not compared: the hosts entered their collectives more than a "
        "step apart, so they did not run those steps together (hosts that do not meet in "
        "collectives, or clocks that disagree)"));
  }
  // The noise: the median absolute deviation of all hosts' lateness over all compared steps
  // (a straggler is a minority of the samples, so it barely moves it). With two hosts every
  // other sample is the gap itself, so only the step-time share applies.
  double noise = 0;
  if (usable.size() >= 3 && !pooled.empty()) {
    const int64_t center = Median(pooled);
    std::vector<int64_t> deviations;
    for (int64_t l : pooled) {
      deviations.push_back(std::max(SaturatingSub(l, center), SaturatingSub(center, l)));
    }
    noise = rule.mad_factor * static_cast<double>(Median(std::move(deviations)));
  }

  std::vector<HostTally> tally(usable.size());
  for (const Compared& c : compared) {
    const std::vector<const StepDigest*>& steps = *c.steps;
    const double threshold =
        std::max(rule.step_fraction * static_cast<double>(c.median_step_ns), noise);
    for (size_t h = 0; h < steps.size(); ++h) {
      if (static_cast<double>(c.lateness[h]) <= threshold) continue;
      HostTally& t = tally[h];
      ++t.late;
      t.lateness.push_back(c.lateness[h]);
      for (size_t o = 0; o < steps.size(); ++o) {
        if (o != h && c.entries[h] > c.entries[o]) {
          t.others_wait_ns =
              SaturatingAdd(t.others_wait_ns, SaturatingSub(c.entries[h], c.entries[o]));
        }
      }
      const int64_t compute =
          SaturatingSub(SaturatingAdd(steps[h]->device_busy_ns, steps[h]->host_busy_ns),
                        SaturatingAdd(MedianOthers(steps, h, &StepDigest::device_busy_ns),
                                      MedianOthers(steps, h, &StepDigest::host_busy_ns)));
      t.excess.compute_ns = SaturatingAdd(t.excess.compute_ns, std::max<int64_t>(0, compute));
      t.excess.input_ns = SaturatingAdd(
          t.excess.input_ns,
          std::max<int64_t>(
              0, SaturatingSub(steps[h]->input_ns, MedianOthers(steps, h, &StepDigest::input_ns))));
      t.excess.lateness_ns = SaturatingAdd(t.excess.lateness_ns, c.lateness[h]);
    }
  }
  if (out.compared_steps == 0) {
    if (out_of_lockstep == 0) {
      out.notes.push_back(StrCat("no step of the ", out.steps,
                                 " in common has a collective on every host: nothing to compare "
                                 "(collectives are found by name; see --collective-pattern)"));
    }
    return out;
  }
  const int needed =
      std::max(1, static_cast<int>(std::ceil(rule.min_late_fraction * out.compared_steps)));
  for (size_t h = 0; h < usable.size(); ++h) {
    HostVerdict& verdict = out.hosts[h];
    const HostTally& t = tally[h];
    verdict.late_steps = t.late;
    verdict.median_lateness_ns = Median(t.lateness);
    verdict.others_wait_ns = t.others_wait_ns;
    verdict.straggler = t.late >= needed;
    if (!verdict.straggler) continue;
    verdict.cause = CauseOf(t.excess);
    verdict.evidence = Evidence(verdict, out.compared_steps, usable.size(), t.excess);
  }
  return out;
}

}  // namespace clusterprof::analysis
