#include "tests/support/perfetto_trace_decoder.h"

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"
#include "google/protobuf/dynamic_message.h"
#include "google/protobuf/message.h"

namespace clusterprof::testing {
namespace {

using ::google::protobuf::Descriptor;
using ::google::protobuf::FieldDescriptor;
using ::google::protobuf::Message;

// Perfetto's schema: the descriptor set protoc made of third_party/perfetto/perfetto_trace.proto
// at build time, loaded once.
class Schema {
 public:
  static Schema& Get() {
    static Schema* schema = new Schema();
    return *schema;
  }
  std::unique_ptr<Message> NewTrace() const {
    return std::unique_ptr<Message>(factory_.GetPrototype(trace_)->New());
  }

 private:
  Schema() {
    std::ifstream in(CLUSTERPROF_PERFETTO_DESCRIPTOR, std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    google::protobuf::FileDescriptorSet files;
    if (!in || !files.ParseFromString(bytes.str())) {
      std::fprintf(stderr, "cannot read %s\n", CLUSTERPROF_PERFETTO_DESCRIPTOR);
      std::abort();
    }
    for (const google::protobuf::FileDescriptorProto& file : files.file()) {
      if (pool_.BuildFile(file) == nullptr) std::abort();
    }
    trace_ = pool_.FindMessageTypeByName("perfetto.protos.Trace");
    if (trace_ == nullptr) std::abort();
  }
  google::protobuf::DescriptorPool pool_;
  mutable google::protobuf::DynamicMessageFactory factory_;
  const Descriptor* trace_ = nullptr;
};

const FieldDescriptor* Field(const Message& m, const char* name) {
  const FieldDescriptor* field = m.GetDescriptor()->FindFieldByName(name);
  if (field == nullptr) {
    std::fprintf(stderr, "%s has no field %s\n", m.GetDescriptor()->full_name().c_str(), name);
    std::abort();
  }
  return field;
}

bool Has(const Message& m, const char* name) {
  return m.GetReflection()->HasField(m, Field(m, name));
}

uint64_t Uint(const Message& m, const char* name) {
  const FieldDescriptor* f = Field(m, name);
  const auto* r = m.GetReflection();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_UINT64:
      return r->GetUInt64(m, f);
    case FieldDescriptor::CPPTYPE_UINT32:
      return r->GetUInt32(m, f);
    case FieldDescriptor::CPPTYPE_INT64:
      return static_cast<uint64_t>(r->GetInt64(m, f));
    case FieldDescriptor::CPPTYPE_INT32:
      return static_cast<uint64_t>(static_cast<int64_t>(r->GetInt32(m, f)));
    case FieldDescriptor::CPPTYPE_ENUM:
      return static_cast<uint64_t>(r->GetEnumValue(m, f));
    case FieldDescriptor::CPPTYPE_BOOL:
      return r->GetBool(m, f) ? 1 : 0;
    default:
      std::abort();
  }
}

std::string String(const Message& m, const char* name) {
  return m.GetReflection()->GetString(m, Field(m, name));
}

const Message& Sub(const Message& m, const char* name) {
  return m.GetReflection()->GetMessage(m, Field(m, name));
}

int Count(const Message& m, const char* name) {
  return m.GetReflection()->FieldSize(m, Field(m, name));
}

const Message& At(const Message& m, const char* name, int i) {
  return m.GetReflection()->GetRepeatedMessage(m, Field(m, name), i);
}

uint64_t UintAt(const Message& m, const char* name, int i) {
  const FieldDescriptor* f = Field(m, name);
  return m.GetReflection()->GetRepeatedUInt64(m, f, i);
}

struct Sequence {
  bool valid = false;
  uint32_t clock_id = 0;
  uint64_t default_track = 0;
  std::map<uint64_t, std::string> event_names;
  std::map<uint64_t, std::string> annotation_names;
  bool clock_known = false;
  int64_t incremental_last = 0;
  int64_t realtime_minus_incremental = 0;
};

constexpr uint32_t kCleared = 1;
constexpr uint32_t kNeeds = 2;
constexpr uint32_t kIncrementalClock = 64;
constexpr uint32_t kRealtime = 1;

}  // namespace

std::vector<const PerfettoTrack*> PerfettoTrace::TracksNamed(std::string_view name) const {
  std::vector<const PerfettoTrack*> found;
  for (const auto& [uuid, track] : tracks) {
    if (track.name == name || track.process_name == name || track.thread_name == name) {
      found.push_back(&track);
    }
  }
  return found;
}

std::vector<const PerfettoSlice*> PerfettoTrace::SlicesNamed(std::string_view name) const {
  std::vector<const PerfettoSlice*> found;
  for (const PerfettoSlice& slice : slices) {
    if (slice.name == name) found.push_back(&slice);
  }
  return found;
}

PerfettoTrace DecodePerfettoTrace(std::string_view bytes) {
  PerfettoTrace trace;
  std::unique_ptr<Message> parsed = Schema::Get().NewTrace();
  if (!parsed->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    trace.problems.push_back("not a perfetto.protos.Trace");
    return trace;
  }
  std::map<uint32_t, Sequence> sequences;
  std::map<uint64_t, std::vector<size_t>> open;  // track -> open slices, innermost last
  auto problem = [&](int packet, const std::string& what) {
    trace.problems.push_back("packet " + std::to_string(packet) + ": " + what);
  };
  trace.packets = Count(*parsed, "packet");
  for (int i = 0; i < trace.packets; ++i) {
    const Message& packet = At(*parsed, "packet", i);
    const uint32_t seq_id = Has(packet, "trusted_packet_sequence_id")
                                ? static_cast<uint32_t>(Uint(packet, "trusted_packet_sequence_id"))
                                : 0;
    const uint32_t flags =
        Has(packet, "sequence_flags") ? static_cast<uint32_t>(Uint(packet, "sequence_flags")) : 0;
    Sequence& seq = sequences[seq_id];
    if (flags & kCleared) {
      if (seq_id == 0) problem(i, "incremental state cleared on sequence 0");
      seq = Sequence();
      seq.valid = true;
    }
    if ((flags & kNeeds) && !seq.valid) problem(i, "needs incremental state it does not have");
    if (Has(packet, "trace_packet_defaults")) {
      const Message& defaults = Sub(packet, "trace_packet_defaults");
      if (Has(defaults, "timestamp_clock_id")) {
        seq.clock_id = static_cast<uint32_t>(Uint(defaults, "timestamp_clock_id"));
      }
      if (Has(defaults, "track_event_defaults")) {
        seq.default_track = Uint(Sub(defaults, "track_event_defaults"), "track_uuid");
      }
    }
    if (Has(packet, "interned_data")) {
      if (!(flags & kNeeds)) problem(i, "interned data without SEQ_NEEDS_INCREMENTAL_STATE");
      const Message& interned = Sub(packet, "interned_data");
      for (int n = 0; n < Count(interned, "event_names"); ++n) {
        const Message& entry = At(interned, "event_names", n);
        const uint64_t iid = Uint(entry, "iid");
        if (seq.event_names.count(iid)) problem(i, "event name iid defined twice");
        seq.event_names[iid] = String(entry, "name");
        ++trace.event_name_definitions[String(entry, "name")];
      }
      for (int n = 0; n < Count(interned, "debug_annotation_names"); ++n) {
        const Message& entry = At(interned, "debug_annotation_names", n);
        const uint64_t iid = Uint(entry, "iid");
        if (seq.annotation_names.count(iid)) problem(i, "annotation name iid defined twice");
        seq.annotation_names[iid] = String(entry, "name");
      }
    }
    if (Has(packet, "clock_snapshot")) {
      const Message& snapshot = Sub(packet, "clock_snapshot");
      if (Has(snapshot, "primary_trace_clock")) {
        trace.primary_trace_clock = static_cast<uint32_t>(Uint(snapshot, "primary_trace_clock"));
      }
      bool has_realtime = false;
      bool has_incremental = false;
      int64_t realtime = 0;
      int64_t incremental = 0;
      for (int n = 0; n < Count(snapshot, "clocks"); ++n) {
        const Message& clock = At(snapshot, "clocks", n);
        const uint64_t id = Uint(clock, "clock_id");
        const int64_t value = static_cast<int64_t>(Uint(clock, "timestamp"));
        if (id == kRealtime) {
          has_realtime = true;
          realtime = value;
        } else if (id == kIncrementalClock) {
          if (!Uint(clock, "is_incremental")) problem(i, "clock 64 is not incremental");
          has_incremental = true;
          incremental = value;
        }
      }
      if (has_incremental) {
        if (!has_realtime) problem(i, "incremental clock not related to CLOCK_REALTIME");
        if (seq_id == 0) problem(i, "sequence-scoped clock on sequence 0");
        seq.clock_known = true;
        seq.incremental_last = incremental;
        seq.realtime_minus_incremental = realtime - incremental;
      }
      continue;  // as trace_processor: a snapshot packet holds nothing else
    }

    // The packet's time on CLOCK_REALTIME.
    int64_t ts = 0;
    if (Has(packet, "timestamp")) {
      const uint64_t raw = Uint(packet, "timestamp");
      const uint32_t clock = Has(packet, "timestamp_clock_id")
                                 ? static_cast<uint32_t>(Uint(packet, "timestamp_clock_id"))
                                 : seq.clock_id;
      if (clock == kIncrementalClock) {
        if (!seq.clock_known) problem(i, "incremental timestamp before its clock snapshot");
        seq.incremental_last += static_cast<int64_t>(raw);
        ts = seq.incremental_last + seq.realtime_minus_incremental;
      } else if (clock == kRealtime) {
        ts = static_cast<int64_t>(raw);
      } else {
        problem(i, "timestamp on clock " + std::to_string(clock));
      }
    }

    if (Has(packet, "track_descriptor")) {
      const Message& d = Sub(packet, "track_descriptor");
      PerfettoTrack track;
      track.uuid = Uint(d, "uuid");
      if (track.uuid == 0) problem(i, "track uuid 0");
      if (trace.tracks.count(track.uuid)) problem(i, "track described twice");
      track.parent_uuid = Has(d, "parent_uuid") ? Uint(d, "parent_uuid") : 0;
      if (track.parent_uuid != 0 && !trace.tracks.count(track.parent_uuid)) {
        problem(i, "parent track not described before its child");
      }
      if (Has(d, "name")) track.name = String(d, "name");
      if (Has(d, "process")) {
        track.is_process = true;
        track.pid = static_cast<int32_t>(Uint(Sub(d, "process"), "pid"));
        track.process_name = String(Sub(d, "process"), "process_name");
      }
      if (Has(d, "thread")) {
        track.is_thread = true;
        track.pid = static_cast<int32_t>(Uint(Sub(d, "thread"), "pid"));
        track.tid = static_cast<int64_t>(Uint(Sub(d, "thread"), "tid"));
        track.thread_name = String(Sub(d, "thread"), "thread_name");
      }
      track.is_counter = Has(d, "counter");
      trace.tracks[track.uuid] = track;
    }

    if (Has(packet, "track_event")) {
      const Message& event = Sub(packet, "track_event");
      if (!(flags & kNeeds)) problem(i, "track event without SEQ_NEEDS_INCREMENTAL_STATE");
      if (!Has(packet, "timestamp")) problem(i, "track event without a timestamp");
      const uint64_t track =
          Has(event, "track_uuid") ? Uint(event, "track_uuid") : seq.default_track;
      if (!trace.tracks.count(track)) problem(i, "event on an undescribed track");
      const uint64_t type = Uint(event, "type");
      if (type == 1) {  // TYPE_SLICE_BEGIN
        PerfettoSlice slice;
        slice.track_uuid = track;
        slice.start_ns = ts;
        if (Has(event, "name_iid")) {
          auto it = seq.event_names.find(Uint(event, "name_iid"));
          if (it == seq.event_names.end()) {
            problem(i, "unknown event name iid");
          } else {
            slice.name = it->second;
          }
        } else if (Has(event, "name")) {
          slice.name = String(event, "name");
        }
        for (int n = 0; n < Count(event, "debug_annotations"); ++n) {
          const Message& a = At(event, "debug_annotations", n);
          std::string name;
          if (Has(a, "name_iid")) {
            auto it = seq.annotation_names.find(Uint(a, "name_iid"));
            if (it == seq.annotation_names.end()) {
              problem(i, "unknown annotation name iid");
            } else {
              name = it->second;
            }
          } else {
            name = String(a, "name");
          }
          std::string value;
          if (Has(a, "int_value")) {
            value = std::to_string(static_cast<int64_t>(Uint(a, "int_value")));
          } else if (Has(a, "uint_value")) {
            value = std::to_string(Uint(a, "uint_value"));
          } else if (Has(a, "double_value")) {
            char buf[64];
            std::snprintf(buf, sizeof(buf), "%g",
                          a.GetReflection()->GetDouble(a, Field(a, "double_value")));
            value = buf;
          } else if (Has(a, "string_value")) {
            value = String(a, "string_value");
          } else {
            problem(i, "annotation without a value");
          }
          slice.args[name] = value;
        }
        for (int n = 0; n < Count(event, "flow_ids"); ++n) {
          slice.flow_ids.push_back(UintAt(event, "flow_ids", n));
        }
        for (int n = 0; n < Count(event, "terminating_flow_ids"); ++n) {
          slice.terminating_flow_ids.push_back(UintAt(event, "terminating_flow_ids", n));
        }
        slice.depth = static_cast<int>(open[track].size());
        open[track].push_back(trace.slices.size());
        trace.slices.push_back(std::move(slice));
      } else if (type == 2) {  // TYPE_SLICE_END
        std::vector<size_t>& stack = open[track];
        if (stack.empty()) {
          problem(i, "slice end without a begin on its track");
        } else {
          PerfettoSlice& slice = trace.slices[stack.back()];
          stack.pop_back();
          slice.end_ns = ts;
          if (ts < slice.start_ns) problem(i, "slice ends before it begins");
        }
      } else if (type == 4) {  // TYPE_COUNTER
        auto it = trace.tracks.find(track);
        if (it == trace.tracks.end() || !it->second.is_counter) {
          problem(i, "counter value on a track that is not a counter track");
        }
        PerfettoCounterSample sample;
        sample.track_uuid = track;
        sample.ts_ns = ts;
        if (Has(event, "counter_value")) {
          sample.value = static_cast<double>(static_cast<int64_t>(Uint(event, "counter_value")));
        } else if (Has(event, "double_counter_value")) {
          sample.is_double = true;
          sample.value =
              event.GetReflection()->GetDouble(event, Field(event, "double_counter_value"));
        } else {
          problem(i, "counter event without a value");
        }
        trace.counters.push_back(sample);
      } else {
        problem(i, "track event of type " + std::to_string(type));
      }
    }
  }
  for (const auto& [track, stack] : open) {
    if (!stack.empty()) trace.problems.push_back("a slice never ends");
  }
  return trace;
}

}  // namespace clusterprof::testing
