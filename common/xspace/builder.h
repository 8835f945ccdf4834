// Builders that fill XPlane protos the way the TSL profiler does: interned event and stat
// metadata (one XEventMetadata per distinct name), lines by id, events with typed stats.
//
// Not thread-safe: one thread builds one plane. The builders point into protos owned by the
// caller (usually an XSpace), which must outlive them.
#ifndef CLUSTERPROF_COMMON_XSPACE_BUILDER_H_
#define CLUSTERPROF_COMMON_XSPACE_BUILDER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>

#include "absl/container/flat_hash_map.h"
#include "common/base/saturating.h"
#include "common/xspace/traceme.h"
#include "tsl/profiler/protos/xplane.pb.h"

namespace clusterprof::xspace {

using ::tensorflow::profiler::XEvent;
using ::tensorflow::profiler::XEventMetadata;
using ::tensorflow::profiler::XLine;
using ::tensorflow::profiler::XPlane;
using ::tensorflow::profiler::XSpace;
using ::tensorflow::profiler::XStat;
using ::tensorflow::profiler::XStatMetadata;

// Marks a stat value that must be stored as bytes_value rather than str_value.
struct Bytes {
  std::string_view data;
};

// Adds stats to any message with `repeated XStat stats` (planes, events, event metadata).
// Integral types go to int64_value/uint64_value by signedness (bool as int64), floating point to
// double_value, text to str_value, Bytes to bytes_value, and an XStatMetadata to ref_value.
template <typename Owner>
class XStatsBuilder {
 public:
  XStatsBuilder(Owner* owner, class XPlaneBuilder* plane) : owner_(owner), plane_(plane) {}

  template <typename T>
  void AddStatValue(const XStatMetadata& metadata, const T& value) {
    SetValue(AddStat(metadata), value);
  }
  // Types `value` as TraceMe metadata is typed: int64, then uint64, then double, else an
  // interned string (ref_value).
  void ParseAndAddStatValue(const XStatMetadata& metadata, std::string_view value);

 protected:
  XStat* AddStat(const XStatMetadata& metadata) {
    XStat* stat = owner_->add_stats();
    stat->set_metadata_id(metadata.id());
    return stat;
  }

  template <typename T>
  static void SetValue(XStat* stat, const T& value) {
    if constexpr (std::is_same_v<T, bool>) {
      stat->set_int64_value(value ? 1 : 0);
    } else if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
      stat->set_int64_value(static_cast<int64_t>(value));
    } else if constexpr (std::is_integral_v<T>) {
      stat->set_uint64_value(static_cast<uint64_t>(value));
    } else if constexpr (std::is_floating_point_v<T>) {
      stat->set_double_value(static_cast<double>(value));
    } else if constexpr (std::is_same_v<T, Bytes>) {
      stat->set_bytes_value(value.data.data(), value.data.size());
    } else if constexpr (std::is_same_v<T, XStatMetadata>) {
      stat->set_ref_value(static_cast<uint64_t>(value.id()));
    } else {
      const std::string_view text(value);
      stat->set_str_value(text.data(), text.size());
    }
  }

  Owner* owner_;
  XPlaneBuilder* plane_;
};

// An event on a line. Timestamps are absolute (ns since the Unix epoch) at this API and stored
// as offsets from the line's timestamp_ns.
class XEventBuilder : public XStatsBuilder<XEvent> {
 public:
  XEventBuilder(const XLine* line, XPlaneBuilder* plane, XEvent* event)
      : XStatsBuilder<XEvent>(event, plane), line_(line) {}

  int64_t OffsetPs() const { return owner_->offset_ps(); }
  int64_t TimestampPs() const { return line_->timestamp_ns() * 1000 + owner_->offset_ps(); }
  void SetOffsetPs(int64_t offset_ps) { owner_->set_offset_ps(offset_ps); }
  // The ns setters saturate: the times of a hostile or broken producer (a workload's ring) may be
  // anything, and signed overflow is undefined behavior.
  void SetTimestampNs(int64_t timestamp_ns) {
    owner_->set_offset_ps(SaturatingMul(SaturatingSub(timestamp_ns, line_->timestamp_ns()), 1000));
  }
  void SetTimestampPs(int64_t timestamp_ps) {
    owner_->set_offset_ps(timestamp_ps - line_->timestamp_ns() * 1000);
  }
  void SetNumOccurrences(int64_t count) { owner_->set_num_occurrences(count); }
  void SetDurationPs(int64_t duration_ps) { owner_->set_duration_ps(duration_ps); }
  void SetDurationNs(int64_t duration_ns) {
    owner_->set_duration_ps(SaturatingMul(duration_ns, 1000));
  }
  // Relative to the line's timestamp: end_ns * 1000 itself overflows for instants after 1970 + 106
  // days.
  void SetEndTimestampNs(int64_t end_ns) {
    owner_->set_duration_ps(SaturatingSub(
        SaturatingMul(SaturatingSub(end_ns, line_->timestamp_ns()), 1000), owner_->offset_ps()));
  }
  XEvent* proto() { return owner_; }

 private:
  const XLine* line_;
};

// A line (thread, stream). Its timestamp_ns is the origin of its events' offsets; set it before
// adding events (XPlaneBuilder::GetOrCreateLine leaves it 0, which works for any event).
class XLineBuilder {
 public:
  XLineBuilder(XLine* line, XPlaneBuilder* plane) : line_(line), plane_(plane) {}

  int64_t Id() const { return line_->id(); }
  void SetName(std::string_view name) { line_->set_name(name.data(), name.size()); }
  void SetNameIfEmpty(std::string_view name) {
    if (line_->name().empty()) SetName(name);
  }
  void SetDisplayName(std::string_view name) { line_->set_display_name(name.data(), name.size()); }
  void SetDisplayId(int64_t id) { line_->set_display_id(id); }
  void SetTimestampNs(int64_t timestamp_ns) { line_->set_timestamp_ns(timestamp_ns); }
  void SetDurationPs(int64_t duration_ps) { line_->set_duration_ps(duration_ps); }
  void ReserveEvents(int count) { line_->mutable_events()->Reserve(count); }

  XEventBuilder AddEvent(const XEventMetadata& metadata);
  XLine* proto() { return line_; }

 private:
  XLine* line_;
  XPlaneBuilder* plane_;
};

// A plane: owns the interning tables for its metadata. Works on a fresh plane or one that
// already has metadata and lines (it indexes what is there).
class XPlaneBuilder : public XStatsBuilder<XPlane> {
 public:
  explicit XPlaneBuilder(XPlane* plane);
  XPlaneBuilder(const XPlaneBuilder&) = delete;
  XPlaneBuilder& operator=(const XPlaneBuilder&) = delete;

  int64_t Id() const { return owner_->id(); }
  void SetId(int64_t id) { owner_->set_id(id); }
  std::string_view Name() const { return owner_->name(); }
  void SetName(std::string_view name) { owner_->set_name(name.data(), name.size()); }

  // Interned by name; ids start at 1 (0 means "no metadata" to readers).
  XEventMetadata* GetOrCreateEventMetadata(std::string_view name);
  XStatMetadata* GetOrCreateStatMetadata(std::string_view name);
  // A new, un-interned event metadata (for events whose name is set later).
  XEventMetadata* CreateEventMetadata();

  // The line with `line_id`, created on first use.
  XLineBuilder GetOrCreateLine(int64_t line_id);

  XPlane* proto() { return owner_; }

 private:
  int64_t last_event_metadata_id_ = 0;
  int64_t last_stat_metadata_id_ = 0;
  absl::flat_hash_map<std::string, XEventMetadata*> event_metadata_by_name_;
  absl::flat_hash_map<std::string, XStatMetadata*> stat_metadata_by_name_;
  absl::flat_hash_map<int64_t, XLine*> lines_by_id_;
};

template <typename Owner>
void XStatsBuilder<Owner>::ParseAndAddStatValue(const XStatMetadata& metadata,
                                                std::string_view value) {
  const traceme::Value typed = traceme::ParseValue(value);
  if (const auto* text = std::get_if<std::string_view>(&typed)) {
    AddStatValue(metadata, *plane_->GetOrCreateStatMetadata(*text));
  } else {
    std::visit([&](const auto& v) { AddStatValue(metadata, v); }, typed);
  }
}

// Returns the plane named `name`, or nullptr.
const XPlane* FindPlaneWithName(const XSpace& space, std::string_view name);
XPlane* FindMutablePlaneWithName(XSpace* space, std::string_view name);
// Returns the plane named `name`, adding it (with the next free id) when absent.
XPlane* FindOrAddMutablePlaneWithName(XSpace* space, std::string_view name);

// True when no line of any plane has an event (ProfileResponse.empty_trace).
bool IsEmpty(const XSpace& space);
// Number of events in all lines of all planes.
int64_t CountEvents(const XSpace& space);

// Sorts every line's events by start, longer first on ties, so nested events follow their parent.
void SortXSpace(XSpace* space);

}  // namespace clusterprof::xspace

#endif  // CLUSTERPROF_COMMON_XSPACE_BUILDER_H_
