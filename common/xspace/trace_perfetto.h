// XSpace -> Perfetto's own protobuf trace format (a `perfetto.protos.Trace`: a stream of
// TracePackets with TrackEvents), which ui.perfetto.dev and trace_processor load natively and
// which is several times smaller than the Chrome trace JSON of trace_json.h. Written by
// hand-encoding the wire format into a fixed-size buffer, streamed from the serialized XSpace
// (xspace_stream.h): memory holds one plane's metadata, one line's state and one event at a time.
// The layout is described in docs/trace-format.md ("Perfetto's native format").
#ifndef CLUSTERPROF_COMMON_XSPACE_TRACE_PERFETTO_H_
#define CLUSTERPROF_COMMON_XSPACE_TRACE_PERFETTO_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/io/byte_sink.h"

namespace clusterprof::xspace {

struct PerfettoTraceOptions {
  // For several hosts in one trace (`clusterprof convert --run --format perfetto`): added to
  // every pid, put before every process name ("host-3 /host:CPU"), and subtracted from every
  // timestamp (the host's clock offset, so that all hosts share one clock).
  int pid_base = 0;
  std::string process_name_prefix;
  int64_t shift_ps = 0;
  // Mixed into the flow ids (launch -> kernel) so that the flows of different hosts, each
  // numbered by its own correlation ids, stay apart. 0 keeps the ids as the XSpace has them.
  uint64_t flow_id_salt = 0;
};

struct PerfettoTraceStats {
  int64_t complete_events = 0;  // slices: a begin and an end TrackEvent each
  int64_t counter_events = 0;   // counter samples
  int64_t flow_events = 0;      // events that carry a flow id
  int64_t skipped_events = 0;   // aggregated events (no time), counter samples without a value
  int64_t tracks = 0;           // track descriptors written
  uint64_t bytes = 0;           // uncompressed trace bytes
};

// Writes one Perfetto trace into a ByteSink from one or more serialized XSpaces (hosts), each on
// its own processes:
// - every plane the trace JSON keeps becomes a process track (ProcessDescriptor, the trace
//   JSON's pid, named "<prefix><plane>");
// - the lines of /host:* planes become thread tracks (ThreadDescriptor: tid = display_id, else
//   id; named display_name, else name); other planes' lines become named tracks of the process,
//   with child tracks ("lanes") for events that overlap without nesting;
// - events become slices (a TYPE_SLICE_BEGIN and a TYPE_SLICE_END), named display_name else
//   name through interned event names, with their stats (and their metadata's) as debug
//   annotations under interned names, internal stats ('_') left out;
// - `_p` / `_c` stats and upstream's `flow` stat become flow_ids on the producer and
//   terminating_flow_ids on the consumer;
// - events on "Counters" / "_counters_" lines become counter tracks (CounterDescriptor, one per
//   counter of the line) with their "value" stat;
// - timestamps are nanoseconds on CLOCK_REALTIME (the XSpace's epoch ns, picoseconds below a
//   nanosecond dropped), delta-encoded on an incremental clock per line.
// Not thread-safe. A failed sink makes every later call fail with its error.
class PerfettoTraceWriter {
 public:
  explicit PerfettoTraceWriter(io::ByteSink* sink);
  ~PerfettoTraceWriter();
  PerfettoTraceWriter(const PerfettoTraceWriter&) = delete;
  PerfettoTraceWriter& operator=(const PerfettoTraceWriter&) = delete;

  // Adds the XSpace serialized in `serialized`. Errors name `source` and match ParseXSpace's
  // (empty, truncated or corrupt, not an XSpace); an error after output has started leaves the
  // trace with part of this XSpace, so callers that must not keep it check the input first
  // (CheckSerializedXSpace) or abort what they were writing. `release(offset)`, when given, is
  // called as conversion moves on with an offset below which `serialized` will not be read again.
  absl::StatusOr<PerfettoTraceStats> Add(std::string_view serialized, std::string_view source,
                                         const PerfettoTraceOptions& options = {},
                                         const std::function<void(size_t)>& release = nullptr);

  // Writes out what is buffered. The trace is complete after it (a Perfetto trace has no
  // trailer); more can be added after.
  absl::Status Flush();

  // Everything added so far.
  const PerfettoTraceStats& total() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// One XSpace as a whole Perfetto trace: PerfettoTraceWriter::Add, then Flush.
absl::StatusOr<PerfettoTraceStats> WritePerfettoTraceFromSerialized(
    std::string_view serialized, std::string_view source, io::ByteSink* out,
    const PerfettoTraceOptions& options = {}, const std::function<void(size_t)>& release = nullptr);

}  // namespace clusterprof::xspace

#endif  // CLUSTERPROF_COMMON_XSPACE_TRACE_PERFETTO_H_
