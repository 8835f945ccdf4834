// Feeds arbitrary bytes to the watch-stream decoder in arbitrary splits. It must never crash,
// hang or grow without bound, whatever a broken or hostile server sends.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "operator/kube/watch_decoder.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // The first byte picks the split size, so the fuzzer explores frames cut across reads.
  const size_t split = 1 + data[0] % 64;
  std::string_view input(reinterpret_cast<const char*>(data + 1), size - 1);
  clusterprof::kube::WatchDecoder decoder(/*max_frame_bytes=*/1 << 16);
  while (!input.empty()) {
    const size_t n = input.size() < split ? input.size() : split;
    decoder.Feed(input.substr(0, n));
    input.remove_prefix(n);
    for (int i = 0; i < 1000; ++i) {
      absl::StatusOr<std::optional<clusterprof::kube::WatchEvent>> event = decoder.Next();
      if (event.ok() && !event->has_value()) break;
      if (!event.ok() && decoder.buffered() == 0) break;
      if (!event.ok() && event.status().message().find("expected '{'") != std::string_view::npos) {
        return 0;  // the stream is failed for good
      }
      if (!event.ok() && event.status().message().find("larger than") != std::string_view::npos) {
        return 0;
      }
    }
  }
  return 0;
}
