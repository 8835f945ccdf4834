// Fuzzes the path an untrusted .xplane.pb takes through `clusterprof convert --format perfetto`:
// the up-front check `--run` makes of each host file, then the Perfetto writer. Any input must
// give a Status or a trace, never a crash; a file the check accepts must convert; the writer's
// byte count must be what it wrote; and the same input must give the same bytes again.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/io/byte_sink.h"
#include "common/xspace/trace_perfetto.h"
#include "common/xspace/xspace_stream.h"
#include "google/protobuf/stubs/logging.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  [[maybe_unused]] static const bool kQuiet = [] {
    google::protobuf::SetLogHandler(nullptr);
    return true;
  }();
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const absl::Status checked = clusterprof::xspace::CheckSerializedXSpace(bytes, "fuzz-input");

  clusterprof::io::StringSink first;
  auto stats = clusterprof::xspace::WritePerfettoTraceFromSerialized(
      bytes, "fuzz-input", &first, {.pid_base = 1000, .shift_ps = 123'456, .flow_id_salt = 3});
  if (checked.ok() && !stats.ok()) __builtin_trap();
  if (!stats.ok()) return 0;
  if (stats->bytes != first.data().size()) __builtin_trap();

  clusterprof::io::StringSink second;
  auto again = clusterprof::xspace::WritePerfettoTraceFromSerialized(
      bytes, "fuzz-input", &second, {.pid_base = 1000, .shift_ps = 123'456, .flow_id_salt = 3});
  if (!again.ok() || second.data() != first.data()) __builtin_trap();
  return 0;
}
