#include "common/xspace/trace_json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/base/json_escape.h"
#include "common/base/status.h"
#include "common/base/strings.h"
#include "common/io/sink_buffer.h"
#include "common/xspace/schema.h"
#include "common/xspace/xspace_stream.h"

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
class Output final : public io::SinkBuffer {
 public:
  explicit Output(io::ByteSink* sink) : SinkBuffer(sink, kBufferSize) {}

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
  MetadataTable<StatInfoEntry> stat_table_;
  MetadataTable<EventInfo> event_table_;
  std::string args_;  // scratch, reused across events
};

bool HasEvents(const XPlane& plane) {
  for (const XLine& line : plane.lines()) {
    if (line.events_size() > 0) return true;
  }
  return false;
}

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

  TracePidAllocator pids;
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
  absl::StatusOr<XSpaceStream> stream = XSpaceStream::Open(serialized, source, release);
  if (!stream.ok()) return stream.status();

  TraceJsonStats stats;
  Output out(sink);
  WriteHeader(out, options);
  TracePidAllocator pids;
  XEvent event;
  while (true) {
    absl::StatusOr<bool> plane = stream->NextPlane();
    if (!plane.ok()) return plane.status();
    if (!*plane) break;
    const std::optional<int> pid = pids.Next(stream->plane(), stream->plane_has_events());
    if (!pid.has_value()) continue;
    PlaneWriter writer(stream->plane(), *pid, options, out, stats);
    writer.WriteProcessMetadata();
    while (true) {
      absl::StatusOr<bool> line = stream->NextLine();
      if (!line.ok()) return line.status();
      if (!*line) break;
      const auto context = writer.BeginLine(stream->line());
      XSpaceStream::EventIterator events = stream->events();
      std::string_view bytes;
      while (events.Next(&bytes)) {
        event.Clear();
        if (!event.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
          return stream->CorruptAt(bytes);
        }
        if (!writer.WriteEvent(context, event)) return out.status();
      }
    }
    if (!out.status().ok()) return out.status();
  }
  return Finish(out, options, stats);
}

}  // namespace clusterprof::xspace
