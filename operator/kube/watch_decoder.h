// Frames and decodes a watch response body: a stream of JSON objects
// ({"type":"ADDED","object":{...}}), one after another as the server writes them. The API
// server ends each with a newline, but the decoder does not rely on it: it frames by JSON
// structure (braces outside strings), as client-go's JSON framer does.
#ifndef CLUSTERPROF_OPERATOR_KUBE_WATCH_DECODER_H_
#define CLUSTERPROF_OPERATOR_KUBE_WATCH_DECODER_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "operator/kube/rest_client.h"

namespace clusterprof::kube {

// Parses one watch event. InvalidArgument, saying what is wrong, for anything else: not JSON,
// not an object, an unknown "type", a missing "object".
absl::StatusOr<WatchEvent> ParseWatchEvent(std::string_view frame);

// Not thread-safe: one reader feeds and drains it.
class WatchDecoder {
 public:
  // A frame longer than this is an error (a broken or hostile stream must not eat memory).
  static constexpr size_t kDefaultMaxFrameBytes = 64 << 20;

  explicit WatchDecoder(size_t max_frame_bytes = kDefaultMaxFrameBytes);

  // Appends bytes as they arrive.
  void Feed(std::string_view bytes);

  // The next complete event; nullopt when no complete frame is buffered yet. A frame that does
  // not parse is an InvalidArgument error (naming the frame's ordinal and its start) and is
  // consumed, so the caller may go on or give up. A frame over the size limit, or bytes between
  // frames that cannot start one, are errors that leave the decoder failed: every later call
  // returns the same error.
  absl::StatusOr<std::optional<WatchEvent>> Next();

  // Frames decoded so far (good and bad).
  int64_t frames() const { return frames_; }
  // Bytes held for a frame not yet complete.
  size_t buffered() const { return buffer_.size() - start_; }

 private:
  // Scans forward from scan_ for the end of the frame that starts at start_. Returns true when
  // found (frame end at scan_).
  bool ScanFrame();

  const size_t max_frame_bytes_;
  std::string buffer_;
  // Where the current frame starts, and how far the scan has got.
  size_t start_ = 0;
  size_t scan_ = 0;
  // Scanner state at scan_.
  int depth_ = 0;
  bool in_string_ = false;
  bool escaped_ = false;
  bool started_ = false;
  int64_t frames_ = 0;
  absl::Status failed_;
};

}  // namespace clusterprof::kube

#endif  // CLUSTERPROF_OPERATOR_KUBE_WATCH_DECODER_H_
