#include "sidecar/tracers/annotation_tracer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstring>
#include <set>
#include <unordered_map>

#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/base/check.h"
#include "common/base/clock.h"
#include "common/base/saturating.h"
#include "common/base/strings.h"
#include "common/xspace/builder.h"
#include "common/xspace/schema.h"
#include "common/xspace/traceme.h"
#include "fmt/format.h"
#include "proto/profile_options.h"
#include "spdlog/spdlog.h"
#include "tsl/profiler/protos/xplane.pb.h"

namespace clusterprof::sidecar {

// Line ids on the host-threads plane. A thread's line is its tid, unless a thread of another
// process took it (two processes in different pid namespaces may share a tid, and a pid too);
// async lanes take ids from kAsyncBase up, past any thread's.
class LineIds {
 public:
  static constexpr int64_t kAsyncBase = int64_t{1} << 40;

  int64_t ForThread(uint32_t pid, uint32_t tid) {
    if (used_.insert(tid).second) return tid;
    // The first free id from (pid << 32) | tid (unsigned: the pid comes from the ring file).
    uint64_t other = (uint64_t{pid} << 32) | tid;
    while (!used_.insert(static_cast<int64_t>(other)).second) ++other;
    return static_cast<int64_t>(other);
  }
  int64_t NextAsync() {
    while (!used_.insert(next_async_).second) ++next_async_;
    return next_async_++;
  }

 private:
  std::set<int64_t> used_;
  int64_t next_async_ = kAsyncBase;
};

namespace {

using tensorflow::profiler::XEventMetadata;
using tensorflow::profiler::XSpace;
using tensorflow::profiler::XStatMetadata;
using xspace::XEventBuilder;
using xspace::XLineBuilder;
using xspace::XPlaneBuilder;

// Rings are looked for again every this many drains even when the directory's mtime says
// nothing changed (file systems with coarse timestamps).
constexpr int kRefreshEveryDrains = 20;

// With the recorder on, rings of processes that have ended are looked for this often.
constexpr int64_t kCloseEveryNs = 1'000'000'000;

// "4.2 s", "250 ms".
std::string FormatSeconds(int64_t ns) {
  if (ns < 1'000'000'000) return StrCat(ns / kNanosPerMilli, " ms");
  return fmt::format("{:.1f} s", static_cast<double>(ns) / 1e9);
}

void AppendLine(std::string* text, std::string_view line) {
  if (!text->empty()) text->push_back('\n');
  text->append(line);
}

// An event's name and stats, decoded once per string id.
struct DecodedName {
  const XEventMetadata* metadata = nullptr;
  std::vector<std::pair<const XStatMetadata*, traceme::Value>> stats;
};

class RingConverter {
 public:
  RingConverter(const shm::RingReader& reader, XPlaneBuilder& plane)
      : reader_(reader), plane_(plane) {}

  const DecodedName& Name(uint32_t id) {
    auto [it, inserted] = names_.try_emplace(id);
    if (!inserted) return it->second;
    DecodedName& decoded = it->second;
    std::string_view text = reader_.String(id);
    if (text.empty()) text = "(unnamed)";
    const traceme::Annotation annotation = traceme::Decode(text);
    decoded.metadata = plane_.GetOrCreateEventMetadata(annotation.name);
    for (const traceme::Stat& stat : annotation.stats) {
      decoded.stats.emplace_back(plane_.GetOrCreateStatMetadata(stat.key), stat.value);
    }
    return decoded;
  }

  void AddEvent(XLineBuilder& line, const shm::Record& record, int64_t start_ns, int64_t end_ns) {
    const DecodedName& name = Name(record.name_id);
    XEventBuilder event = line.AddEvent(*name.metadata);
    event.SetTimestampNs(start_ns);
    event.SetDurationNs(std::max<int64_t>(0, SaturatingSub(end_ns, start_ns)));
    for (const auto& [metadata, value] : name.stats) AddValue(event, *metadata, value);
    for (int i = 0; i < std::min<int>(record.num_args, shm::kMaxInlineArgs); ++i) {
      const shm::Arg& arg = record.args[i];
      const std::string_view key = reader_.String(arg.key_id);
      if (key.empty()) continue;
      const XStatMetadata& metadata = *plane_.GetOrCreateStatMetadata(key);
      switch (arg.type) {
        case shm::ArgType::kInt64:
          event.AddStatValue(metadata, static_cast<int64_t>(arg.value));
          break;
        case shm::ArgType::kUint64:
          event.AddStatValue(metadata, arg.value);
          break;
        case shm::ArgType::kDouble:
          event.AddStatValue(metadata, std::bit_cast<double>(arg.value));
          break;
        case shm::ArgType::kString: {
          const std::string_view text =
              arg.value <= UINT32_MAX ? reader_.String(static_cast<uint32_t>(arg.value)) : "";
          event.AddStatValue(metadata, *plane_.GetOrCreateStatMetadata(text));
          break;
        }
        default:
          break;  // an unknown type from a newer SDK: skip the arg, keep the event
      }
    }
  }

 private:
  void AddValue(XEventBuilder& event, const XStatMetadata& metadata, const traceme::Value& value) {
    if (const auto* text = std::get_if<std::string_view>(&value)) {
      event.AddStatValue(metadata, *plane_.GetOrCreateStatMetadata(*text));
    } else {
      std::visit([&](const auto& v) { event.AddStatValue(metadata, v); }, value);
    }
  }

  const shm::RingReader& reader_;
  XPlaneBuilder& plane_;
  std::unordered_map<uint32_t, DecodedName> names_;
};

// An async event: its begin record, and where it ends (its end record's time, or the stop).
struct AsyncSpan {
  int64_t start_ns;
  int64_t end_ns;
  shm::Record begin;
};

// What a process's ring lost, each as a warning.
void WarnOfRingLosses(const shm::RingReader& reader, uint64_t ring_dropped,
                      const std::string& process, XSpace* space) {
  if (ring_dropped > 0) {
    space->add_warnings(StrCat("annotations: ", ring_dropped, " events of ", process, " (pid ",
                               reader.pid(), ") were dropped because its ring was full"));
  }
  if (reader.dropped_threads() > 0) {
    space->add_warnings(StrCat("annotations: ", reader.dropped_threads(), " threads of ", process,
                               " found no free ring slot; their events are missing"));
  }
  if (reader.dropped_strings() > 0) {
    space->add_warnings(
        StrCat("annotations: the string table of ", process, " is full; some events have no name"));
  }
}

// A thread's complete events in `window` onto `line`, which starts at the earliest of them (or
// the window's start); its async begins and ends go to `async_records`. Returns the events added.
uint64_t AddThreadEvents(const BlockBuffer<shm::Record>& records, const EventWindow& window,
                         RingConverter& converter, XLineBuilder& line,
                         std::vector<shm::Record>* async_records) {
  auto in_window = [&](const shm::Record& record) {
    return record.end_ns >= window.start_ns && record.start_ns <= window.stop_ns;
  };
  int64_t line_start = window.start_ns;
  records.ForEach([&](const shm::Record& record) {
    if (record.kind == shm::RecordKind::kComplete && in_window(record)) {
      line_start = std::min(line_start, record.start_ns);
    }
  });
  line.SetTimestampNs(line_start);
  line.ReserveEvents(static_cast<int>(std::min<size_t>(records.size(), INT32_MAX)));
  uint64_t events = 0;
  records.ForEach([&](const shm::Record& record) {
    switch (record.kind) {
      case shm::RecordKind::kComplete:
        if (!in_window(record)) break;
        converter.AddEvent(line, record, record.start_ns, record.end_ns);
        ++events;
        break;
      case shm::RecordKind::kAsyncBegin:
      case shm::RecordKind::kAsyncEnd:
        async_records->push_back(record);
        break;
    }
  });
  return events;
}

// A process's async begins and ends matched by id in time order, by start; one begun and not
// ended by `stop_ns` lasts to the stop.
std::vector<AsyncSpan> MatchAsyncSpans(std::vector<shm::Record> records, int64_t stop_ns) {
  std::stable_sort(records.begin(), records.end(), [](const shm::Record& a, const shm::Record& b) {
    if (a.start_ns != b.start_ns) return a.start_ns < b.start_ns;
    return a.kind == shm::RecordKind::kAsyncBegin && b.kind == shm::RecordKind::kAsyncEnd;
  });
  std::unordered_map<uint64_t, shm::Record> open;
  std::vector<AsyncSpan> spans;
  for (const shm::Record& record : records) {
    if (record.kind == shm::RecordKind::kAsyncBegin) {
      open[record.async_id] = record;
    } else if (auto it = open.find(record.async_id); it != open.end()) {
      spans.push_back({it->second.start_ns, record.end_ns, it->second});
      open.erase(it);
    }
  }
  for (const auto& [id, begin] : open) {
    spans.push_back({begin.start_ns, std::max(begin.start_ns, stop_ns), begin});
  }
  std::sort(spans.begin(), spans.end(), [](const AsyncSpan& a, const AsyncSpan& b) {
    return a.start_ns != b.start_ns ? a.start_ns < b.start_ns : a.end_ns > b.end_ns;
  });
  return spans;
}

// The spans in `window` on "<process> async" lines. Async events may overlap and a line's events
// must not, so they go on as many lanes as needed (first fit by start time). Returns the events
// added.
uint64_t AddAsyncLanes(const std::vector<AsyncSpan>& spans, const std::string& process,
                       const EventWindow& window, RingConverter& converter, XPlaneBuilder& plane,
                       LineIds& line_ids) {
  std::vector<std::pair<XLineBuilder, int64_t>> lanes;  // line, end of its last event
  uint64_t events = 0;
  for (const AsyncSpan& span : spans) {
    if (span.end_ns < window.start_ns || span.start_ns > window.stop_ns) continue;
    auto lane = std::find_if(lanes.begin(), lanes.end(),
                             [&](const auto& l) { return l.second <= span.start_ns; });
    if (lane == lanes.end()) {
      XLineBuilder line = plane.GetOrCreateLine(line_ids.NextAsync());
      line.SetName(StrCat(process, " async", lanes.empty() ? "" : StrCat(" ", lanes.size())));
      line.SetTimestampNs(std::min(window.start_ns, spans.front().start_ns));
      lanes.emplace_back(line, 0);
      lane = lanes.end() - 1;
    }
    converter.AddEvent(lane->first, span.begin, span.start_ns, span.end_ns);
    lane->second = span.end_ns;
    ++events;
  }
  return events;
}

}  // namespace

absl::StatusOr<std::unique_ptr<AnnotationTracer>> AnnotationTracer::Create(ShmTransport* shm,
                                                                           Options options) {
  CLUSTERPROF_CHECK(shm != nullptr) << "the annotation tracer needs the shared-memory transport";
  if (options.recorder_window_ms < 0) {
    return absl::InvalidArgumentError(
        StrCat("the recorder window must be 0 (off) or more ms, not ", options.recorder_window_ms));
  }
  if (options.recorder_level > 3) {
    return absl::InvalidArgumentError(
        StrCat("the recorder level must be 0 (off) to 3, not ", options.recorder_level));
  }
  if (options.recorder_drain_interval_ms <= 0) options.recorder_drain_interval_ms = 100;
  return std::unique_ptr<AnnotationTracer>(new AnnotationTracer(shm, std::move(options)));
}

AnnotationTracer::AnnotationTracer(ShmTransport* shm, Options options)
    : options_(std::move(options)), shm_(shm), rings_(*shm, shm::kRingPrefix, "ring") {
  {
    MutexLock lock(&mu_);
    recorder_since_ns_ = NowNs();
  }
  ArmIdleLevel();
  // One drainer for the tracer's life. Without the recorder it idles between captures: Start
  // only flips a flag, so the instants after a synchronized start cost little CPU (many sidecars
  // may share a machine). With it, it drains every recorder_drain_interval_ms.
  drainer_ = std::thread([this] { DrainLoop(); });
}

AnnotationTracer::~AnnotationTracer() {
  shm_->control().DisarmHost();
  {
    MutexLock lock(&mu_);
    draining_ = false;
    shutting_down_ = true;
  }
  drainer_.join();
}

int64_t AnnotationTracer::NowNs() const {
  if (options_.now_ns) return options_.now_ns();
  return absl::ToUnixNanos(absl::Now());
}

void AnnotationTracer::ArmIdleLevel() {
  if (recorder_on()) {
    shm_->control().ArmHost(options_.recorder_level, NowNs(), INT64_MAX);
  } else {
    shm_->control().DisarmHost();
  }
}

std::vector<std::string_view> AnnotationTracer::OwnedKeys() const {
  return {proto::kLookbackMsKey};
}

absl::Status AnnotationTracer::Validate(const tensorflow::ProfileOptions& options) const {
  auto it = options.advanced_configuration().find(proto::kLookbackMsKey);
  if (it == options.advanced_configuration().end()) return absl::OkStatus();
  const int64_t lookback_ms = it->second.int64_value();
  if (it->second.value_case() != tensorflow::ProfileOptions::AdvancedConfigValue::kInt64Value ||
      lookback_ms < 0) {
    return absl::InvalidArgumentError(StrCat("advanced_configuration[\"", proto::kLookbackMsKey,
                                             "\"] must be an int64_value of 0 or more ms"));
  }
  if (lookback_ms == 0) return absl::OkStatus();
  if (!recorder_on() || options_.recorder_window_ms == 0) {
    return absl::InvalidArgumentError(
        StrCat("advanced_configuration[\"", proto::kLookbackMsKey, "\"] is ", lookback_ms,
               " ms but this sidecar's flight recorder is off (",
               !recorder_on() ? "--recorder-level 0" : "--recorder-window-ms 0",
               "), so it keeps nothing from before a capture: drop the lookback or turn the "
               "recorder on (docs/triggers.md)"));
  }
  if (lookback_ms > options_.recorder_window_ms) {
    return absl::InvalidArgumentError(
        StrCat("advanced_configuration[\"", proto::kLookbackMsKey, "\"] is ", lookback_ms,
               " ms, longer than this sidecar's flight recorder keeps (--recorder-window-ms ",
               options_.recorder_window_ms, "): ask for at most ", options_.recorder_window_ms,
               " ms or raise the window (docs/triggers.md)"));
  }
  return absl::OkStatus();
}

TracerStatus AnnotationTracer::Status() const {
  absl::StatusOr<std::vector<std::string>> files = shm_->ListRings(shm::kRingPrefix);
  if (!files.ok()) return {false, std::string(files.status().message())};
  std::string recorder = "flight recorder off";
  if (recorder_on()) {
    const RecorderStatus status = Recorder();
    recorder = StrCat("flight recorder at level ", status.level, ", ",
                      status.window_ms > 0
                          ? StrCat(status.window_ms, " ms window, ", status.records, " events kept")
                          : "no window");
  }
  return {true,
          StrCat(files->size(), " instrumented process(es) in ", shm_->dir(), "; ", recorder)};
}

AnnotationTracer::RecorderStatus AnnotationTracer::Recorder() const {
  RecorderStatus status;
  status.on = recorder_on();
  status.level = options_.recorder_level;
  status.window_ms = recorder_on() ? options_.recorder_window_ms : 0;
  MutexLock lock(&mu_);
  status.records = kept_records_;
  status.bytes = kept_records_ * sizeof(shm::Record);
  if (status.on && status.window_ms > 0) {
    status.covered_since_ns =
        std::max(recorder_since_ns_, NowNs() - status.window_ms * kNanosPerMilli);
  }
  return status;
}

void AnnotationTracer::PrepareLocked(const CaptureWindow& window, const CaptureConfig& config) {
  // Without the recorder nothing is kept between captures: the rings are opened afresh.
  if (!recorder_on()) rings_.Release();
  for (auto& [path, ring] : rings_) {
    for (ThreadEvents& thread : ring.threads) thread.records = BlockBuffer<shm::Record>();
    ring.dropped = 0;
  }
  window_ = window;
  stop_ns_ = window.planned_stop_ns;
  max_events_ = config.max_events > 0 ? config.max_events : options_.default_max_events;
  host_level_ = config.options.host_tracer_level();
  lookback_asked_ns_ = 0;
  if (auto it = config.options.advanced_configuration().find(proto::kLookbackMsKey);
      it != config.options.advanced_configuration().end() && it->second.int64_value() > 0) {
    lookback_asked_ns_ = it->second.int64_value() * kNanosPerMilli;
  }
  lookback_ns_ = 0;
  lookback_pending_ = false;
  lookback_warning_.clear();
  lookback_dropped_ = 0;
  kept_ = 0;
  capped_ = 0;
  open_errors_.clear();
  rings_.Refresh(&open_errors_, "");
  prepared_ = true;
}

absl::Status AnnotationTracer::Prepare(const CaptureWindow& window, const CaptureConfig& config) {
  MutexLock lock(&mu_);
  CLUSTERPROF_CHECK(!draining_) << "annotation tracer prepared while capturing";
  PrepareLocked(window, config);
  return absl::OkStatus();
}

absl::Status AnnotationTracer::Start(const CaptureWindow& window, const CaptureConfig& config) {
  uint32_t host_level = 0;
  {
    MutexLock lock(&mu_);
    CLUSTERPROF_CHECK(!draining_) << "annotation tracer started twice";
    if (!prepared_) PrepareLocked(window, config);
    host_level = std::max(host_level_, options_.recorder_level);
    prepared_ = false;
    window_ = window;
    stop_ns_ = window.planned_stop_ns;
    // With the recorder covering the requested instant, the records written between it and
    // this (late) wake-up are kept already, with the workload's own timestamps: the capture
    // takes its window from the instant itself.
    data_start_ns_ = window.start_ns;
    const int64_t requested = window.requested_start_ns;
    if (requested > 0 && requested < window.start_ns &&
        RecorderCoversLocked(requested, host_level_, window.start_ns)) {
      data_start_ns_ = requested;
    }
    if (recorder_on()) {
      // The drainer's first drain of the capture takes the lookback from the recorder, off the
      // start instant's path.
      lookback_pending_ = true;
    } else {
      // What the rings hold from before the start is not part of this capture.
      for (auto& [path, ring] : rings_) ring.reader->Skip();
    }
    draining_ = true;  // the drainer wakes when the lock is released
  }
  shm_->control().ArmHost(host_level, window.start_ns, window.planned_stop_ns);
  return absl::OkStatus();
}

bool AnnotationTracer::RecorderCoversLocked(int64_t since_ns, uint32_t level,
                                            int64_t now_ns) const {
  if (!recorder_on() || options_.recorder_window_ms <= 0 || level > options_.recorder_level) {
    return false;
  }
  if (recorder_since_ns_ > since_ns) return false;
  if (SaturatingSub(now_ns, options_.recorder_window_ms * kNanosPerMilli) > since_ns) return false;
  // A ring that was full between drains since then lost records of the stretch.
  for (const auto& [when, count] : recorder_drops_) {
    if (when >= since_ns) return false;
  }
  return true;
}

int64_t AnnotationTracer::DataStartNs(const CaptureWindow& window) const {
  MutexLock lock(&mu_);
  return data_start_ns_ > 0 ? data_start_ns_ : window.start_ns;
}

absl::Status AnnotationTracer::Stop(int64_t stop_ns) {
  ArmIdleLevel();
  MutexLock lock(&mu_);
  // A thread that checked the level just before the disarm may still be writing its record;
  // what it writes ends after stop_ns and is filtered out at collection.
  rings_.Refresh(&open_errors_, "");
  DrainLocked();
  draining_ = false;
  stop_ns_ = stop_ns;
  return absl::OkStatus();
}

void AnnotationTracer::DrainLoop() {
  MutexLock lock(&mu_);
  int drains = 0;
  timespec dir_mtime{};
  int64_t last_close_ns = 0;
  while (true) {
    if (!recorder_on()) {
      mu_.Await([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return draining_ || shutting_down_; });
    }
    if (shutting_down_) return;
    // The first drain of a capture waits one interval: at the start instant the CPU belongs to
    // the sessions (of every sidecar on the machine) taking their start times. A capture that
    // starts or ends wakes the wait, which then starts over at the other interval.
    const bool capturing = draining_;
    const int64_t interval_ms =
        capturing ? options_.drain_interval_ms : options_.recorder_drain_interval_ms;
    if (mu_.AwaitWithTimeout(
            [this, capturing]()
                ABSL_NO_THREAD_SAFETY_ANALYSIS { return shutting_down_ || draining_ != capturing; },
            std::chrono::milliseconds(interval_ms))) {
      continue;
    }
    // A process that starts annotating creates its ring then: look for new rings whenever the
    // directory changed (a stat per drain), and in any case now and then.
    const bool changed = shm_->DirectoryChanged(&dir_mtime);
    if (changed || ++drains % kRefreshEveryDrains == 0) rings_.Refresh(&open_errors_, "");
    DrainLocked();
    if (!draining_) {
      const int64_t now = NowNs();
      if (now - last_close_ns >= kCloseEveryNs) {
        last_close_ns = now;
        CloseEndedRingsLocked();
      }
    }
  }
}

uint64_t AnnotationTracer::DrainOnce() {
  MutexLock lock(&mu_);
  rings_.Refresh(&open_errors_, "");
  return DrainLocked();
}

uint64_t AnnotationTracer::DrainLocked() {
  if (draining_ && lookback_pending_) TakeLookbackLocked();
  const bool keep = recorder_on() && options_.recorder_window_ms > 0;
  const int64_t now = NowNs();
  uint64_t total = 0;
  int with_steps = 0;
  for (auto& [path, ring] : rings_) {
    Ring* r = &ring;
    const shm::DrainStats drained = r->reader->DrainSpans(
        [this, r, keep](const shm::ThreadInfo& thread, std::span<const shm::Record> records)
            ABSL_NO_THREAD_SAFETY_ANALYSIS {
              if (thread.index >= r->threads.size()) r->threads.resize(thread.index + 1);
              ThreadEvents& events = r->threads[thread.index];
              if (events.tid != thread.tid || events.name != thread.name) {
                events.tid = thread.tid;
                events.name.assign(thread.name);
              }
              if (options_.telemetry != nullptr) {
                options_.telemetry->Observe(r->names, *r->reader, records);
              }
              if (keep) {
                events.kept.Append(records);
                kept_records_ += records.size();
              }
              if (!draining_) return;
              const uint64_t room = max_events_ - std::min(kept_, max_events_);
              if (records.size() > room) {
                capped_ += records.size() - room;
                records = records.first(room);
              }
              if (records.empty()) return;
              events.records.Append(records);
              kept_ += records.size();
            });
    if (draining_) {
      r->dropped += drained.dropped;
    } else if (drained.dropped > 0 && keep) {
      recorder_drops_.emplace_back(now, drained.dropped);
    }
    total += drained.records;
    if (r->names.saw_step) ++with_steps;
  }
  if (options_.telemetry != nullptr) {
    options_.telemetry->EndDrain(static_cast<int>(rings_.size()), with_steps);
  }
  if (keep) TrimRecorderLocked(now);
  return total;
}

void AnnotationTracer::TakeLookbackLocked() {
  lookback_pending_ = false;
  // From the data start: the requested instant when the recorder covers it, else the wake-up.
  const int64_t start_ns = data_start_ns_ > 0 ? data_start_ns_ : window_.start_ns;
  if (lookback_asked_ns_ <= 0 && start_ns >= window_.start_ns) return;
  const int64_t cutoff = SaturatingSub(start_ns, lookback_asked_ns_);
  const int64_t reached_from = std::max(cutoff, recorder_since_ns_);
  lookback_ns_ = std::max<int64_t>(0, SaturatingSub(start_ns, reached_from));
  std::vector<shm::Record> batch;
  for (auto& [path, ring] : rings_) {
    for (ThreadEvents& thread : ring.threads) {
      batch.clear();
      thread.kept.ForEachEndingSince(cutoff,
                                     [&](const shm::Record& record) { batch.push_back(record); });
      const uint64_t room = max_events_ - std::min(kept_, max_events_);
      std::span<const shm::Record> records(batch);
      if (records.size() > room) {
        capped_ += records.size() - room;
        records = records.first(room);
      }
      thread.records.Append(records);
      kept_ += records.size();
    }
  }
  uint64_t dropped = 0;
  for (const auto& [when, count] : recorder_drops_) {
    if (when >= cutoff) dropped += count;
  }
  if (dropped > 0) {
    lookback_dropped_ = dropped;
    lookback_warning_ = StrCat("annotations: ", dropped,
                               " events of the lookback were dropped because a ring was full "
                               "between drains (a thread writing faster than the recorder "
                               "drains: raise CLUSTERPROF_RING_EVENTS in the workload)");
  }
  if (lookback_ns_ < lookback_asked_ns_) {
    const std::string why =
        recorder_trimmed_for_memory_
            ? StrCat("the recorder's memory bound (", options_.recorder_max_bytes >> 20,
                     " MiB, --recorder-max-bytes) let older annotations go")
            : "the recorder holds annotations only since the sidecar started";
    AppendLine(
        &lookback_warning_,
        StrCat("annotations: the trace reaches back ", FormatSeconds(lookback_ns_),
               " before the start, not the ", FormatSeconds(lookback_asked_ns_), " asked: ", why));
  }
}

void AnnotationTracer::TrimRecorderLocked(int64_t now_ns) {
  const int64_t cutoff = SaturatingSub(now_ns, options_.recorder_window_ms * kNanosPerMilli);
  for (auto& [path, ring] : rings_) {
    for (ThreadEvents& thread : ring.threads) {
      while (thread.kept.OldestBlockEnd() < cutoff) kept_records_ -= thread.kept.DropOldestBlock();
    }
  }
  const uint64_t max_records = std::max<uint64_t>(options_.recorder_max_bytes / sizeof(shm::Record),
                                                  RecordWindow::kBlockRecords);
  while (kept_records_ > max_records) {
    RecordWindow* oldest = nullptr;
    for (auto& [path, ring] : rings_) {
      for (ThreadEvents& thread : ring.threads) {
        if (!thread.kept.empty() &&
            (oldest == nullptr || thread.kept.OldestBlockEnd() < oldest->OldestBlockEnd())) {
          oldest = &thread.kept;
        }
      }
    }
    if (oldest == nullptr) break;
    recorder_since_ns_ = std::max(recorder_since_ns_, oldest->OldestBlockEnd());
    recorder_trimmed_for_memory_ = true;
    kept_records_ -= oldest->DropOldestBlock();
  }
  while (!recorder_drops_.empty() && recorder_drops_.front().first < cutoff) {
    recorder_drops_.pop_front();
  }
}

void AnnotationTracer::CloseEndedRingsLocked() {
  if (draining_) return;
  rings_.CloseIf([this](Ring& ring) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (!ring.writer_gone) {
      // Marked now and closed at a later call, so that a drain runs after the writer is known
      // to be gone (it may have written its last records just before it ended).
      ring.writer_gone = !shm_->WriterAlive(ring.reader->path(), ring.reader->pid(),
                                            ring.reader->process_start_ticks());
      return false;
    }
    for (const ThreadEvents& thread : ring.threads) {
      if (!thread.kept.empty()) return false;
    }
    return true;
  });
}

absl::Status AnnotationTracer::CollectInto(XSpace* space, TracerStats* stats) {
  MutexLock lock(&mu_);
  if (lookback_pending_) TakeLookbackLocked();  // a capture stopped before its first drain
  // The window begins at the data start (the requested instant when the recorder covered it)
  // and reaches back as far as the recorder did.
  const int64_t data_start_ns = data_start_ns_ > 0 ? data_start_ns_ : window_.start_ns;
  const EventWindow window{SaturatingSub(data_start_ns, lookback_ns_), stop_ns_};
  XPlaneBuilder plane(xspace::FindOrAddMutablePlaneWithName(space, xspace::kHostThreadsPlaneName));
  LineIds line_ids;
  uint64_t events = 0;
  uint64_t dropped = capped_ + lookback_dropped_;
  for (auto& [path, ring] : rings_) {
    dropped += ring.dropped;
    events += AddRingLocked(ring, window, plane, line_ids, space);
  }
  WarnOfAnEmptyCaptureLocked(events, space);
  for (const std::string& error : open_errors_) {
    space->add_warnings(StrCat("annotations: ", error));
  }
  if (capped_ > 0) {
    space->add_warnings(StrCat("annotations: ", capped_, " events beyond the cap of ", max_events_,
                               " were dropped (raise max_events)"));
  }
  for (std::string_view line : SplitSkipEmpty(lookback_warning_, '\n')) {
    space->add_warnings(std::string(line));
  }
  stats->events += events;
  stats->dropped_events += dropped;
  stats->lookback_ns = std::max(stats->lookback_ns, lookback_ns_);
  for (auto& [path, ring] : rings_) {
    for (ThreadEvents& thread : ring.threads) thread.records = BlockBuffer<shm::Record>();
    ring.dropped = 0;
  }
  if (recorder_on()) {
    CloseEndedRingsLocked();
  } else {
    rings_.Release();
  }
  return absl::OkStatus();
}

uint64_t AnnotationTracer::AddRingLocked(Ring& ring, const EventWindow& window,
                                         XPlaneBuilder& plane, LineIds& line_ids, XSpace* space) {
  const shm::RingReader& reader = *ring.reader;
  const std::string process = reader.process_name().empty() ? StrCat("pid ", reader.pid())
                                                            : std::string(reader.process_name());
  WarnOfRingLosses(reader, ring.dropped, process, space);
  RingConverter converter(reader, plane);
  uint64_t events = 0;
  // Async begins and ends of every thread of the process, matched by id in time order once all
  // threads are read (an end is often on a thread whose records come before the begin's).
  std::vector<shm::Record> async_records;
  for (ThreadEvents& thread : ring.threads) {
    if (thread.records.empty()) continue;
    XLineBuilder line = plane.GetOrCreateLine(line_ids.ForThread(reader.pid(), thread.tid));
    if (!thread.name.empty()) {
      line.SetName(thread.name);
    } else if (thread.tid == reader.pid()) {
      line.SetName(process);
    } else {
      line.SetName(StrCat(process, "/", thread.tid));
    }
    events += AddThreadEvents(thread.records, window, converter, line, &async_records);
  }
  const std::vector<AsyncSpan> spans = MatchAsyncSpans(std::move(async_records), window.stop_ns);
  return events + AddAsyncLanes(spans, process, window, converter, plane, line_ids);
}

// An empty capture says why, the likeliest cause first: nobody attached, or those attached
// recorded nothing in the window.
void AnnotationTracer::WarnOfAnEmptyCaptureLocked(uint64_t events, XSpace* space) {
  if (rings_.empty()) {
    space->add_warnings(
        StrCat("annotations: no process attached to ", shm_->dir(),
               ", so nothing was annotated: start the workload with CLUSTERPROF_DIR=", shm_->dir(),
               " (injected pods have it) and annotate with the SDK: clusterprof::Trace in C++, "
               "libclusterprof_annotate.so through its C API, or `import clusterprof` in Python "
               "(docs/annotations.md)"));
  } else if (events == 0) {
    std::vector<std::string> processes;
    for (auto& [path, ring] : rings_) {
      const shm::RingReader& reader = *ring.reader;
      processes.push_back(StrCat("pid ", reader.pid(), " (",
                                 reader.process_name().empty() ? "?" : reader.process_name(), ")"));
    }
    space->add_warnings(
        StrCat("annotations: ", processes.size(), " process(es) attached to ", shm_->dir(),
               " but recorded nothing in the window: ", absl::StrJoin(processes, ", "),
               "; did their annotated code run during the capture, at the requested host tracer "
               "level?"));
  }
}

}  // namespace clusterprof::sidecar
