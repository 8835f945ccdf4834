// XSpace -> Chrome trace JSON, the format Perfetto and chrome://tracing open and that JAX writes
// as <host>.trace.json.gz (docs/protocol.md, "Chrome trace JSON"). Output is streamed into a
// ByteSink (usually a GzipSink over a storage object) through a fixed-size buffer: no DOM and no
// whole JSON in memory, whatever the size of the trace.
#ifndef CLUSTERPROF_COMMON_XSPACE_TRACE_JSON_H_
#define CLUSTERPROF_COMMON_XSPACE_TRACE_JSON_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/io/byte_sink.h"
#include "tsl/profiler/protos/xplane.pb.h"

namespace clusterprof::xspace {

struct TraceJsonOptions {
  // Writes the top-level "metadata" key. perfetto_trace.json.gz is the same JSON without it.
  bool include_metadata = true;
  // One event per line: a little larger, much friendlier to grep and diff.
  bool newline_per_event = true;

  // For several hosts in one trace (`clusterprof convert --run`): added to every pid, put before
  // every process name ("host-3 /host:CPU"), and subtracted from every timestamp (the host's
  // clock offset, so that all hosts share one clock).
  int pid_base = 0;
  std::string process_name_prefix;
  int64_t shift_ps = 0;
  // Whether to write the document's opening (up to "traceEvents":[) and its closing. Without
  // them the output is events only, each followed by a comma, for a caller that concatenates
  // several.
  bool write_header = true;
  bool write_footer = true;
};

// The opening and closing of a trace document whose events a caller writes (with write_header
// and write_footer off) in between.
absl::Status WriteTraceJsonHeader(io::ByteSink* out, const TraceJsonOptions& options = {});
absl::Status WriteTraceJsonFooter(io::ByteSink* out, const TraceJsonOptions& options = {});

struct TraceJsonStats {
  int64_t complete_events = 0;  // "ph":"X"
  int64_t counter_events = 0;   // "ph":"C"
  int64_t flow_events = 0;      // events that carry a bind_id
  int64_t skipped_events = 0;   // aggregated events (num_occurrences) have no time: not written
  uint64_t bytes = 0;           // uncompressed JSON bytes
};

// Writes `space` as Chrome trace JSON:
// - every /host:CPU plane becomes a process (pid 701, then 702, ...), its lines threads
//   (tid = display_id, else id; name = display_name, else name);
// - /device:* plane n becomes pid 1 + n; any other plane with events gets a pid from 801 on;
// - events become "ph":"X" with ts/dur in microseconds (exact decimal text of the picoseconds),
//   their name (display_name, else name), and args from the event's and its metadata's stats as
//   strings (stats whose names start with '_' are internal and left out);
// - `_p` / `_c` stats become flow bindings ("bind_id" with "flow_out" / "flow_in");
// - events on a line named "Counters" become "ph":"C" counters with a numeric "value";
// - the array ends with an empty object, as the TSL converter writes it.
// Returns the sink's error if it fails.
absl::StatusOr<TraceJsonStats> WriteTraceJson(const tensorflow::profiler::XSpace& space,
                                              io::ByteSink* out,
                                              const TraceJsonOptions& options = {});

// The same output as WriteTraceJson for the XSpace serialized in `serialized`, without parsing it
// whole: memory holds one plane's metadata, one line's own fields and one event at a time, so a
// multi-gigabyte trace converts in a few megabytes. Errors name `source` and match ParseXSpace's
// (empty, truncated or corrupt, not an XSpace); an error after output has started leaves the
// output partial, so callers abort what they were writing. `release(offset)`, when given, is
// called as conversion moves on with an offset below which `serialized` will not be read again
// (a caller that mapped the file can drop those pages).
absl::StatusOr<TraceJsonStats> WriteTraceJsonFromSerialized(
    std::string_view serialized, std::string_view source, io::ByteSink* out,
    const TraceJsonOptions& options = {}, const std::function<void(size_t)>& release = nullptr);

}  // namespace clusterprof::xspace

#endif  // CLUSTERPROF_COMMON_XSPACE_TRACE_JSON_H_
