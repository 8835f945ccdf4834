#include "sidecar/tracers/step_telemetry.h"

#include <algorithm>

#include "analysis/digest.h"
#include "common/base/strings.h"
#include "common/xspace/schema.h"
#include "common/xspace/traceme.h"
#include "sidecar/tracers/ring_reader.h"

namespace clusterprof::sidecar {
namespace {

// Collective starts kept for matching at most (a step's collectives arrive before its marker,
// which is written when the step's scope ends).
constexpr size_t kMaxCollectiveStarts = 65536;
// Collectives that began this long before the latest step's start cannot belong to a step still
// to be published.
constexpr int64_t kCollectiveHorizonNs = 60'000'000'000;

absl::StatusOr<std::regex> Compile(const std::string& pattern, std::string_view what) {
  try {
    return std::regex(pattern, std::regex::ECMAScript | std::regex::icase | std::regex::optimize);
  } catch (const std::regex_error& e) {
    return absl::InvalidArgumentError(
        StrCat("the ", what, " pattern '", pattern, "' is not a regular expression: ", e.what()));
  }
}

std::optional<int64_t> AsStepNumber(const traceme::Value& value) {
  if (const auto* v = std::get_if<int64_t>(&value)) return *v;
  if (const auto* v = std::get_if<uint64_t>(&value); v != nullptr && *v <= INT64_MAX) {
    return static_cast<int64_t>(*v);
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<std::unique_ptr<StepTelemetry>> StepTelemetry::Create(Options options) {
  std::optional<std::regex> step_re;
  std::string source = StrCat("events with a ", xspace::kStepNum, " stat");
  if (!options.step_pattern.empty()) {
    absl::StatusOr<std::regex> compiled = Compile(options.step_pattern, "step");
    if (!compiled.ok()) return compiled.status();
    step_re = std::move(*compiled);
    source = StrCat("events named like '", options.step_pattern, "'");
  }
  if (options.collective_pattern.empty()) {
    options.collective_pattern = analysis::kDefaultCollectivePattern;
  }
  absl::StatusOr<std::regex> collective = Compile(options.collective_pattern, "collective");
  if (!collective.ok()) return collective.status();
  if (options.max_steps == 0) options.max_steps = 1;
  return std::unique_ptr<StepTelemetry>(new StepTelemetry(
      std::move(options), std::move(step_re), std::move(*collective), std::move(source)));
}

StepTelemetry::StepTelemetry(Options options, std::optional<std::regex> step_re,
                             std::regex collective_re, std::string step_source)
    : options_(std::move(options)),
      step_re_(std::move(step_re)),
      collective_re_(std::move(collective_re)),
      step_source_(std::move(step_source)) {}

const StepTelemetry::RingNames::Entry& StepTelemetry::Classify(RingNames& names,
                                                               const shm::RingReader& reader,
                                                               uint32_t id) {
  auto [it, inserted] = names.names.try_emplace(id);
  RingNames::Entry& entry = it->second;
  if (!inserted) return entry;
  entry.kind = RingNames::kOther;
  const std::string_view text = reader.String(id);
  if (text.empty()) return entry;
  const traceme::Annotation annotation = traceme::Decode(text);
  for (const traceme::Stat& stat : annotation.stats) {
    if (stat.key != xspace::kStepNum) continue;
    if (std::optional<int64_t> number = AsStepNumber(stat.value)) {
      entry.has_step_number = true;
      entry.step_number = *number;
    }
  }
  const std::string name(annotation.name);
  if (step_re_.has_value() ? std::regex_search(name, *step_re_) : entry.has_step_number) {
    entry.kind = RingNames::kStep;
  } else if (std::regex_search(name, collective_re_)) {
    entry.kind = RingNames::kCollective;
  }
  return entry;
}

bool StepTelemetry::HasStepArg(RingNames& names, const shm::RingReader& reader,
                               const shm::Record& record, int64_t* step) {
  for (int i = 0; i < std::min<int>(record.num_args, shm::kMaxInlineArgs); ++i) {
    const shm::Arg& arg = record.args[i];
    if (arg.key_id == 0) continue;
    auto [it, inserted] = names.step_keys.try_emplace(arg.key_id, false);
    if (inserted) it->second = reader.String(arg.key_id) == xspace::kStepNum;
    if (!it->second) continue;
    if (arg.type == shm::ArgType::kInt64 ||
        (arg.type == shm::ArgType::kUint64 && arg.value <= INT64_MAX)) {
      *step = static_cast<int64_t>(arg.value);
      return true;
    }
  }
  return false;
}

void StepTelemetry::Observe(RingNames& names, const shm::RingReader& reader,
                            std::span<const shm::Record> records) {
  for (const shm::Record& record : records) {
    if (record.kind != shm::RecordKind::kComplete) continue;
    const RingNames::Entry& entry = Classify(names, reader, record.name_id);
    int64_t number = 0;
    bool step = false;
    if (entry.kind == RingNames::kStep) {
      step = true;
      if (entry.has_step_number) {
        number = entry.step_number;
      } else if (!HasStepArg(names, reader, record, &number)) {
        number = unnumbered_steps_++;
      }
    } else if (entry.kind == RingNames::kCollective) {
      collective_starts_.push_back(record.start_ns);
      continue;
    } else if (!step_re_.has_value() && record.num_args > 0) {
      step = HasStepArg(names, reader, record, &number);
    }
    if (!step || record.end_ns < record.start_ns) continue;
    names.saw_step = true;
    pending_.push_back({number, record.start_ns, record.end_ns, 0});
  }
}

void StepTelemetry::EndDrain(int processes, int processes_with_steps) {
  std::sort(collective_starts_.begin(), collective_starts_.end());
  for (LiveStep& step : pending_) {
    auto it = std::lower_bound(collective_starts_.begin(), collective_starts_.end(), step.start_ns);
    if (it != collective_starts_.end() && *it <= step.end_ns) step.collective_entry_ns = *it;
  }
  std::sort(pending_.begin(), pending_.end(),
            [](const LiveStep& a, const LiveStep& b) { return a.step < b.step; });
  std::vector<LiveStep> first_seen;
  {
    MutexLock lock(&mu_);
    processes_ = processes;
    processes_with_steps_count_ = processes_with_steps;
    for (const LiveStep& step : pending_) {
      // Usually the newest: look from the back.
      auto it = std::find_if(steps_.rbegin(), steps_.rend(),
                             [&](const LiveStep& s) { return s.step <= step.step; });
      if (it != steps_.rend() && it->step == step.step) {
        // Another process's marker of the same step: the pod's step spans both.
        it->start_ns = std::min(it->start_ns, step.start_ns);
        it->end_ns = std::max(it->end_ns, step.end_ns);
        if (step.collective_entry_ns != 0 &&
            (it->collective_entry_ns == 0 || step.collective_entry_ns < it->collective_entry_ns)) {
          it->collective_entry_ns = step.collective_entry_ns;
        }
      } else {
        if (it == steps_.rend() && steps_.size() >= options_.max_steps) continue;  // too old
        steps_.insert(it.base(), step);
        ++steps_total_;
        first_seen.push_back(step);
        if (steps_.size() > options_.max_steps) steps_.pop_front();
      }
      last_step_end_ns_ = std::max(last_step_end_ns_, step.end_ns);
      ++sequence_;
    }
  }
  // Collectives older than what a step still to come can contain are no longer needed.
  if (!pending_.empty()) {
    int64_t latest_start = 0;
    for (const LiveStep& step : pending_) latest_start = std::max(latest_start, step.start_ns);
    const int64_t horizon = latest_start - kCollectiveHorizonNs;
    collective_starts_.erase(
        collective_starts_.begin(),
        std::lower_bound(collective_starts_.begin(), collective_starts_.end(), horizon));
  }
  if (collective_starts_.size() > kMaxCollectiveStarts) {
    collective_starts_.erase(collective_starts_.begin(),
                             collective_starts_.end() - kMaxCollectiveStarts);
  }
  pending_.clear();
  if (observer_) {
    for (const LiveStep& step : first_seen) observer_(step);
  }
}

StepTelemetry::Snapshot StepTelemetry::Get(int64_t after_step, size_t max_steps) const {
  Snapshot snapshot;
  MutexLock lock(&mu_);
  snapshot.sequence = sequence_;
  snapshot.steps_total = steps_total_;
  snapshot.last_step_end_ns = last_step_end_ns_;
  snapshot.processes = processes_;
  snapshot.processes_with_steps = processes_with_steps_count_;
  snapshot.step_source = step_source_;
  auto first = std::upper_bound(steps_.begin(), steps_.end(), after_step,
                                [](int64_t number, const LiveStep& s) { return number < s.step; });
  const size_t available = static_cast<size_t>(steps_.end() - first);
  if (available > max_steps) first = steps_.end() - static_cast<std::ptrdiff_t>(max_steps);
  snapshot.steps.assign(first, steps_.end());
  return snapshot;
}

uint64_t StepTelemetry::WaitForChange(uint64_t sequence, absl::Duration timeout) const {
  MutexLock lock(&mu_);
  mu_.AwaitWithTimeout([this, sequence]()
                           ABSL_NO_THREAD_SAFETY_ANALYSIS { return sequence_ != sequence; },
                       absl::ToChronoMilliseconds(timeout));
  return sequence_;
}

}  // namespace clusterprof::sidecar
