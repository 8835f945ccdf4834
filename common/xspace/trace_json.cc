#include "common/xspace/trace_json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "common/status.h"
#include "common/strings.h"
#include "common/xspace/json_escape.h"
#include "common/xspace/schema.h"

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

  // Writes `value_ps` as microseconds with up to six decimals, exactly. `value_ps` >= 0.
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

// Writes a timestamp given as line.timestamp_ns + offset_ps, without overflowing int64 for
// epoch-scale values.
void PutTimestamp(Output& out, int64_t line_ns, int64_t offset_ps) {
  int64_t ns = line_ns + offset_ps / 1000;
  int64_t rem_ps = offset_ps % 1000;
  if (rem_ps < 0) {
    rem_ps += 1000;
    ns -= 1;
  }
  if (ns < 0) {
    // Not a real capture time; keep it readable rather than exact.
    out.PutInt(ns / 1000);
    return;
  }
  out.PutMicrosFromPicos(ns / 1000, (ns % 1000) * 1000 + rem_ps);
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
      : plane_(plane), pid_(pid), options_(options), out_(out), stats_(stats) {
    char buf[32];
    pid_text_.assign(buf, std::to_chars(buf, buf + sizeof(buf), pid).ptr);
    BuildStatTable();
    BuildEventTable();
  }

  bool Write() {
    WriteProcessMetadata();
    for (const XLine& line : plane_.lines()) {
      if (line.name() == kCounterLineName) {
        if (!WriteCounterLine(line)) return false;
      } else if (!WriteLine(line)) {
        return false;
      }
    }
    return out_.status().ok();
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

  void WriteProcessMetadata() {
    WriteMetadataEvent("process_name", "\"name\":" + QuotedJson(plane_.name()), nullptr);
    WriteMetadataEvent("process_sort_index", "\"sort_index\":" + pid_text_, nullptr);
  }

  bool WriteLine(const XLine& line) {
    const int64_t tid = line.display_id() != 0 ? line.display_id() : line.id();
    char buf[32];
    const std::string tid_text(buf, std::to_chars(buf, buf + sizeof(buf), tid).ptr);
    const std::string& line_name = line.display_name().empty() ? line.name() : line.display_name();
    if (!line_name.empty()) {
      WriteMetadataEvent("thread_name", "\"name\":" + QuotedJson(line_name), &tid_text);
    }
    WriteMetadataEvent("thread_sort_index", "\"sort_index\":" + tid_text, &tid_text);

    // {"ph":"X","pid":P,"tid":T,"ts":
    const std::string prefix =
        "{\"ph\":\"X\",\"pid\":" + pid_text_ + ",\"tid\":" + tid_text + ",\"ts\":";
    const std::string_view suffix = options_.newline_per_event ? "},\n" : "},";
    const int64_t line_ns = line.timestamp_ns();
    std::string args;
    for (const XEvent& event : line.events()) {
      if (event.data_case() == XEvent::kNumOccurrences) {
        ++stats_.skipped_events;
        continue;
      }
      const EventInfo* info = event_table_.Find(event.metadata_id());
      const std::string_view name_json =
          info != nullptr ? std::string_view(info->name_json) : std::string_view(",\"name\":\"\"");
      // Args and the flow binding, from the event's own stats.
      args.clear();
      if (info != nullptr) args = info->args_json;
      uint64_t flow_id = 0;
      bool flow_out = false;
      bool flow_in = false;
      for (const XStat& stat : event.stats()) {
        StatInfoEntry* stat_info = stat_table_.Find(stat.metadata_id());
        if (stat_info == nullptr) continue;
        if (stat_info->producer || stat_info->consumer) {
          uint64_t id = 0;
          if (stat.value_case() == XStat::kUint64Value) id = stat.uint64_value();
          if (stat.value_case() == XStat::kInt64Value)
            id = static_cast<uint64_t>(stat.int64_value());
          if (flow_id == 0 || flow_id == id) {
            flow_id = id;
            (stat_info->producer ? flow_out : flow_in) = true;
          }
          continue;
        }
        AppendStatArg(stat, &args);
      }

      if (!out_.Reserve(prefix.size() + name_json.size() + args.size() + kEventOverhead)) {
        return false;
      }
      out_.Put(prefix);
      PutTimestamp(out_, line_ns, event.offset_ps());
      out_.Put(",\"dur\":");
      PutDuration(out_, event.duration_ps());
      out_.Put(name_json);
      if (flow_id != 0) {
        out_.Put(",\"bind_id\":");
        out_.PutInt(flow_id);
        if (flow_out) out_.Put(",\"flow_out\":true");
        if (flow_in) out_.Put(",\"flow_in\":true");
        ++stats_.flow_events;
      }
      if (!args.empty()) {
        out_.Put(",\"args\":{");
        out_.Put(args);
        out_.Put('}');
      }
      out_.Put(suffix);
      ++stats_.complete_events;
    }
    return out_.status().ok();
  }

  bool WriteCounterLine(const XLine& line) {
    const std::string prefix = "{\"ph\":\"C\",\"pid\":" + pid_text_ + ",\"ts\":";
    const std::string_view suffix = options_.newline_per_event ? "}},\n" : "}},";
    std::string value;
    for (const XEvent& event : line.events()) {
      if (event.data_case() == XEvent::kNumOccurrences) {
        ++stats_.skipped_events;
        continue;
      }
      const EventInfo* info = event_table_.Find(event.metadata_id());
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
            if (std::isfinite(stat.double_value())) AppendJsonDouble(stat.double_value(), &value);
            break;
          default:
            break;
        }
      }
      if (info == nullptr || value.empty()) {
        ++stats_.skipped_events;
        continue;
      }
      if (!out_.Reserve(prefix.size() + info->name_json.size() + value.size() + kEventOverhead)) {
        return false;
      }
      out_.Put(prefix);
      PutTimestamp(out_, line.timestamp_ns(), event.offset_ps());
      out_.Put(info->name_json);
      out_.Put(",\"args\":{\"value\":");
      out_.Put(value);
      out_.Put(suffix);
      ++stats_.counter_events;
    }
    return out_.status().ok();
  }

  const XPlane& plane_;
  const int pid_;
  const TraceJsonOptions& options_;
  Output& out_;
  TraceJsonStats& stats_;
  std::string pid_text_;
  IdTable<StatInfoEntry> stat_table_;
  IdTable<EventInfo> event_table_;
};

bool HasEvents(const XPlane& plane) {
  for (const XLine& line : plane.lines()) {
    if (line.events_size() > 0) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<TraceJsonStats> WriteTraceJson(const XSpace& space, io::ByteSink* sink,
                                              const TraceJsonOptions& options) {
  TraceJsonStats stats;
  Output out(sink);
  out.Reserve(128);
  out.Put("{\"displayTimeUnit\":\"ns\",");
  if (options.include_metadata) out.Put("\"metadata\":{\"highres-ticks\":true},");
  out.Put("\"traceEvents\":[");
  if (options.newline_per_event) out.Put('\n');

  int host_planes = 0;
  int next_other_pid = kFirstOtherPlanePid;
  for (const XPlane& plane : space.planes()) {
    int pid;
    if (plane.name() == kHostThreadsPlaneName) {
      pid = host_planes == 0 ? kHostThreadsPid : kFirstExtraHostPid + host_planes - 1;
      ++host_planes;
    } else if (StartsWith(plane.name(), kDevicePlanePrefix)) {
      pid = kFirstDevicePid + static_cast<int>(plane.id());
    } else if (HasEvents(plane)) {
      pid = next_other_pid++;
    } else {
      continue;  // Task Environment, /host:metadata and other event-less helper planes.
    }
    PlaneWriter writer(plane, pid, options, out, stats);
    if (!writer.Write()) break;
  }

  out.Reserve(16);
  out.Put("{}]}");
  if (options.newline_per_event) out.Put('\n');
  if (!out.Flush()) return out.status();
  stats.bytes = out.bytes();
  return stats;
}

}  // namespace clusterprof::xspace
