// Reads a Perfetto protobuf trace with Perfetto's own schema (third_party/perfetto/
// perfetto_trace.proto, loaded at run time as a descriptor set: no generated code) and rebuilds
// what a reader such as trace_processor sees: tracks, slices with their names, annotations and
// flows, counter samples, with the incremental timestamps and interned names resolved as Perfetto
// documents them. Every rule the trace breaks (an unknown interned id, a packet that needs
// incremental state without having it, an event on an undeclared track, a timestamp that goes back)
// is collected in `problems`.
#ifndef CLUSTERPROF_TESTS_SUPPORT_PERFETTO_TRACE_DECODER_H_
#define CLUSTERPROF_TESTS_SUPPORT_PERFETTO_TRACE_DECODER_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace clusterprof::testing {

struct PerfettoTrack {
  uint64_t uuid = 0;
  uint64_t parent_uuid = 0;
  std::string name;  // TrackDescriptor.name
  bool is_process = false;
  bool is_thread = false;
  bool is_counter = false;
  int32_t pid = 0;  // process or thread
  int64_t tid = 0;
  std::string process_name;
  std::string thread_name;
};

struct PerfettoSlice {
  uint64_t track_uuid = 0;
  int64_t start_ns = 0;
  int64_t end_ns = -1;  // -1 until its end event
  int depth = 0;        // open slices on the same track when it began
  std::string name;
  // Debug annotations, values as text: ints and uints in decimal, doubles as %g, strings as is.
  std::map<std::string, std::string> args;
  std::vector<uint64_t> flow_ids;
  std::vector<uint64_t> terminating_flow_ids;
};

struct PerfettoCounterSample {
  uint64_t track_uuid = 0;
  int64_t ts_ns = 0;
  double value = 0;
  bool is_double = false;
};

struct PerfettoTrace {
  int packets = 0;
  std::map<uint64_t, PerfettoTrack> tracks;
  std::vector<PerfettoSlice> slices;  // in the order they began in the file
  std::vector<PerfettoCounterSample> counters;
  uint32_t primary_trace_clock = 0;
  // How many times each event name was defined in InternedData over the trace.
  std::map<std::string, int> event_name_definitions;
  std::vector<std::string> problems;

  // The tracks whose name (process, thread or track name) is `name`.
  std::vector<const PerfettoTrack*> TracksNamed(std::string_view name) const;
  // The slices named `name`, in file order.
  std::vector<const PerfettoSlice*> SlicesNamed(std::string_view name) const;
};

// Decodes `bytes` (a serialized perfetto.protos.Trace). A trace that does not parse at all is a
// problem of its own.
PerfettoTrace DecodePerfettoTrace(std::string_view bytes);

}  // namespace clusterprof::testing

#endif  // CLUSTERPROF_TESTS_SUPPORT_PERFETTO_TRACE_DECODER_H_
