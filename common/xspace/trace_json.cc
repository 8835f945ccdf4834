#include "common/xspace/trace_json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "common/base/json_escape.h"
#include "common/base/status.h"
#include "common/base/strings.h"
#include "common/xspace/schema.h"
#include "common/xspace/xspace_errors.h"

namespace clusterprof::xspace {
namespace {

using ::tensorflow::profiler::XEvent;
using ::tensorflow::profiler::XEventMetadata;
using ::tensorflow::profiler::XLine;
using ::tensorflow::profiler::XPlane;
using ::tensorflow::profiler::XSpace;
using ::tensorflow::profiler::XStat;
using ::tensorflow::profiler::XStatMetadata;

constexpr size_t kBufferSize = 1 << 20;
// Room for an event's fixed text: braces, keys, pid, tid, ts, dur, flow binding.
constexpr size_t kEventOverhead = 192;

// A fixed-size output buffer flushed to the sink when the next write would not fit. Writes go
// straight into reserved space with memcpy; this is the hot path of the converter.
class Output {
 public:
  explicit Output(io::ByteSink* sink) : sink_(sink), buffer_(kBufferSize, '\0') {
    pos_ = buffer_.data();
    end_ = pos_ + buffer_.size();
  }

  // Makes room for `n` bytes, so the Put calls that follow need no checks. Returns false once the
  // sink has failed (the writes then land in the buffer and are discarded).
  bool Reserve(size_t n) {
    if (static_cast<size_t>(end_ - pos_) >= n) return status_.ok();
    Flush();
    if (n > buffer_.size()) {
      buffer_.assign(n, '\0');
      pos_ = buffer_.data();
      end_ = pos_ + buffer_.size();
    }
    return status_.ok();
  }

  void Put(std::string_view s) {
    std::memcpy(pos_, s.data(), s.size());
    pos_ += s.size();
  }
  void Put(char c) { *pos_++ = c; }
  template <typename Int>
  void PutInt(Int value) {
    pos_ = std::to_chars(pos_, end_, value).ptr;
  }

  // Writes whole_micros.frac_ps (frac_ps in [0, 999999] picoseconds) with up to six decimals,
  // exactly.
  void PutMicrosFromPicos(int64_t whole_micros, int64_t frac_ps) {
    PutInt(whole_micros);
    if (frac_ps == 0) return;
    char digits[6];
    for (int i = 5; i >= 0; --i) {
      digits[i] = static_cast<char>('0' + frac_ps % 10);
      frac_ps /= 10;
    }
    int len = 6;
    while (digits[len - 1] == '0') --len;
    *pos_++ = '.';
    std::memcpy(pos_, digits, len);
    pos_ += len;
  }

  bool Flush() {
    if (!status_.ok()) return false;
    const size_t n = pos_ - buffer_.data();
    bytes_ += n;
    pos_ = buffer_.data();
    if (n > 0) status_ = sink_->Append(std::string_view(buffer_.data(), n));
    return status_.ok();
  }

  const absl::Status& status() const { return status_; }
  uint64_t bytes() const { return bytes_ + (pos_ - buffer_.data()); }

 private:
  io::ByteSink* sink_;
  std::string buffer_;
  char* pos_;
  char* end_;
  absl::Status status_;
  uint64_t bytes_ = 0;
};

// Writes a timestamp given as line.timestamp_ns + offset_ps, exactly, for any int64 inputs
// (the sum is computed in 128 bits; epoch-scale picoseconds do not fit in 64).
void PutTimestamp(Output& out, int64_t line_ns, int64_t offset_ps, int64_t shift_ps = 0) {
  __int128 ps = static_cast<__int128>(line_ns) * 1000 + offset_ps - shift_ps;
  if (ps < 0) {
    out.Put('-');
    ps = -ps;
  }
  out.PutMicrosFromPicos(static_cast<int64_t>(ps / 1'000'000),
                         static_cast<int64_t>(ps % 1'000'000));
}

void PutDuration(Output& out, int64_t duration_ps) {
  if (duration_ps <= 0) {
    out.Put('0');
    return;
  }
  out.PutMicrosFromPicos(duration_ps / 1'000'000, duration_ps % 1'000'000);
}

// Per-plane lookup tables, built once so the event loop does no hashing or escaping of names.
struct StatInfo {
  std::string key_json;     // "\"name\":" escaped
  std::string name_json;    // "\"name\"" escaped, for ref values
  bool internal = false;    // name starts with '_'
  bool producer = false;    // "_p"
  bool consumer = false;    // "_c"
  bool value_stat = false;  // "value", for counters
  bool flow = false;        // "flow": upstream's XFlow encoding
};

struct EventInfo {
  std::string name_json;  // ,"name":"..."
  std::string args_json;  // "k":"v",... from the metadata's own stats (no braces)
  bool valid = false;
};

template <typename Info>
class IdTable {
 public:
  Info* Find(int64_t id) {
    if (id >= 0 && static_cast<size_t>(id) < dense_.size()) {
      return dense_[id].valid ? &dense_[id] : nullptr;
    }
    auto it = sparse_.find(id);
    return it == sparse_.end() ? nullptr : &it->second;
  }
  Info& Insert(int64_t id, bool dense) {
    if (dense && id >= 0) {
      if (static_cast<size_t>(id) >= dense_.size()) dense_.resize(id + 1);
      dense_[id].valid = true;
      return dense_[id];
    }
    Info& info = sparse_[id];
    info.valid = true;
    return info;
  }

 private:
  std::vector<Info> dense_;
  absl::flat_hash_map<int64_t, Info> sparse_;
};

struct StatInfoEntry : StatInfo {
  bool valid = false;
};

std::string QuotedJson(std::string_view text) {
  std::string out;
  out.push_back('"');
  AppendJsonEscaped(text, &out);
  out.push_back('"');
  return out;
}

class PlaneWriter {
 public:
  PlaneWriter(const XPlane& plane, int pid, const TraceJsonOptions& options, Output& out,
              TraceJsonStats& stats)
      : plane_(plane), pid_(pid + options.pid_base), options_(options), out_(out), stats_(stats) {
    char buf[32];
    pid_text_.assign(buf, std::to_chars(buf, buf + sizeof(buf), pid_).ptr);
    BuildStatTable();
    BuildEventTable();
  }

  // Writes the whole plane from memory.
  bool Write() {
    WriteProcessMetadata();
    for (const XLine& line : plane_.lines()) {
      const LineContext context = BeginLine(line);
      for (const XEvent& event : line.events()) {
        if (!WriteEvent(context, event)) return false;
      }
    }
    return out_.status().ok();
  }

  // What the event loop needs of a line; built once per line.
  struct LineContext {
    std::string prefix;  // {"ph":"X","pid":P,"tid":T,"ts":   or   {"ph":"C","pid":P,"ts":
    int64_t timestamp_ns = 0;
    bool counters = false;
  };

  void WriteProcessMetadata() {
    WriteMetadataEvent("process_name",
                       "\"name\":" + QuotedJson(options_.process_name_prefix + plane_.name()),
                       nullptr);
    WriteMetadataEvent("process_sort_index", "\"sort_index\":" + pid_text_, nullptr);
  }

  // Writes the thread metadata of `line` (its fields other than events).
  LineContext BeginLine(const XLine& line) {
    LineContext context;
    context.timestamp_ns = line.timestamp_ns();
    // Ours, and upstream XLA's counter line.
    if (IsCounterLine(line.name())) {
      context.counters = true;
      context.prefix = "{\"ph\":\"C\",\"pid\":" + pid_text_ + ",\"ts\":";
      return context;
    }
    const int64_t tid = line.display_id() != 0 ? line.display_id() : line.id();
    char buf[32];
    const std::string tid_text(buf, std::to_chars(buf, buf + sizeof(buf), tid).ptr);
    const std::string& line_name = line.display_name().empty() ? line.name() : line.display_name();
    if (!line_name.empty()) {
      WriteMetadataEvent("thread_name", "\"name\":" + QuotedJson(line_name), &tid_text);
    }
    WriteMetadataEvent("thread_sort_index", "\"sort_index\":" + tid_text, &tid_text);
    context.prefix = "{\"ph\":\"X\",\"pid\":" + pid_text_ + ",\"tid\":" + tid_text + ",\"ts\":";
    return context;
  }

  bool WriteEvent(const LineContext& context, const XEvent& event) {
    if (event.data_case() == XEvent::kNumOccurrences) {
      ++stats_.skipped_events;
      return true;
    }
    return context.counters ? WriteCounter(context, event) : WriteComplete(context, event);
  }

 private:
  void BuildStatTable() {
    const auto& metadata = plane_.stat_metadata();
    int64_t max_id = 0;
    for (const auto& [id, md] : metadata) max_id = std::max(max_id, id);
    const bool dense = max_id < static_cast<int64_t>(metadata.size()) * 4 + 1024;
    for (const auto& [id, md] : metadata) {
      StatInfoEntry& info = stat_table_.Insert(id, dense);
      info.name_json = QuotedJson(md.name());
      info.key_json = info.name_json + ":";
      info.internal = StartsWith(md.name(), "_");
      info.producer = md.name() == kProducerId;
      info.consumer = md.name() == kConsumerId;
      info.value_stat = md.name() == kCounterValue;
      info.flow = md.name() == kFlow;
    }
  }

  void BuildEventTable() {
    const auto& metadata = plane_.event_metadata();
    int64_t max_id = 0;
    for (const auto& [id, md] : metadata) max_id = std::max(max_id, id);
    const bool dense = max_id < static_cast<int64_t>(metadata.size()) * 4 + 1024;
    for (const auto& [id, md] : metadata) {
      EventInfo& info = event_table_.Insert(id, dense);
      const std::string& display = md.display_name().empty() ? md.name() : md.display_name();
      info.name_json = ",\"name\":" + QuotedJson(display);
      std::string args;
      if (!md.display_name().empty() && md.display_name() != md.name()) {
        args = "\"long_name\":" + QuotedJson(md.name());
      }
      for (const XStat& stat : md.stats()) AppendStatArg(stat, &args);
      info.args_json = std::move(args);
    }
  }

  // Appends "key":"value" for a stat to `args` (with a leading ',' when not first). Internal and
  // bytes stats are skipped.
  void AppendStatArg(const XStat& stat, std::string* args) {
    StatInfoEntry* info = stat_table_.Find(stat.metadata_id());
    if (info == nullptr || info->internal) return;
    if (stat.value_case() == XStat::kBytesValue || stat.value_case() == XStat::VALUE_NOT_SET) {
      return;
    }
    if (!args->empty()) args->push_back(',');
    args->append(info->key_json);
    AppendStatValueJson(stat, args);
  }

  void AppendStatValueJson(const XStat& stat, std::string* out) {
    char buf[32];
    switch (stat.value_case()) {
      case XStat::kInt64Value:
        out->push_back('"');
        out->append(buf, std::to_chars(buf, buf + sizeof(buf), stat.int64_value()).ptr);
        out->push_back('"');
        break;
      case XStat::kUint64Value:
        out->push_back('"');
        out->append(buf, std::to_chars(buf, buf + sizeof(buf), stat.uint64_value()).ptr);
        out->push_back('"');
        break;
      case XStat::kDoubleValue:
        out->push_back('"');
        AppendJsonDouble(stat.double_value(), out);
        out->push_back('"');
        break;
      case XStat::kStrValue:
        out->push_back('"');
        AppendJsonEscaped(stat.str_value(), out);
        out->push_back('"');
        break;
      case XStat::kRefValue: {
        StatInfoEntry* ref = stat_table_.Find(static_cast<int64_t>(stat.ref_value()));
        if (ref != nullptr) {
          out->append(ref->name_json);
        } else {
          out->append("\"\"");
        }
        break;
      }
      default:
        out->append("\"\"");
    }
  }

  void WriteMetadataEvent(std::string_view name, std::string_view args, const std::string* tid) {
    out_.Reserve(96 + args.size());
    out_.Put("{\"ph\":\"M\",\"pid\":");
    out_.Put(pid_text_);
    if (tid != nullptr) {
      out_.Put(",\"tid\":");
      out_.Put(*tid);
    }
    out_.Put(",\"name\":\"");
    out_.Put(name);
    out_.Put("\",\"args\":{");
    out_.Put(args);
    out_.Put("}},");
    if (options_.newline_per_event) out_.Put('\n');
  }

  bool WriteComplete(const LineContext& context, const XEvent& event) {
    const EventInfo* info = event_table_.Find(event.metadata_id());
    const std::string_view name_json =
        info != nullptr ? std::string_view(info->name_json) : std::string_view(",\"name\":\"\"");
    // Args and the flow binding, from the event's own stats.
    args_.clear();
    if (info != nullptr) args_ = info->args_json;
    uint64_t flow_id = 0;
    bool flow_out = false;
    bool flow_in = false;
    std::string_view flow_category;
    for (const XStat& stat : event.stats()) {
      StatInfoEntry* stat_info = stat_table_.Find(stat.metadata_id());
      if (stat_info == nullptr) continue;
      if (stat_info->flow && stat.value_case() == XStat::kUint64Value) {
        // Direction in bits 0-1 (1 in, 2 out, 3 both), the id in bits 2-57, the category above.
        const uint64_t value = stat.uint64_value();
        const uint64_t id = (value >> 2) & ((uint64_t{1} << 56) - 1);
        if (id != 0 && (flow_id == 0 || flow_id == id)) {
          flow_id = id;
          flow_out = flow_out || (value & 2) != 0;
          flow_in = flow_in || (value & 1) != 0;
          if ((value >> 58) == kFlowCategoryGpuLaunch) flow_category = ",\"cat\":\"gpu_launch\"";
        }
        continue;
      }
      if (stat_info->producer || stat_info->consumer) {
        uint64_t id = 0;
        if (stat.value_case() == XStat::kUint64Value) id = stat.uint64_value();
        if (stat.value_case() == XStat::kInt64Value) id = static_cast<uint64_t>(stat.int64_value());
        if (flow_id == 0 || flow_id == id) {
          flow_id = id;
          (stat_info->producer ? flow_out : flow_in) = true;
        }
        continue;
      }
      AppendStatArg(stat, &args_);
    }

    if (!out_.Reserve(context.prefix.size() + name_json.size() + args_.size() + kEventOverhead)) {
      return false;
    }
    out_.Put(context.prefix);
    PutTimestamp(out_, context.timestamp_ns, event.offset_ps(), options_.shift_ps);
    out_.Put(",\"dur\":");
    PutDuration(out_, event.duration_ps());
    out_.Put(name_json);
    if (flow_id != 0) {
      out_.Put(",\"bind_id\":");
      out_.PutInt(flow_id);
      if (!flow_category.empty()) out_.Put(flow_category);
      if (flow_out) out_.Put(",\"flow_out\":true");
      if (flow_in) out_.Put(",\"flow_in\":true");
      ++stats_.flow_events;
    }
    if (!args_.empty()) {
      out_.Put(",\"args\":{");
      out_.Put(args_);
      out_.Put('}');
    }
    out_.Put(options_.newline_per_event ? std::string_view("},\n") : std::string_view("},"));
    ++stats_.complete_events;
    return true;
  }

  bool WriteCounter(const LineContext& context, const XEvent& event) {
    const EventInfo* info = event_table_.Find(event.metadata_id());
    std::string& value = args_;
    value.clear();
    for (const XStat& stat : event.stats()) {
      StatInfoEntry* stat_info = stat_table_.Find(stat.metadata_id());
      if (stat_info == nullptr || !stat_info->value_stat) continue;
      char buf[32];
      switch (stat.value_case()) {
        case XStat::kInt64Value:
          value.assign(buf, std::to_chars(buf, buf + sizeof(buf), stat.int64_value()).ptr);
          break;
        case XStat::kUint64Value:
          value.assign(buf, std::to_chars(buf, buf + sizeof(buf), stat.uint64_value()).ptr);
          break;
        case XStat::kDoubleValue:
          // JSON has no NaN or infinity; such a sample is skipped.
          value.clear();
          if (std::isfinite(stat.double_value())) AppendJsonDouble(stat.double_value(), &value);
          break;
        default:
          break;
      }
    }
    if (info == nullptr || value.empty()) {
      ++stats_.skipped_events;
      return true;
    }
    if (!out_.Reserve(context.prefix.size() + info->name_json.size() + value.size() +
                      kEventOverhead)) {
      return false;
    }
    out_.Put(context.prefix);
    PutTimestamp(out_, context.timestamp_ns, event.offset_ps(), options_.shift_ps);
    out_.Put(info->name_json);
    out_.Put(",\"args\":{\"value\":");
    out_.Put(value);
    out_.Put(options_.newline_per_event ? std::string_view("}},\n") : std::string_view("}},"));
    ++stats_.counter_events;
    return true;
  }

  const XPlane& plane_;
  const int pid_;
  const TraceJsonOptions& options_;
  Output& out_;
  TraceJsonStats& stats_;
  std::string pid_text_;
  IdTable<StatInfoEntry> stat_table_;
  IdTable<EventInfo> event_table_;
  std::string args_;  // scratch, reused across events
};

bool HasEvents(const XPlane& plane) {
  for (const XLine& line : plane.lines()) {
    if (line.events_size() > 0) return true;
  }
  return false;
}

// Chooses each plane's pid (docs/trace-format.md); nullopt for planes left out.
class PidAllocator {
 public:
  std::optional<int> Next(const XPlane& plane, bool has_events) {
    const bool device = StartsWith(plane.name(), kDevicePlanePrefix);
    if (plane.name() == kHostThreadsPlaneName) {
      const int pid = host_planes_ == 0 ? kHostThreadsPid : kFirstExtraHostPid + host_planes_ - 1;
      ++host_planes_;
      return pid;
    }
    if (device && plane.id() >= 0 && plane.id() < kHostThreadsPid - kFirstDevicePid) {
      return kFirstDevicePid + static_cast<int>(plane.id());
    }
    if (has_events || device) return next_other_pid_++;
    return std::nullopt;  // Task Environment, /host:metadata and other event-less helper planes.
  }

 private:
  int host_planes_ = 0;
  int next_other_pid_ = kFirstOtherPlanePid;
};

void WriteHeader(Output& out, const TraceJsonOptions& options) {
  if (!options.write_header) return;
  out.Reserve(128);
  out.Put("{\"displayTimeUnit\":\"ns\",");
  if (options.include_metadata) out.Put("\"metadata\":{\"highres-ticks\":true},");
  out.Put("\"traceEvents\":[");
  if (options.newline_per_event) out.Put('\n');
}

absl::StatusOr<TraceJsonStats> Finish(Output& out, const TraceJsonOptions& options,
                                      TraceJsonStats& stats) {
  if (options.write_footer) {
    out.Reserve(16);
    out.Put("{}]}");
    if (options.newline_per_event) out.Put('\n');
  }
  if (!out.Flush()) return out.status();
  stats.bytes = out.bytes();
  return stats;
}

// Iterates the fields of one serialized protobuf message without parsing it.
class WireReader {
 public:
  enum WireType { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };
  struct Field {
    uint32_t number = 0;
    int wire_type = 0;
    std::string_view value;  // the payload of length-delimited fields
    std::string_view raw;    // the whole field, tag included
  };

  // `base` is the offset of `data` in the whole input, for error messages.
  WireReader(std::string_view data, size_t base) : data_(data), base_(base) {}

  // Returns false at the end of the data or at malformed data (then failed() is true).
  bool Next(Field* field) {
    if (pos_ >= data_.size() || failed_) return false;
    const size_t start = pos_;
    uint64_t tag;
    if (!ReadVarint(&tag) || (tag >> 3) == 0 || (tag >> 3) > 0x1FFFFFFF) return Fail(start);
    field->number = static_cast<uint32_t>(tag >> 3);
    field->wire_type = static_cast<int>(tag & 7);
    field->value = {};
    switch (field->wire_type) {
      case kVarint: {
        uint64_t ignored;
        if (!ReadVarint(&ignored)) return Fail(start);
        break;
      }
      case kFixed64:
        if (data_.size() - pos_ < 8) return Fail(start);
        pos_ += 8;
        break;
      case kFixed32:
        if (data_.size() - pos_ < 4) return Fail(start);
        pos_ += 4;
        break;
      case kLengthDelimited: {
        uint64_t length;
        if (!ReadVarint(&length) || length > data_.size() - pos_) return Fail(start);
        field->value = data_.substr(pos_, length);
        pos_ += length;
        break;
      }
      default:  // groups: not used by any profiler message
        return Fail(start);
    }
    field->raw = data_.substr(start, pos_ - start);
    return true;
  }

  bool failed() const { return failed_; }
  // Absolute offset where reading stopped.
  size_t offset() const { return base_ + pos_; }
  size_t base() const { return base_; }

 private:
  bool ReadVarint(uint64_t* value) {
    uint64_t result = 0;
    for (int shift = 0; shift < 70 && pos_ < data_.size(); shift += 7) {
      const uint8_t byte = static_cast<uint8_t>(data_[pos_++]);
      result |= static_cast<uint64_t>(byte & 0x7F) << shift;
      if ((byte & 0x80) == 0) {
        *value = result;
        return true;
      }
    }
    return false;
  }
  bool Fail(size_t at) {
    failed_ = true;
    pos_ = at;
    return false;
  }

  std::string_view data_;
  size_t base_;
  size_t pos_ = 0;
  bool failed_ = false;
};

absl::Status WrongType(std::string_view source, const WireReader::Field& field,
                       std::string_view message) {
  return WrongWireTypeError(source, static_cast<int>(field.number), field.wire_type, message);
}

// Whether a serialized XLine holds at least one event (field 4).
bool LineHasEvents(std::string_view line) {
  WireReader reader(line, 0);
  WireReader::Field field;
  while (reader.Next(&field)) {
    if (field.number == 4 && field.wire_type == WireReader::kLengthDelimited) return true;
  }
  return false;
}

}  // namespace

absl::Status WriteTraceJsonHeader(io::ByteSink* sink, const TraceJsonOptions& options) {
  Output out(sink);
  TraceJsonOptions header = options;
  header.write_header = true;
  WriteHeader(out, header);
  return out.Flush() ? absl::OkStatus() : out.status();
}

absl::Status WriteTraceJsonFooter(io::ByteSink* sink, const TraceJsonOptions& options) {
  Output out(sink);
  TraceJsonOptions footer = options;
  footer.write_footer = true;
  TraceJsonStats stats;
  return Finish(out, footer, stats).status();
}

absl::StatusOr<TraceJsonStats> WriteTraceJson(const XSpace& space, io::ByteSink* sink,
                                              const TraceJsonOptions& options) {
  TraceJsonStats stats;
  Output out(sink);
  WriteHeader(out, options);

  PidAllocator pids;
  for (const XPlane& plane : space.planes()) {
    const std::optional<int> pid = pids.Next(plane, HasEvents(plane));
    if (!pid.has_value()) continue;
    PlaneWriter writer(plane, *pid, options, out, stats);
    if (!writer.Write()) break;
  }

  return Finish(out, options, stats);
}

absl::StatusOr<TraceJsonStats> WriteTraceJsonFromSerialized(
    std::string_view serialized, std::string_view source, io::ByteSink* sink,
    const TraceJsonOptions& options, const std::function<void(size_t)>& release) {
  if (serialized.empty()) {
    return EmptyXSpaceError(source);
  }
  // Top level: validate, and find the planes.
  std::vector<WireReader::Field> planes;
  bool has_hostnames = false;
  bool has_unknown = false;
  {
    WireReader reader(serialized, 0);
    WireReader::Field field;
    while (reader.Next(&field)) {
      if (field.number >= 1 && field.number <= 4) {
        if (field.wire_type != WireReader::kLengthDelimited) {
          return WrongType(source, field, "XSpace");
        }
        if (field.number == 1) planes.push_back(field);
        if (field.number == 4) has_hostnames = true;
      } else {
        has_unknown = true;
      }
    }
    if (reader.failed()) return CorruptXSpaceError(source, reader.offset());
  }
  if (has_unknown && planes.empty() && !has_hostnames) {
    return OnlyUnknownFieldsError(source);
  }

  TraceJsonStats stats;
  Output out(sink);
  WriteHeader(out, options);
  PidAllocator pids;
  XPlane skeleton;
  XLine header;
  XEvent event;
  std::string buffer;
  for (const WireReader::Field& plane_field : planes) {
    const size_t plane_base = static_cast<size_t>(plane_field.value.data() - serialized.data());
    // The plane without its lines: id, name, metadata and stats, parsed as an XPlane.
    std::vector<WireReader::Field> lines;
    buffer.clear();
    bool has_events = false;
    {
      WireReader reader(plane_field.value, plane_base);
      WireReader::Field field;
      while (reader.Next(&field)) {
        if (field.number >= 1 && field.number <= 6) {
          const bool scalar = field.number == 1;
          if ((field.wire_type == WireReader::kVarint) != scalar ||
              (!scalar && field.wire_type != WireReader::kLengthDelimited)) {
            return WrongType(source, field, "XPlane");
          }
        }
        if (field.number == 3) {
          lines.push_back(field);
          has_events = has_events || LineHasEvents(field.value);
        } else {
          buffer.append(field.raw);
        }
      }
      if (reader.failed()) return CorruptXSpaceError(source, reader.offset());
    }
    skeleton.Clear();
    if (!skeleton.ParseFromString(buffer)) return CorruptXSpaceError(source, plane_base);
    const std::optional<int> pid = pids.Next(skeleton, has_events);
    if (!pid.has_value()) continue;
    PlaneWriter writer(skeleton, *pid, options, out, stats);
    writer.WriteProcessMetadata();
    for (const WireReader::Field& line_field : lines) {
      const size_t line_base = static_cast<size_t>(line_field.value.data() - serialized.data());
      // Pass 1: the line's own fields. Pass 2: its events, one at a time.
      buffer.clear();
      WireReader header_reader(line_field.value, line_base);
      WireReader::Field field;
      while (header_reader.Next(&field)) {
        if (field.number != 4) buffer.append(field.raw);
      }
      if (header_reader.failed()) return CorruptXSpaceError(source, header_reader.offset());
      header.Clear();
      if (!header.ParseFromString(buffer)) return CorruptXSpaceError(source, line_base);
      const auto context = writer.BeginLine(header);
      WireReader event_reader(line_field.value, line_base);
      while (event_reader.Next(&field)) {
        if (field.number != 4 || field.wire_type != WireReader::kLengthDelimited) continue;
        event.Clear();
        if (!event.ParseFromArray(field.value.data(), static_cast<int>(field.value.size()))) {
          return CorruptXSpaceError(source,
                                    static_cast<size_t>(field.value.data() - serialized.data()));
        }
        if (!writer.WriteEvent(context, event)) return out.status();
      }
      if (release) release(line_base + line_field.value.size());
    }
    if (!out.status().ok()) return out.status();
  }
  return Finish(out, options, stats);
}

}  // namespace clusterprof::xspace
