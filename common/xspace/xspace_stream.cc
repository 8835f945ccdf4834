#include "common/xspace/xspace_stream.h"

#include <cstring>
#include <utility>

#include "common/base/strings.h"
#include "common/xspace/schema.h"
#include "common/xspace/xspace_errors.h"

namespace clusterprof::xspace {
namespace {

using ::tensorflow::profiler::XStat;

absl::Status WrongType(std::string_view source, const WireReader::Field& field,
                       std::string_view message) {
  return WrongWireTypeError(source, static_cast<int>(field.number), field.wire_type, message);
}

// Whether a serialized XLine holds at least one event (field 4).
bool LineHasEvents(std::string_view line) {
  WireReader reader(line);
  WireReader::Field field;
  while (reader.Next(&field)) {
    if (field.number == 4 && field.wire_type == WireReader::kLengthDelimited) return true;
  }
  return false;
}

// Whether `text` is valid UTF-8, as protobuf requires of proto3 string fields.
bool IsValidUtf8(std::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const auto* end = p + text.size();
  while (p < end) {
    // ASCII, eight bytes at a time.
    while (end - p >= 8) {
      uint64_t word;
      std::memcpy(&word, p, 8);
      if ((word & 0x8080808080808080ull) != 0) break;
      p += 8;
    }
    if (p >= end) break;
    const unsigned char c = *p;
    if (c < 0x80) {
      ++p;
      continue;
    }
    int n;
    uint32_t min;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) {
      n = 1, min = 0x80, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2, min = 0x800, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3, min = 0x10000, cp = c & 0x07;
    } else {
      return false;
    }
    if (end - p <= n) return false;
    for (int i = 1; i <= n; ++i) {
      if ((p[i] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    p += n + 1;
  }
  return true;
}

bool DecodeStat(std::string_view serialized, StatView* stat) {
  *stat = StatView();
  WireReader reader(serialized);
  WireReader::Field field;
  while (reader.Next(&field)) {
    switch (field.number) {
      case 1:
        if (field.wire_type == WireReader::kVarint) {
          stat->metadata_id = static_cast<int64_t>(field.varint);
        }
        break;
      case 2:
        if (field.wire_type == WireReader::kFixed64) {
          stat->value_case = XStat::kDoubleValue;
          std::memcpy(&stat->double_value, &field.varint, sizeof(double));
        }
        break;
      case 3:
        if (field.wire_type == WireReader::kVarint) {
          stat->value_case = XStat::kUint64Value;
          stat->uint64_value = field.varint;
        }
        break;
      case 4:
        if (field.wire_type == WireReader::kVarint) {
          stat->value_case = XStat::kInt64Value;
          stat->int64_value = static_cast<int64_t>(field.varint);
        }
        break;
      case 5:
        if (field.wire_type == WireReader::kLengthDelimited) {
          if (!IsValidUtf8(field.value)) return false;
          stat->value_case = XStat::kStrValue;
          stat->str_value = field.value;
        }
        break;
      case 6:
        if (field.wire_type == WireReader::kLengthDelimited) {
          stat->value_case = XStat::kBytesValue;
          stat->str_value = field.value;
        }
        break;
      case 7:
        if (field.wire_type == WireReader::kVarint) {
          stat->value_case = XStat::kRefValue;
          stat->ref_value = field.varint;
        }
        break;
      default:
        break;
    }
  }
  return !reader.failed();
}

}  // namespace

bool WireReader::ReadVarintSlow(uint64_t* value) {
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

bool DecodeEvent(std::string_view serialized, EventView* event) {
  event->metadata_id = 0;
  event->offset_ps = 0;
  event->duration_ps = 0;
  event->aggregated = false;
  event->stats.clear();
  WireReader reader(serialized);
  WireReader::Field field;
  while (reader.Next(&field)) {
    switch (field.number) {
      case 1:
        if (field.wire_type == WireReader::kVarint) {
          event->metadata_id = static_cast<int64_t>(field.varint);
        }
        break;
      case 2:
        if (field.wire_type == WireReader::kVarint) {
          event->offset_ps = static_cast<int64_t>(field.varint);
          event->aggregated = false;
        }
        break;
      case 3:
        if (field.wire_type == WireReader::kVarint) {
          event->duration_ps = static_cast<int64_t>(field.varint);
        }
        break;
      case 4:
        if (field.wire_type == WireReader::kLengthDelimited) {
          event->stats.emplace_back();
          if (!DecodeStat(field.value, &event->stats.back())) return false;
        }
        break;
      case 5:
        if (field.wire_type == WireReader::kVarint) {
          event->offset_ps = 0;
          event->aggregated = true;
        }
        break;
      default:
        break;
    }
  }
  return !reader.failed();
}

bool DecodeEventOffsetPs(std::string_view serialized, int64_t* offset_ps) {
  WireReader reader(serialized);
  WireReader::Field field;
  bool timed = true;
  *offset_ps = 0;
  while (reader.Next(&field)) {
    if (field.wire_type != WireReader::kVarint) continue;
    if (field.number == 2) {
      *offset_ps = static_cast<int64_t>(field.varint);
      timed = true;
    } else if (field.number == 5) {
      *offset_ps = 0;
      timed = false;
    }
  }
  return timed;
}

absl::StatusOr<XSpaceStream> XSpaceStream::Open(std::string_view serialized,
                                                std::string_view source,
                                                std::function<void(size_t)> release) {
  if (serialized.empty()) return EmptyXSpaceError(source);
  XSpaceStream stream(serialized, source, std::move(release));
  // Top level: validate, and find the planes.
  bool has_hostnames = false;
  bool has_unknown = false;
  WireReader reader(serialized, 0);
  WireReader::Field field;
  while (reader.Next(&field)) {
    if (field.number >= 1 && field.number <= 4) {
      if (field.wire_type != WireReader::kLengthDelimited) {
        return WrongType(source, field, "XSpace");
      }
      if (field.number == 1) stream.planes_.push_back(field.value);
      if (field.number == 4) has_hostnames = true;
    } else {
      has_unknown = true;
    }
  }
  if (reader.failed()) return CorruptXSpaceError(source, reader.offset());
  if (has_unknown && stream.planes_.empty() && !has_hostnames) {
    return OnlyUnknownFieldsError(source);
  }
  return stream;
}

absl::StatusOr<bool> XSpaceStream::NextPlane() {
  ReleaseLine();
  lines_.clear();
  next_line_ = 0;
  if (next_plane_ >= planes_.size()) return false;
  const std::string_view plane = planes_[next_plane_++];
  const size_t plane_base = OffsetOf(plane);
  // The plane without its lines: id, name, metadata and stats, parsed as an XPlane.
  buffer_.clear();
  plane_has_events_ = false;
  WireReader reader(plane, plane_base);
  WireReader::Field field;
  while (reader.Next(&field)) {
    if (field.number >= 1 && field.number <= 6) {
      const bool scalar = field.number == 1;
      if ((field.wire_type == WireReader::kVarint) != scalar ||
          (!scalar && field.wire_type != WireReader::kLengthDelimited)) {
        return WrongType(source_, field, "XPlane");
      }
    }
    if (field.number == 3) {
      lines_.push_back(field.value);
      plane_has_events_ = plane_has_events_ || LineHasEvents(field.value);
    } else {
      buffer_.append(field.raw);
    }
  }
  if (reader.failed()) return CorruptXSpaceError(source_, reader.offset());
  plane_.Clear();
  if (!plane_.ParseFromString(buffer_)) return CorruptXSpaceError(source_, plane_base);
  return true;
}

absl::StatusOr<bool> XSpaceStream::NextLine() {
  ReleaseLine();
  if (next_line_ >= lines_.size()) return false;
  const std::string_view line = lines_[next_line_++];
  const size_t line_base = OffsetOf(line);
  // The line's own fields; its events are read by events().
  buffer_.clear();
  WireReader reader(line, line_base);
  WireReader::Field field;
  while (reader.Next(&field)) {
    if (field.number != 4) buffer_.append(field.raw);
  }
  if (reader.failed()) return CorruptXSpaceError(source_, reader.offset());
  line_.Clear();
  if (!line_.ParseFromString(buffer_)) return CorruptXSpaceError(source_, line_base);
  line_bytes_ = line;
  return true;
}

void XSpaceStream::ReleaseLine() {
  if (line_bytes_.data() == nullptr) return;
  if (release_) release_(OffsetOf(line_bytes_) + line_bytes_.size());
  line_bytes_ = {};
}

absl::Status XSpaceStream::CorruptAt(std::string_view at) const {
  return CorruptXSpaceError(source_, OffsetOf(at));
}

std::optional<int> TracePidAllocator::Next(const tensorflow::profiler::XPlane& plane,
                                           bool has_events) {
  const bool device = StartsWith(plane.name(), kDevicePlanePrefix);
  if (plane.name() == kHostThreadsPlaneName) {
    const int pid = host_planes_ == 0 ? kHostThreadsPid : kFirstExtraHostPid + host_planes_ - 1;
    ++host_planes_;
    return pid;
  }
  if (device && plane.id() >= 0 && plane.id() < kHostThreadsPid - kFirstDevicePid) {
    return kFirstDevicePid + static_cast<int>(plane.id());
  }
  if (has_events || device) return kFirstOtherPlanePid + next_other_pid_++;
  return std::nullopt;
}

absl::Status CheckSerializedXSpace(std::string_view serialized, std::string_view source) {
  absl::StatusOr<XSpaceStream> stream = XSpaceStream::Open(serialized, source);
  if (!stream.ok()) return stream.status();
  EventView event;
  while (true) {
    absl::StatusOr<bool> plane = stream->NextPlane();
    if (!plane.ok()) return plane.status();
    if (!*plane) return absl::OkStatus();
    while (true) {
      absl::StatusOr<bool> line = stream->NextLine();
      if (!line.ok()) return line.status();
      if (!*line) break;
      XSpaceStream::EventIterator events = stream->events();
      std::string_view bytes;
      while (events.Next(&bytes)) {
        if (!DecodeEvent(bytes, &event)) return stream->CorruptAt(bytes);
      }
    }
  }
}

}  // namespace clusterprof::xspace
