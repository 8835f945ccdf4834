// Reading a serialized XSpace one plane, one line and one event at a time, straight from its
// wire format: what both trace writers (trace_json.h, trace_perfetto.h) convert from, so that a
// multi-gigabyte .xplane.pb converts in a few megabytes of memory.
#ifndef CLUSTERPROF_COMMON_XSPACE_XSPACE_STREAM_H_
#define CLUSTERPROF_COMMON_XSPACE_XSPACE_STREAM_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tsl/profiler/protos/xplane.pb.h"

namespace clusterprof::xspace {

// Iterates the fields of one serialized protobuf message without parsing it. Groups (wire types
// 3 and 4, which no profiler message uses) count as malformed data.
class WireReader {
 public:
  enum WireType { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };
  struct Field {
    uint32_t number = 0;
    int wire_type = 0;
    uint64_t varint = 0;     // the value of varint fields; the raw bits of fixed ones
    std::string_view value;  // the payload of length-delimited fields
    std::string_view raw;    // the whole field, tag included
  };

  // `base` is the offset of `data` in the whole input, for error messages.
  explicit WireReader(std::string_view data, size_t base = 0) : data_(data), base_(base) {}

  // Returns false at the end of the data or at malformed data (then failed() is true). Inline:
  // the trace writers' inner loop.
  inline bool Next(Field* field);

  bool failed() const { return failed_; }
  std::string_view data() const { return data_; }
  // Where the next field starts in data().
  size_t position() const { return pos_; }
  // Moves past `n` bytes the caller has read itself.
  void Skip(size_t n) { pos_ += n; }
  // Absolute offset where reading stopped.
  size_t offset() const { return base_ + pos_; }

 private:
  inline bool ReadVarint(uint64_t* value);
  bool ReadVarintSlow(uint64_t* value);
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

bool WireReader::ReadVarint(uint64_t* value) {
  // One byte: most tags and small values.
  if (pos_ < data_.size() && (static_cast<uint8_t>(data_[pos_]) & 0x80) == 0) {
    *value = static_cast<uint8_t>(data_[pos_++]);
    return true;
  }
  // Up to ten bytes with no bounds check in the loop when ten remain.
  if (data_.size() - pos_ >= 10) {
    const auto* p = reinterpret_cast<const uint8_t*>(data_.data() + pos_);
    uint64_t result = 0;
    for (int i = 0; i < 10; ++i) {
      result |= static_cast<uint64_t>(p[i] & 0x7F) << (7 * i);
      if ((p[i] & 0x80) == 0) {
        pos_ += i + 1;
        *value = result;
        return true;
      }
    }
    return false;
  }
  return ReadVarintSlow(value);
}

bool WireReader::Next(Field* field) {
  if (pos_ >= data_.size() || failed_) return false;
  const size_t start = pos_;
  uint64_t tag;
  if (!ReadVarint(&tag) || (tag >> 3) == 0 || (tag >> 3) > 0x1FFFFFFF) return Fail(start);
  field->number = static_cast<uint32_t>(tag >> 3);
  field->wire_type = static_cast<int>(tag & 7);
  field->value = {};
  switch (field->wire_type) {
    case kVarint:
      if (!ReadVarint(&field->varint)) return Fail(start);
      break;
    case kFixed64:
      if (data_.size() - pos_ < 8) return Fail(start);
      std::memcpy(&field->varint, data_.data() + pos_, 8);
      pos_ += 8;
      break;
    case kFixed32: {
      if (data_.size() - pos_ < 4) return Fail(start);
      uint32_t bits;
      std::memcpy(&bits, data_.data() + pos_, 4);
      field->varint = bits;
      pos_ += 4;
      break;
    }
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

// One XStat, decoded from its wire format. The last value field wins, as in protobuf.
struct StatView {
  int64_t metadata_id = 0;
  tensorflow::profiler::XStat::ValueCase value_case = tensorflow::profiler::XStat::VALUE_NOT_SET;
  union {
    double double_value;
    uint64_t uint64_value;
    int64_t int64_value;
    uint64_t ref_value;
  };
  std::string_view str_value;  // str_value or bytes_value
  StatView() : uint64_value(0) {}
};

// One XEvent, decoded from its wire format without protobuf's parser (the trace writers' hot
// path). `stats` keeps its capacity across events.
struct EventView {
  int64_t metadata_id = 0;
  int64_t offset_ps = 0;
  int64_t duration_ps = 0;
  bool aggregated = false;  // num_occurrences instead of offset_ps: no time
  std::vector<StatView> stats;
};

// Decodes a serialized XEvent into `event`. Returns false where protobuf's parser would refuse it
// (malformed fields, a str_value that is not valid UTF-8).
bool DecodeEvent(std::string_view serialized, EventView* event);

// Reads only the offset_ps of a serialized XEvent (0 when it has none), for checking that a line's
// events come in order before converting them. False for an aggregated event (no time).
bool DecodeEventOffsetPs(std::string_view serialized, int64_t* offset_ps);

// Walks a serialized XSpace. Open() checks the top level (empty, truncated or corrupt, not an
// XSpace: the errors ParseXSpace gives); NextPlane() parses a plane without its lines, NextLine()
// a line without its events, and events() iterates the current line's serialized events. Errors
// name `source`; later errors come after output has started, so callers abort what they were
// writing. Not thread-safe; `serialized` must outlive the stream.
class XSpaceStream {
 public:
  // `release(offset)`, when given, is called after each line with an offset below which
  // `serialized` will not be read again (a caller that mapped the file can drop those pages).
  static absl::StatusOr<XSpaceStream> Open(std::string_view serialized, std::string_view source,
                                           std::function<void(size_t)> release = nullptr);

  // Moves to the next plane. False after the last one. Its lines are read only if asked for.
  absl::StatusOr<bool> NextPlane();
  // The current plane: id, name, metadata and stats; no lines.
  const tensorflow::profiler::XPlane& plane() const { return plane_; }
  // Whether any line of the current plane holds an event.
  bool plane_has_events() const { return plane_has_events_; }

  // Moves to the current plane's next line. False after the last one.
  absl::StatusOr<bool> NextLine();
  // The current line: its fields other than events.
  const tensorflow::profiler::XLine& line() const { return line_; }

  // The current line's serialized events, in order. A copy iterates from the start again.
  class EventIterator {
   public:
    bool Next(std::string_view* event) {
      // Fast path: an event field (tag 0x22) shorter than 128 bytes, as nearly all are.
      const size_t pos = reader_.position();
      const std::string_view data = reader_.data();
      if (data.size() - pos >= 2 && data[pos] == '\x22' &&
          (static_cast<uint8_t>(data[pos + 1]) & 0x80) == 0) {
        const size_t length = static_cast<uint8_t>(data[pos + 1]);
        if (length <= data.size() - pos - 2) {
          *event = data.substr(pos + 2, length);
          reader_.Skip(2 + length);
          return true;
        }
      }
      WireReader::Field field;
      while (reader_.Next(&field)) {
        if (field.number == 4 && field.wire_type == WireReader::kLengthDelimited) {
          *event = field.value;
          return true;
        }
      }
      return false;
    }

   private:
    friend class XSpaceStream;
    explicit EventIterator(std::string_view line) : reader_(line) {}
    WireReader reader_;
  };
  EventIterator events() const { return EventIterator(line_bytes_); }

  // The error for data that does not parse at `at` (a view into the input).
  absl::Status CorruptAt(std::string_view at) const;
  std::string_view source() const { return source_; }

 private:
  XSpaceStream(std::string_view serialized, std::string_view source,
               std::function<void(size_t)> release)
      : serialized_(serialized), source_(source), release_(std::move(release)) {}
  size_t OffsetOf(std::string_view bytes) const {
    return static_cast<size_t>(bytes.data() - serialized_.data());
  }
  void ReleaseLine();

  std::string_view serialized_;
  std::string source_;
  std::function<void(size_t)> release_;
  std::vector<std::string_view> planes_;
  size_t next_plane_ = 0;
  tensorflow::profiler::XPlane plane_;
  bool plane_has_events_ = false;
  std::vector<std::string_view> lines_;
  size_t next_line_ = 0;
  tensorflow::profiler::XLine line_;
  std::string_view line_bytes_;
  std::string buffer_;
};

// Per-plane lookup of metadata (event or stat) by id, built once per plane so that the event loop
// of a trace writer does no hashing for dense ids. `Info` has a `bool valid` member.
template <typename Info>
class MetadataTable {
 public:
  // Whether ids up to `max_id` for `count` entries are dense enough for a vector.
  static bool Dense(int64_t max_id, size_t count) {
    return max_id < static_cast<int64_t>(count) * 4 + 1024;
  }
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

// Chooses the process id of each plane in a trace, the same in both trace writers
// (docs/trace-format.md): the first /host:CPU plane is 701, further ones 702, 703, ...;
// /device:* plane n is 1 + n; any other plane with events gets an id from 801 on; nullopt for
// planes left out (Task Environment, /host:metadata and other event-less helper planes).
class TracePidAllocator {
 public:
  std::optional<int> Next(const tensorflow::profiler::XPlane& plane, bool has_events);

 private:
  int host_planes_ = 0;
  int next_other_pid_ = 0;
};

// Reads the whole of a serialized XSpace as the trace writers do (every plane and line parsed,
// every event decoded) without writing anything: a writer that converts a file this accepts
// fails only on its output. For `clusterprof convert --run`, which leaves a bad host out whole.
absl::Status CheckSerializedXSpace(std::string_view serialized, std::string_view source);

}  // namespace clusterprof::xspace

#endif  // CLUSTERPROF_COMMON_XSPACE_XSPACE_STREAM_H_
