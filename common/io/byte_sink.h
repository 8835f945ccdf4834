// Byte streams that writers of large outputs (trace JSON, xplane.pb, uploads) push into, so
// nothing has to hold a whole file in memory.
#ifndef CLUSTERPROF_COMMON_IO_BYTE_SINK_H_
#define CLUSTERPROF_COMMON_IO_BYTE_SINK_H_

#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace clusterprof::io {

// Receives bytes in order. Implementations say whether they are thread-safe; none here is.
// After a failed Append the sink is broken: later calls return the same error.
class ByteSink {
 public:
  virtual ~ByteSink() = default;
  virtual absl::Status Append(std::string_view data) = 0;

  // Optional zero-copy path for serializers. NextWritable() returns a region owned by the sink
  // (at least one byte) that counts as appended; BackUp(n) returns the last n bytes of the most
  // recent region unused. Sinks without it return Unimplemented, and callers fall back to Append.
  virtual absl::StatusOr<std::span<char>> NextWritable() {
    return absl::UnimplementedError("this sink has no zero-copy path");
  }
  virtual void BackUp(size_t count) {}
};

// Collects everything in a string; for tests and small outputs.
class StringSink final : public ByteSink {
 public:
  absl::Status Append(std::string_view data) override {
    data_.append(data);
    return absl::OkStatus();
  }
  const std::string& data() const { return data_; }
  std::string Release() { return std::move(data_); }

 private:
  std::string data_;
};

// Counts bytes and discards them; for benchmarks and size estimates.
class CountingSink final : public ByteSink {
 public:
  absl::Status Append(std::string_view data) override {
    bytes_ += data.size();
    return absl::OkStatus();
  }
  uint64_t bytes() const { return bytes_; }

 private:
  uint64_t bytes_ = 0;
};

}  // namespace clusterprof::io

#endif  // CLUSTERPROF_COMMON_IO_BYTE_SINK_H_
