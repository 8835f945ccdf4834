#include "common/xspace/trace_perfetto.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/base/status.h"
#include "common/base/strings.h"
#include "common/io/sink_buffer.h"
#include "common/xspace/schema.h"
#include "common/xspace/xspace_stream.h"

namespace clusterprof::xspace {
namespace {

using ::tensorflow::profiler::XPlane;
using ::tensorflow::profiler::XStat;

// Field numbers of protos/perfetto/trace/perfetto_trace.proto (third_party/perfetto/).
namespace pb {
constexpr uint32_t kTracePacket = 1;  // Trace.packet
// TracePacket
constexpr uint32_t kClockSnapshot = 6;
constexpr uint32_t kTimestamp = 8;
constexpr uint32_t kTrustedPacketSequenceId = 10;
constexpr uint32_t kTrackEvent = 11;
constexpr uint32_t kInternedData = 12;
constexpr uint32_t kSequenceFlags = 13;
constexpr uint32_t kTimestampClockId = 58;
constexpr uint32_t kTracePacketDefaults = 59;
constexpr uint32_t kTrackDescriptor = 60;
// TracePacket.SequenceFlags
constexpr uint32_t kSeqIncrementalStateCleared = 1;
constexpr uint32_t kSeqNeedsIncrementalState = 2;
// TracePacketDefaults (timestamp_clock_id = 58, as in TracePacket)
constexpr uint32_t kTrackEventDefaults = 11;
// TrackEventDefaults
constexpr uint32_t kDefaultTrackUuid = 11;
// ClockSnapshot, ClockSnapshot.Clock
constexpr uint32_t kClocks = 1;
constexpr uint32_t kPrimaryTraceClock = 2;
constexpr uint32_t kClockId = 1;
constexpr uint32_t kClockTimestamp = 2;
constexpr uint32_t kClockIsIncremental = 3;
// TrackDescriptor
constexpr uint32_t kTrackUuid = 1;
constexpr uint32_t kTrackName = 2;
constexpr uint32_t kTrackProcess = 3;
constexpr uint32_t kTrackThread = 4;
constexpr uint32_t kTrackParentUuid = 5;
constexpr uint32_t kTrackCounter = 8;
// ProcessDescriptor, ThreadDescriptor
constexpr uint32_t kProcessPid = 1;
constexpr uint32_t kProcessName = 6;
constexpr uint32_t kThreadPid = 1;
constexpr uint32_t kThreadTid = 2;
constexpr uint32_t kThreadName = 5;
// TrackEvent
constexpr uint32_t kDebugAnnotations = 4;
constexpr uint32_t kType = 9;
constexpr uint32_t kNameIid = 10;
constexpr uint32_t kEventTrackUuid = 11;
constexpr uint32_t kName = 23;
constexpr uint32_t kCounterValue = 30;
constexpr uint32_t kDoubleCounterValue = 44;
constexpr uint32_t kFlowIds = 47;
constexpr uint32_t kTerminatingFlowIds = 48;
// TrackEvent.Type
constexpr uint32_t kTypeSliceBegin = 1;
constexpr uint32_t kTypeSliceEnd = 2;
constexpr uint32_t kTypeCounter = 4;
// InternedData; EventName and DebugAnnotationName
constexpr uint32_t kEventNames = 2;
constexpr uint32_t kDebugAnnotationNames = 3;
constexpr uint32_t kIid = 1;
constexpr uint32_t kInternedName = 2;
// DebugAnnotation
constexpr uint32_t kAnnotationNameIid = 1;
constexpr uint32_t kUintValue = 3;
constexpr uint32_t kIntValue = 4;
constexpr uint32_t kDoubleValue = 5;
constexpr uint32_t kStringValue = 6;
// Clocks: BUILTIN_CLOCK_REALTIME, and the first sequence-scoped clock id, which Perfetto's own
// SDK uses for its delta-encoded timestamps (TrackEventIncrementalState::kClockIdIncremental).
constexpr uint32_t kRealtimeClock = 1;
constexpr uint32_t kIncrementalClock = 64;

constexpr int kVarint = 0;
constexpr int kFixed64 = 1;
constexpr int kBytes = 2;
}  // namespace pb

// Every packet that needs incremental state is on this one sequence; each line clears it and
// starts afresh (its defaults, its clock, its interned names), so lines never interleave.
constexpr uint32_t kSequenceId = 1;
// The interned debug annotation name of a metadata's long name (the name when a display_name is
// shown); stats' names are interned from 2 on.
constexpr uint64_t kLongNameIid = 1;
// Multiplier of PerfettoTraceOptions::flow_id_salt (2^64 / golden ratio, odd).
constexpr uint64_t kFlowSaltMultiplier = 0x9E3779B97F4A7C15ull;
constexpr size_t kBufferSize = 1 << 20;

// Interned ids follow the metadata ids (small and dense in practice), so that the output does not
// depend on the order in which a plane's metadata maps are iterated; never 0, which readers take
// for "none". Negative ids (never written by clusterprof or TSL) keep their two's complement.
uint64_t IidOf(int64_t metadata_id, uint64_t first) {
  return metadata_id >= 0 ? static_cast<uint64_t>(metadata_id) + first
                          : static_cast<uint64_t>(metadata_id);
}
uint64_t EventIid(int64_t metadata_id) { return IidOf(metadata_id, 1); }
uint64_t StatIid(int64_t metadata_id) { return IidOf(metadata_id, kLongNameIid + 1); }

constexpr uint32_t Tag(uint32_t field, int wire_type) {
  return (field << 3) | static_cast<uint32_t>(wire_type);
}

inline size_t VarintSize(uint64_t value) {
  return static_cast<size_t>((64 - std::countl_zero(value | 1) + 6) / 7);
}

inline char* PutVarint(char* p, uint64_t value) {
  while (value >= 0x80) {
    *p++ = static_cast<char>(value | 0x80);
    value >>= 7;
  }
  *p++ = static_cast<char>(value);
  return p;
}

inline char* PutFixed64(char* p, uint64_t value) {
  std::memcpy(p, &value, sizeof(value));
  return p + sizeof(value);
}

// A message under construction, for the parts whose length must be known before they are
// written out (track events, interned data, descriptors). Keeps its capacity.
class Message {
 public:
  void Clear() { size_ = 0; }
  bool empty() const { return size_ == 0; }
  std::string_view view() const { return std::string_view(data_.data(), size_); }

  void Varint(uint32_t field, uint64_t value) {
    char* p = Reserve(20);
    p = PutVarint(p, Tag(field, pb::kVarint));
    size_ = PutVarint(p, value) - data_.data();
  }
  void Fixed64(uint32_t field, uint64_t value) {
    char* p = Reserve(18);
    p = PutVarint(p, Tag(field, pb::kFixed64));
    size_ = PutFixed64(p, value) - data_.data();
  }
  void Double(uint32_t field, double value) {
    uint64_t bits;
    std::memcpy(&bits, &value, sizeof(bits));
    Fixed64(field, bits);
  }
  void Bytes(uint32_t field, std::string_view bytes) {
    char* p = Reserve(15 + bytes.size());
    p = PutVarint(p, Tag(field, pb::kBytes));
    p = PutVarint(p, bytes.size());
    std::memcpy(p, bytes.data(), bytes.size());
    size_ = p + bytes.size() - data_.data();
  }
  void Append(std::string_view bytes) {
    char* p = Reserve(bytes.size());
    std::memcpy(p, bytes.data(), bytes.size());
    size_ += bytes.size();
  }

 private:
  char* Reserve(size_t n) {
    if (data_.size() - size_ < n) data_.resize(std::max(data_.size() * 2, size_ + n + 64));
    return data_.data() + size_;
  }
  std::string data_;
  size_t size_ = 0;
};

// The output: a fixed-size buffer flushed to the sink when the next packet would not fit.
class Output final : public io::SinkBuffer {
 public:
  explicit Output(io::ByteSink* sink) : SinkBuffer(sink, kBufferSize) {}
};

// A / 1000 rounded down, saturated to int64: picoseconds to nanoseconds. Only for extremes.
[[gnu::noinline, gnu::cold]] int64_t FloorNs(__int128 ps) {
  __int128 ns = ps >= 0 ? ps / 1000 : -((-ps + 999) / 1000);
  if (ns > std::numeric_limits<int64_t>::max()) return std::numeric_limits<int64_t>::max();
  if (ns < std::numeric_limits<int64_t>::min()) return std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(ns);
}

// line_ns + (offset_ps - shift_ps) / 1000 rounded down (the whole sum in picoseconds), in 64-bit
// arithmetic when nothing overflows (always, for real traces), else in 128 bits.
int64_t EventNs(int64_t line_ns, int64_t offset_ps, int64_t shift_ps) {
  int64_t relative_ps;
  if (!__builtin_sub_overflow(offset_ps, shift_ps, &relative_ps)) {
    int64_t whole = relative_ps / 1000;
    if (relative_ps % 1000 < 0) --whole;
    int64_t ns;
    if (!__builtin_add_overflow(line_ns, whole, &ns)) return ns;
  }
  return FloorNs(static_cast<__int128>(line_ns) * 1000 + offset_ps - shift_ps);
}

struct StatEntry {
  std::string name;
  uint64_t iid = 0;
  uint32_t generation = 0;  // the line whose interned data last carried the name
  bool internal = false;    // starts with '_'
  bool producer = false;    // "_p"
  bool consumer = false;    // "_c"
  bool value_stat = false;  // "value", for counters
  bool flow = false;        // "flow": upstream's XFlow encoding
  bool valid = false;
};

struct EventEntry {
  std::string name;  // display_name, else name
  uint64_t iid = 0;
  uint32_t generation = 0;
  // The metadata's own stats (and its long name) as encoded debug annotations, and the stats
  // whose names they use.
  std::string annotations;
  std::vector<StatEntry*> annotation_names;
  bool long_name = false;
  std::string full_name;
  bool valid = false;
};

// Where a line's slices go: its track (lane 0) and child tracks for events that overlap
// without nesting, each with the end times of its open slices (innermost last).
struct Lane {
  uint64_t uuid = 0;
  std::vector<int64_t> open_ends;
};

// An event of a line whose events are out of order, for sorting.
struct IndexedEvent {
  int64_t offset_ps;
  int64_t duration_ps;
  std::string_view bytes;
};

}  // namespace

class PerfettoTraceWriter::Impl {
 public:
  explicit Impl(io::ByteSink* sink) : out_(sink) {}

  absl::StatusOr<PerfettoTraceStats> Add(std::string_view serialized, std::string_view source,
                                         const PerfettoTraceOptions& options,
                                         const std::function<void(size_t)>& release) {
    absl::StatusOr<XSpaceStream> stream = XSpaceStream::Open(serialized, source, release);
    if (!stream.ok()) return stream.status();
    options_ = &options;
    flow_mask_ = options.flow_id_salt * kFlowSaltMultiplier;
    stats_ = PerfettoTraceStats();
    const uint64_t bytes_before = out_.bytes();
    TracePidAllocator pids;
    while (true) {
      absl::StatusOr<bool> plane = stream->NextPlane();
      if (!plane.ok()) return plane.status();
      if (!*plane) break;
      const std::optional<int> pid = pids.Next(stream->plane(), stream->plane_has_events());
      if (!pid.has_value()) continue;
      BeginPlane(stream->plane(), *pid + options.pid_base);
      while (true) {
        absl::StatusOr<bool> line = stream->NextLine();
        if (!line.ok()) return line.status();
        if (!*line) break;
        CLUSTERPROF_RETURN_IF_ERROR(WriteLine(*stream));
      }
      if (!out_.status().ok()) return out_.status();
    }
    if (!out_.status().ok()) return out_.status();
    stats_.bytes = out_.bytes() - bytes_before;
    total_.complete_events += stats_.complete_events;
    total_.counter_events += stats_.counter_events;
    total_.flow_events += stats_.flow_events;
    total_.skipped_events += stats_.skipped_events;
    total_.tracks += stats_.tracks;
    return stats_;
  }

  absl::Status Flush() {
    out_.Flush();
    total_.bytes = out_.bytes();
    return out_.status();
  }

  const PerfettoTraceStats& total() {
    total_.bytes = out_.bytes();
    return total_;
  }

 private:
  // The plane's tables, and its process track.
  void BeginPlane(const XPlane& plane, int pid) {
    pid_ = pid;
    host_plane_ = StartsWith(plane.name(), "/host:");
    stat_table_ = MetadataTable<StatEntry>();
    event_table_ = MetadataTable<EventEntry>();
    {
      const auto& metadata = plane.stat_metadata();
      int64_t max_id = 0;
      for (const auto& [id, md] : metadata) max_id = std::max(max_id, id);
      const bool dense = MetadataTable<StatEntry>::Dense(max_id, metadata.size());
      for (const auto& [id, md] : metadata) {
        StatEntry& entry = stat_table_.Insert(id, dense);
        entry.name = md.name();
        entry.iid = StatIid(id);
        entry.internal = StartsWith(md.name(), "_");
        entry.producer = md.name() == kProducerId;
        entry.consumer = md.name() == kConsumerId;
        entry.value_stat = md.name() == kCounterValue;
        entry.flow = md.name() == kFlow;
      }
    }
    {
      const auto& metadata = plane.event_metadata();
      int64_t max_id = 0;
      for (const auto& [id, md] : metadata) max_id = std::max(max_id, id);
      const bool dense = MetadataTable<EventEntry>::Dense(max_id, metadata.size());
      Message annotations;
      for (const auto& [id, md] : metadata) {
        EventEntry& entry = event_table_.Insert(id, dense);
        entry.name = md.display_name().empty() ? md.name() : md.display_name();
        entry.iid = EventIid(id);
        annotations.Clear();
        if (!md.display_name().empty() && md.display_name() != md.name()) {
          entry.long_name = true;
          entry.full_name = md.name();
          AppendStringAnnotation(kLongNameIid, md.name(), &annotations);
        }
        for (const XStat& stat : md.stats()) {
          StatView view;
          view.metadata_id = stat.metadata_id();
          view.value_case = stat.value_case();
          switch (stat.value_case()) {
            case XStat::kDoubleValue:
              view.double_value = stat.double_value();
              break;
            case XStat::kUint64Value:
              view.uint64_value = stat.uint64_value();
              break;
            case XStat::kInt64Value:
              view.int64_value = stat.int64_value();
              break;
            case XStat::kRefValue:
              view.ref_value = stat.ref_value();
              break;
            case XStat::kStrValue:
              view.str_value = stat.str_value();
              break;
            default:
              break;
          }
          if (StatEntry* name = AppendStatAnnotation(view, &annotations)) {
            entry.annotation_names.push_back(name);
          }
        }
        entry.annotations = std::string(annotations.view());
      }
    }
    process_uuid_ = NewTrackUuid();
    track_.Clear();
    track_.Varint(pb::kTrackUuid, process_uuid_);
    Message& process = scratch_;
    process.Clear();
    process.Varint(pb::kProcessPid, static_cast<uint64_t>(static_cast<int64_t>(pid_)));
    process.Bytes(pb::kProcessName, options_->process_name_prefix + plane.name());
    track_.Bytes(pb::kTrackProcess, process.view());
    WriteDescriptor();
  }

  absl::Status WriteLine(const XSpaceStream& stream) {
    const auto& line = stream.line();
    line_ns_ = line.timestamp_ns();
    counters_ = IsCounterLine(line.name());
    line_name_ = line.display_name().empty() ? line.name() : line.display_name();
    line_tid_ = line.display_id() != 0 ? line.display_id() : line.id();
    line_started_ = false;
    lanes_.clear();
    counter_tracks_.clear();

    // Slices nest on a track only if they come in order of their start: check, and sort the rare
    // line that is not (holding an index of it).
    XSpaceStream::EventIterator events = stream.events();
    std::string_view bytes;
    bool sorted = true;
    int64_t previous = std::numeric_limits<int64_t>::min();
    while (events.Next(&bytes)) {
      int64_t offset_ps;
      if (!DecodeEventOffsetPs(bytes, &offset_ps)) continue;
      if (offset_ps < previous) {
        sorted = false;
        break;
      }
      previous = offset_ps;
    }
    if (sorted) {
      events = stream.events();
      while (events.Next(&bytes)) {
        if (!DecodeEvent(bytes, &event_)) return stream.CorruptAt(bytes);
        if (!WriteEvent()) return out_.status();
      }
    } else {
      std::vector<IndexedEvent> index;
      events = stream.events();
      while (events.Next(&bytes)) {
        if (!DecodeEvent(bytes, &event_)) return stream.CorruptAt(bytes);
        index.push_back({event_.offset_ps, event_.duration_ps, bytes});
      }
      std::stable_sort(index.begin(), index.end(),
                       [](const IndexedEvent& a, const IndexedEvent& b) {
                         if (a.offset_ps != b.offset_ps) return a.offset_ps < b.offset_ps;
                         return a.duration_ps > b.duration_ps;
                       });
      for (const IndexedEvent& indexed : index) {
        DecodeEvent(indexed.bytes, &event_);
        if (!WriteEvent()) return out_.status();
      }
    }
    CloseSlicesUpTo(std::numeric_limits<int64_t>::max());
    return out_.status();
  }

  bool WriteEvent() {
    if (event_.aggregated) {
      ++stats_.skipped_events;
      return true;
    }
    return counters_ ? WriteCounter() : WriteSlice();
  }

  // The line's track and its sequence, at its first event.
  void StartLine(int64_t first_ns) {
    line_started_ = true;
    // Counter samples go to one track per counter, under the process: the line has none.
    const uint64_t uuid = counters_ ? 0 : NewTrackUuid();
    if (uuid != 0) {
      track_.Clear();
      track_.Varint(pb::kTrackUuid, uuid);
      track_.Varint(pb::kTrackParentUuid, process_uuid_);
      if (host_plane_) {
        scratch_.Clear();
        scratch_.Varint(pb::kThreadPid, static_cast<uint64_t>(static_cast<int64_t>(pid_)));
        scratch_.Varint(pb::kThreadTid, static_cast<uint64_t>(line_tid_));
        if (!line_name_.empty()) scratch_.Bytes(pb::kThreadName, line_name_);
        track_.Bytes(pb::kTrackThread, scratch_.view());
      } else {
        track_.Bytes(pb::kTrackName, LineTrackName());
      }
      WriteDescriptor();
      lanes_.push_back({uuid, {}});
    }

    // Clear the sequence's state: the defaults (the incremental clock, this line's track), the
    // clock's base, and (implicitly) the interned names, which each line carries again.
    ++generation_;
    last_ns_ = first_ns;
    Message& defaults = scratch_;
    defaults.Clear();
    defaults.Varint(pb::kTimestampClockId, pb::kIncrementalClock);
    if (uuid != 0) {
      track_.Clear();
      track_.Varint(pb::kDefaultTrackUuid, uuid);
      defaults.Bytes(pb::kTrackEventDefaults, track_.view());
    }
    Message& clocks = interned_;
    clocks.Clear();
    track_.Clear();
    track_.Varint(pb::kClockId, pb::kRealtimeClock);
    track_.Varint(pb::kClockTimestamp, static_cast<uint64_t>(first_ns));
    clocks.Bytes(pb::kClocks, track_.view());
    track_.Clear();
    track_.Varint(pb::kClockId, pb::kIncrementalClock);
    track_.Varint(pb::kClockTimestamp, static_cast<uint64_t>(first_ns));
    track_.Varint(pb::kClockIsIncremental, 1);
    clocks.Bytes(pb::kClocks, track_.view());
    if (!primary_clock_written_) {
      // The XSpace's clock is the trace's: timestamps stay the epoch nanoseconds they were.
      clocks.Varint(pb::kPrimaryTraceClock, pb::kRealtimeClock);
      primary_clock_written_ = true;
    }
    track_.Clear();
    track_.Varint(pb::kTrustedPacketSequenceId, kSequenceId);
    track_.Varint(pb::kSequenceFlags,
                  pb::kSeqIncrementalStateCleared | pb::kSeqNeedsIncrementalState);
    track_.Bytes(pb::kTracePacketDefaults, defaults.view());
    track_.Bytes(pb::kClockSnapshot, clocks.view());
    WritePacket(track_.view());
  }

  std::string LineTrackName() const {
    if (!line_name_.empty()) return line_name_;
    return StrCat("Line ", line_tid_);
  }

  // Ends the open slices of every lane that end at or before `ns`, earliest first.
  void CloseSlicesUpTo(int64_t ns) {
    while (true) {
      Lane* earliest = nullptr;
      for (Lane& lane : lanes_) {
        if (!lane.open_ends.empty() && lane.open_ends.back() <= ns &&
            (earliest == nullptr || lane.open_ends.back() < earliest->open_ends.back())) {
          earliest = &lane;
        }
      }
      if (earliest == nullptr) return;
      const int64_t end = earliest->open_ends.back();
      earliest->open_ends.pop_back();
      event_message_.Clear();
      event_message_.Varint(pb::kType, pb::kTypeSliceEnd);
      if (earliest != &lanes_.front()) event_message_.Varint(pb::kEventTrackUuid, earliest->uuid);
      WriteEventPacket(end, /*interned=*/false);
    }
  }

  bool WriteSlice() {
    const __int128 start_ps =
        static_cast<__int128>(line_ns_) * 1000 + event_.offset_ps - options_->shift_ps;
    const int64_t start_ns = FloorNs(start_ps);
    const int64_t end_ns = FloorNs(start_ps + std::max<int64_t>(event_.duration_ps, 0));
    if (!line_started_) StartLine(start_ns);
    CloseSlicesUpTo(start_ns);
    // The first lane where the slice nests in the innermost open one, or starts a new stack.
    size_t lane = 0;
    while (lane < lanes_.size() && !lanes_[lane].open_ends.empty() &&
           lanes_[lane].open_ends.back() < end_ns) {
      ++lane;
    }
    if (lane == lanes_.size()) {
      const uint64_t uuid = NewTrackUuid();
      track_.Clear();
      track_.Varint(pb::kTrackUuid, uuid);
      track_.Varint(pb::kTrackParentUuid, lanes_.front().uuid);
      track_.Bytes(pb::kTrackName, LineTrackName());
      WriteDescriptor();
      lanes_.push_back({uuid, {}});
    }

    interned_.Clear();
    event_message_.Clear();
    event_message_.Varint(pb::kType, pb::kTypeSliceBegin);
    if (lane != 0) event_message_.Varint(pb::kEventTrackUuid, lanes_[lane].uuid);
    EventEntry* entry = event_table_.Find(event_.metadata_id);
    if (entry != nullptr) {
      event_message_.Varint(pb::kNameIid, entry->iid);
      if (entry->generation != generation_) {
        entry->generation = generation_;
        scratch_.Clear();
        scratch_.Varint(pb::kIid, entry->iid);
        scratch_.Bytes(pb::kInternedName, entry->name);
        interned_.Bytes(pb::kEventNames, scratch_.view());
      }
      if (entry->long_name) InternAnnotationName(kLongNameIid, "long_name", &long_name_generation_);
      for (StatEntry* name : entry->annotation_names) {
        InternAnnotationName(name->iid, name->name, &name->generation);
      }
    } else {
      event_message_.Bytes(pb::kName, "");
    }

    // The flow binding, and the event's own stats as annotations (after its metadata's).
    uint64_t flow_id = 0;
    bool flow_out = false;
    bool flow_in = false;
    annotations_.Clear();
    if (entry != nullptr) annotations_.Append(entry->annotations);
    for (const StatView& stat : event_.stats) {
      StatEntry* info = stat_table_.Find(stat.metadata_id);
      if (info == nullptr) continue;
      if (info->flow && stat.value_case == XStat::kUint64Value) {
        // Direction in bits 0-1 (1 in, 2 out, 3 both), the id in bits 2-57, the category above.
        const uint64_t id = (stat.uint64_value >> 2) & ((uint64_t{1} << 56) - 1);
        if (id != 0 && (flow_id == 0 || flow_id == id)) {
          flow_id = id;
          flow_out = flow_out || (stat.uint64_value & 2) != 0;
          flow_in = flow_in || (stat.uint64_value & 1) != 0;
        }
        continue;
      }
      if (info->producer || info->consumer) {
        uint64_t id = 0;
        if (stat.value_case == XStat::kUint64Value) id = stat.uint64_value;
        if (stat.value_case == XStat::kInt64Value) id = static_cast<uint64_t>(stat.int64_value);
        if (flow_id == 0 || flow_id == id) {
          flow_id = id;
          (info->producer ? flow_out : flow_in) = true;
        }
        continue;
      }
      if (StatEntry* name = AppendStatAnnotation(stat, &annotations_)) {
        InternAnnotationName(name->iid, name->name, &name->generation);
      }
    }
    if (flow_id != 0) {
      event_message_.Fixed64(flow_out ? pb::kFlowIds : pb::kTerminatingFlowIds,
                             flow_id ^ flow_mask_);
      ++stats_.flow_events;
    }
    event_message_.Append(annotations_.view());
    WriteEventPacket(start_ns, /*interned=*/true);
    lanes_[lane].open_ends.push_back(end_ns);
    ++stats_.complete_events;
    return out_.status().ok();
  }

  bool WriteCounter() {
    EventEntry* entry = event_table_.Find(event_.metadata_id);
    // The last "value" stat, as the trace JSON takes it.
    enum { kNone, kInt, kUint, kDouble } kind = kNone;
    int64_t int_value = 0;
    uint64_t uint_value = 0;
    double double_value = 0;
    for (const StatView& stat : event_.stats) {
      StatEntry* info = stat_table_.Find(stat.metadata_id);
      if (info == nullptr || !info->value_stat) continue;
      switch (stat.value_case) {
        case XStat::kInt64Value:
          kind = kInt;
          int_value = stat.int64_value;
          break;
        case XStat::kUint64Value:
          kind = kUint;
          uint_value = stat.uint64_value;
          break;
        case XStat::kDoubleValue:
          // As in the trace JSON, a sample that is not a finite number is left out.
          kind = std::isfinite(stat.double_value) ? kDouble : kNone;
          double_value = stat.double_value;
          break;
        default:
          break;
      }
    }
    if (entry == nullptr || kind == kNone) {
      ++stats_.skipped_events;
      return true;
    }
    const int64_t ns =
        FloorNs(static_cast<__int128>(line_ns_) * 1000 + event_.offset_ps - options_->shift_ps);
    if (!line_started_) StartLine(ns);
    uint64_t& track = counter_tracks_[event_.metadata_id];
    if (track == 0) {
      track = NewTrackUuid();
      track_.Clear();
      track_.Varint(pb::kTrackUuid, track);
      track_.Varint(pb::kTrackParentUuid, process_uuid_);
      track_.Bytes(pb::kTrackName, entry->name);
      track_.Bytes(pb::kTrackCounter, "");
      WriteDescriptor();
    }
    event_message_.Clear();
    event_message_.Varint(pb::kType, pb::kTypeCounter);
    event_message_.Varint(pb::kEventTrackUuid, track);
    if (kind == kInt) {
      event_message_.Varint(pb::kCounterValue, static_cast<uint64_t>(int_value));
    } else if (kind == kUint && uint_value <= static_cast<uint64_t>(INT64_MAX)) {
      event_message_.Varint(pb::kCounterValue, uint_value);
    } else {
      event_message_.Double(pb::kDoubleCounterValue,
                            kind == kUint ? static_cast<double>(uint_value) : double_value);
    }
    WriteEventPacket(ns, /*interned=*/false);
    ++stats_.counter_events;
    return out_.status().ok();
  }

  void InternAnnotationName(uint64_t iid, std::string_view name, uint32_t* generation) {
    if (*generation == generation_) return;
    *generation = generation_;
    scratch_.Clear();
    scratch_.Varint(pb::kIid, iid);
    scratch_.Bytes(pb::kInternedName, name);
    interned_.Bytes(pb::kDebugAnnotationNames, scratch_.view());
  }

  // Appends `stat` as a debug annotation (TrackEvent field 4) unless it is internal or holds no
  // value the trace JSON would write. Returns the stat's name to intern, or null.
  StatEntry* AppendStatAnnotation(const StatView& stat, Message* out) {
    StatEntry* info = stat_table_.Find(stat.metadata_id);
    if (info == nullptr || info->internal) return nullptr;
    Message& value = value_;
    value.Clear();
    value.Varint(pb::kAnnotationNameIid, info->iid);
    switch (stat.value_case) {
      case XStat::kInt64Value:
        value.Varint(pb::kIntValue, static_cast<uint64_t>(stat.int64_value));
        break;
      case XStat::kUint64Value:
        value.Varint(pb::kUintValue, stat.uint64_value);
        break;
      case XStat::kDoubleValue:
        value.Double(pb::kDoubleValue, stat.double_value);
        break;
      case XStat::kStrValue:
        value.Bytes(pb::kStringValue, stat.str_value);
        break;
      case XStat::kRefValue: {
        StatEntry* ref = stat_table_.Find(static_cast<int64_t>(stat.ref_value));
        value.Bytes(pb::kStringValue, ref != nullptr ? std::string_view(ref->name) : "");
        break;
      }
      default:  // bytes and unset values, as in the trace JSON
        return nullptr;
    }
    out->Bytes(pb::kDebugAnnotations, value.view());
    return info;
  }

  void AppendStringAnnotation(uint64_t iid, std::string_view text, Message* out) {
    value_.Clear();
    value_.Varint(pb::kAnnotationNameIid, iid);
    value_.Bytes(pb::kStringValue, text);
    out->Bytes(pb::kDebugAnnotations, value_.view());
  }

  // A packet on the line's sequence holding event_message_ (and interned_ when `interned`), at
  // `ns`: as a delta on the incremental clock, or, should the line's times ever go back (only
  // saturated extremes can), absolute on CLOCK_REALTIME.
  void WriteEventPacket(int64_t ns, bool interned) {
    const bool absolute = ns < last_ns_;
    const uint64_t timestamp =
        absolute ? static_cast<uint64_t>(ns) : static_cast<uint64_t>(ns) - last_ns_;
    if (!absolute) last_ns_ = ns;
    const std::string_view event = event_message_.view();
    const std::string_view data = interned ? interned_.view() : std::string_view();
    size_t body = 1 + VarintSize(timestamp) + 2 + 2 + 1 + VarintSize(event.size()) + event.size();
    if (absolute) body += 2 + 1;
    if (!data.empty()) body += 1 + VarintSize(data.size()) + data.size();
    if (!out_.Reserve(body + 11)) return;
    char* p = out_.pos();
    *p++ = static_cast<char>(Tag(pb::kTracePacket, pb::kBytes));
    p = PutVarint(p, body);
    *p++ = static_cast<char>(Tag(pb::kTimestamp, pb::kVarint));
    p = PutVarint(p, timestamp);
    if (absolute) {
      p = PutVarint(p, Tag(pb::kTimestampClockId, pb::kVarint));
      *p++ = static_cast<char>(pb::kRealtimeClock);
    }
    *p++ = static_cast<char>(Tag(pb::kTrustedPacketSequenceId, pb::kVarint));
    *p++ = static_cast<char>(kSequenceId);
    *p++ = static_cast<char>(Tag(pb::kSequenceFlags, pb::kVarint));
    *p++ = static_cast<char>(pb::kSeqNeedsIncrementalState);
    if (!data.empty()) {
      *p++ = static_cast<char>(Tag(pb::kInternedData, pb::kBytes));
      p = PutVarint(p, data.size());
      std::memcpy(p, data.data(), data.size());
      p += data.size();
    }
    *p++ = static_cast<char>(Tag(pb::kTrackEvent, pb::kBytes));
    p = PutVarint(p, event.size());
    std::memcpy(p, event.data(), event.size());
    out_.Advance(p + event.size());
  }

  // A packet holding the TrackDescriptor in track_ (no sequence: it needs no state).
  void WriteDescriptor() {
    scratch_.Clear();
    scratch_.Bytes(pb::kTrackDescriptor, track_.view());
    WritePacket(scratch_.view());
    ++stats_.tracks;
  }

  void WritePacket(std::string_view body) {
    if (!out_.Reserve(body.size() + 11)) return;
    char* p = out_.pos();
    *p++ = static_cast<char>(Tag(pb::kTracePacket, pb::kBytes));
    p = PutVarint(p, body.size());
    std::memcpy(p, body.data(), body.size());
    out_.Advance(p + body.size());
  }

  uint64_t NewTrackUuid() { return next_uuid_++; }

  Output out_;
  const PerfettoTraceOptions* options_ = nullptr;
  PerfettoTraceStats stats_;
  PerfettoTraceStats total_;
  uint64_t flow_mask_ = 0;
  uint64_t next_uuid_ = 1;
  bool primary_clock_written_ = false;
  uint32_t generation_ = 0;
  uint32_t long_name_generation_ = 0;

  // The plane.
  int pid_ = 0;
  bool host_plane_ = false;
  uint64_t process_uuid_ = 0;
  MetadataTable<StatEntry> stat_table_;
  MetadataTable<EventEntry> event_table_;

  // The line.
  int64_t line_ns_ = 0;
  bool counters_ = false;
  std::string line_name_;
  int64_t line_tid_ = 0;
  bool line_started_ = false;
  int64_t last_ns_ = 0;
  std::vector<Lane> lanes_;
  absl::flat_hash_map<int64_t, uint64_t> counter_tracks_;

  // Scratch, reused.
  EventView event_;
  Message event_message_;
  Message interned_;
  Message annotations_;
  Message track_;
  Message scratch_;
  Message value_;
};

PerfettoTraceWriter::PerfettoTraceWriter(io::ByteSink* sink)
    : impl_(std::make_unique<Impl>(sink)) {}

PerfettoTraceWriter::~PerfettoTraceWriter() = default;

absl::StatusOr<PerfettoTraceStats> PerfettoTraceWriter::Add(
    std::string_view serialized, std::string_view source, const PerfettoTraceOptions& options,
    const std::function<void(size_t)>& release) {
  return impl_->Add(serialized, source, options, release);
}

absl::Status PerfettoTraceWriter::Flush() { return impl_->Flush(); }

const PerfettoTraceStats& PerfettoTraceWriter::total() const { return impl_->total(); }

absl::StatusOr<PerfettoTraceStats> WritePerfettoTraceFromSerialized(
    std::string_view serialized, std::string_view source, io::ByteSink* out,
    const PerfettoTraceOptions& options, const std::function<void(size_t)>& release) {
  PerfettoTraceWriter writer(out);
  absl::StatusOr<PerfettoTraceStats> stats = writer.Add(serialized, source, options, release);
  if (!stats.ok()) return stats.status();
  CLUSTERPROF_RETURN_IF_ERROR(writer.Flush());
  stats->bytes = writer.total().bytes;
  return stats;
}

}  // namespace clusterprof::xspace
