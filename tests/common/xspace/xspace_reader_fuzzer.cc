// Fuzzes the paths an untrusted .xplane.pb takes through `clusterprof convert` and `inspect`:
// stream-convert from the wire format, parse, write Chrome trace JSON, summarize. Any input must
// give a Status or a result, never a crash, and the writers' own counts must agree with what they
// wrote.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/io/byte_sink.h"
#include "common/xspace/summary.h"
#include "common/xspace/trace_json.h"
#include "common/xspace/xspace_io.h"
#include "google/protobuf/stubs/logging.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Most mutations put invalid UTF-8 into a string field; protobuf logs each one to stderr and
  // the parse fails with a Status, which is all this target needs to see.
  [[maybe_unused]] static const bool kQuiet = [] {
    google::protobuf::SetLogHandler(nullptr);
    return true;
  }();
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);

  // The streaming converter (what `clusterprof convert` runs) reads the wire format itself.
  clusterprof::io::StringSink streamed;
  auto streamed_stats =
      clusterprof::xspace::WriteTraceJsonFromSerialized(bytes, "fuzz-input", &streamed);
  if (streamed_stats.ok() && streamed_stats->bytes != streamed.data().size()) __builtin_trap();

  auto loaded = clusterprof::xspace::ParseXSpace(bytes, "fuzz-input");
  if (!loaded.ok()) return 0;
  const tensorflow::profiler::XSpace& space = (*loaded)->space();

  // Differential: when both readers accept the input, they must write the same JSON.
  if (streamed_stats.ok()) {
    clusterprof::io::StringSink in_memory;
    if (!clusterprof::xspace::WriteTraceJson(space, &in_memory).ok()) __builtin_trap();
    if (in_memory.data() != streamed.data()) __builtin_trap();
  }

  for (const bool compact : {false, true}) {
    clusterprof::io::CountingSink sink;
    clusterprof::xspace::TraceJsonOptions options;
    options.include_metadata = !compact;
    options.newline_per_event = !compact;
    auto stats = clusterprof::xspace::WriteTraceJson(space, &sink, options);
    // A CountingSink never fails, so neither may the writer; its byte count is what it wrote.
    if (!stats.ok()) __builtin_trap();
    if (stats->bytes != sink.bytes()) __builtin_trap();
  }

  const clusterprof::xspace::SpaceSummary summary = clusterprof::xspace::Summarize(space);
  int64_t events = 0;
  for (const auto& plane : space.planes()) {
    for (const auto& line : plane.lines()) events += line.events_size();
  }
  if (summary.events != events) __builtin_trap();
  if (summary.planes.size() != static_cast<size_t>(space.planes_size())) __builtin_trap();
  if (summary.top_events.size() > 10) __builtin_trap();
  // `clusterprof inspect` prints the summary of whatever file it is given.
  const std::string text = clusterprof::xspace::FormatSummary(summary, "fuzz-input");
  if (text.empty()) __builtin_trap();
  return 0;
}
