// A fixed-size output buffer in front of a ByteSink, for writers that format straight into
// memory (the trace converters): Reserve(n) makes room for n bytes at pos(), the writer fills
// them and moves pos() on, and the buffer goes to the sink when the next reservation would not
// fit. Header-only: it is the hot path of the converters. Not thread-safe.
#ifndef CLUSTERPROF_COMMON_IO_SINK_BUFFER_H_
#define CLUSTERPROF_COMMON_IO_SINK_BUFFER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "common/io/byte_sink.h"

namespace clusterprof::io {

class SinkBuffer {
 public:
  SinkBuffer(ByteSink* sink, size_t size) : sink_(sink), buffer_(size, '\0') {
    pos_ = buffer_.data();
    end_ = pos_ + buffer_.size();
  }
  SinkBuffer(const SinkBuffer&) = delete;
  SinkBuffer& operator=(const SinkBuffer&) = delete;

  // Makes room for `n` bytes at pos(), so the writes that follow need no checks (a reservation
  // larger than the buffer grows it). Returns false once the sink has failed (the writes then
  // land in the buffer and are discarded).
  bool Reserve(size_t n) {
    if (static_cast<size_t>(end_ - pos_) >= n) return status_.ok();
    Flush();
    if (n > buffer_.size()) {
      buffer_.assign(n, '\0');
      pos_ = buffer_.data();
      end_ = pos_ + buffer_.size();
    }
    return status_.ok();
  }

  char* pos() { return pos_; }
  void Advance(char* to) { pos_ = to; }

  // Hands what is buffered to the sink; false once the sink has failed.
  bool Flush() {
    if (!status_.ok()) return false;
    const size_t n = pos_ - buffer_.data();
    bytes_ += n;
    pos_ = buffer_.data();
    if (n > 0) status_ = sink_->Append(std::string_view(buffer_.data(), n));
    return status_.ok();
  }

  // The sink's first error.
  const absl::Status& status() const { return status_; }
  // Every byte written, flushed or not.
  uint64_t bytes() const { return bytes_ + (pos_ - buffer_.data()); }

 protected:
  char* pos_;
  char* end_;

 private:
  ByteSink* sink_;
  std::string buffer_;
  absl::Status status_;
  uint64_t bytes_ = 0;
};

}  // namespace clusterprof::io

#endif  // CLUSTERPROF_COMMON_IO_SINK_BUFFER_H_
